// The R-worker's KV-cache: per sequence, per layer, blocks of kKVBlockTokens tokens holding all KV
// heads (layout in kernels/cpu/decode_attention.h). Full blocks are stored in the worker's KV dtype;
// the newest partial block stays fp16 and is quantized when it fills. Memory is accounted against a
// limit (the store's own quota) and, when given, a KVMemory shared by every store of the worker (one per
// client session); an append that would exceed either changes nothing. Blocks a store keeps for reuse count
// against the shared limit too, so what the worker holds never exceeds it.
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/decode_attention.h"

namespace fd {

// The worker's memory, shared by its stores: `used` (blocks and bookkeeping in use) plus `pooled` (blocks kept for
// reuse) plus `reserved` (the sessions' own overhead) never exceed `limit`.
struct KVMemory {
  size_t limit = 0;
  size_t used = 0, pooled = 0, reserved = 0;
  size_t held() const { return used + pooled + reserved; }
};

class KVStore {
 public:
  // memory_limit_bytes: this store's quota; shared: the worker's memory (null: the quota alone bounds it).
  KVStore(KVDType dtype, int n_layers, int n_kv_heads, int head_dim, size_t memory_limit_bytes, KVMemory* shared = nullptr);
  ~KVStore();
  KVStore(const KVStore&) = delete;
  KVStore& operator=(const KVStore&) = delete;

  KVDType dtype() const { return dtype_; }
  int n_layers() const { return n_layers_; }
  int n_kv_heads() const { return n_kv_heads_; }
  int head_dim() const { return head_dim_; }

  bool has(uint64_t seq) const { return seqs_.count(seq) != 0; }
  // Registers an empty sequence; throws fd::Error if it exists, or if its bookkeeping (sequence_bytes())
  // would exceed the memory limit; on any throw nothing is registered.
  void add(uint64_t seq);
  // The bookkeeping one sequence costs before any KV (its per-layer tables and its map entry), counted
  // against the memory limit like the KV blocks, so that empty sequences cannot exhaust the host.
  size_t sequence_bytes() const { return sequence_bytes(n_layers_); }
  static size_t sequence_bytes(int n_layers);
  // Frees every block of the sequence; throws fd::Error if unknown.
  void free(uint64_t seq);
  // Keeps the first `len` tokens of the sequence at every layer (a no-op where it holds fewer). Tokens in the fp16
  // tail go at once; a full block reopens as the tail when its fp16 values are still at hand: always for fp16 KV,
  // and for int8/int4 when the block was the last to fill and no token came after it (the tail buffer still holds
  // its fp16 values: one step's append can always be undone). Otherwise throws fd::Error and changes nothing.
  void truncate(uint64_t seq, int64_t len);
  // Whether truncate(seq, len) would succeed.
  bool can_truncate(uint64_t seq, int64_t len) const;
  int64_t length(uint64_t seq, int layer) const;
  size_t num_sequences() const { return seqs_.size(); }

  // Bytes the cache of one (sequence, layer) takes at `tokens` tokens.
  size_t bytes_at(int64_t tokens) const;
  // Extra bytes appending `n` tokens to `seq` at `layer` would take.
  size_t extra_bytes(uint64_t seq, int layer, int64_t n) const;
  size_t bytes_used() const { return used_; }              // KV blocks
  size_t bookkeeping_bytes() const { return meta_; }       // sequences' tables (sequence_bytes() each)
  size_t bytes_total() const { return used_ + meta_; }     // what the memory limit bounds
  size_t memory_limit() const { return limit_; }
  // Whether `extra` more bytes fit this store's quota and the shared limit; the bytes free under both.
  bool fits(size_t extra) const;
  size_t free_bytes() const;
  int64_t total_tokens() const { return total_tokens_.load(std::memory_order_relaxed); }

  // Appends n tokens. k, v: [n, n_kv_heads, head_dim] as fp16 bits (kv_half) or fp32. The caller has
  // checked memory with extra_bytes(); append throws fd::Error if the limit would be exceeded anyway.
  // fp16 is copied bytewise: k and v need no alignment (a message's frames, as they lie).
  // Appends to different sequences may run at once on different threads (the block allocator and the accounting
  // are behind a mutex); nothing else of the store may run meanwhile.
  void append_f16(uint64_t seq, int layer, const void* k, const void* v, int64_t n);
  void append_f32(uint64_t seq, int layer, const float* k, const float* v, int64_t n);

  // The kernel's view of one (sequence, layer); valid until the next append or free of that sequence.
  SeqKVView view(uint64_t seq, int layer) const;

 private:
  struct LayerCache {
    std::vector<const void*> full;  // blocks in dtype_ layout
    uint16_t* tail = nullptr;       // fp16 block, allocated with the first token
    int32_t n_tail = 0;
    bool tail_holds_last_full = false;  // quantized: the tail buffer still has the last full block's fp16 values
  };
  struct Sequence {
    std::vector<LayerCache> layers;
  };
  template <typename T>
  void append(uint64_t seq, int layer, const T* k, const T* v, int64_t n);
  void* alloc_block(size_t bytes);
  void release_block(const void* p, size_t bytes);
  LayerCache& cache(uint64_t seq, int layer);
  const LayerCache& cache(uint64_t seq, int layer) const;

  KVDType dtype_;
  int n_layers_, n_kv_heads_, head_dim_;
  size_t limit_, used_ = 0, meta_ = 0, pooled_ = 0;
  KVMemory* shared_ = nullptr;
  void charge(size_t bytes);  // used_/meta_ grew by bytes: the shared ledger too
  void credit(size_t bytes);
  size_t full_bytes_, tail_bytes_;
  std::atomic<int64_t> total_tokens_{0};  // appends to different sequences add to it at once
  std::mutex mu_;  // alloc_block, release_block and append's memory check: appends to different sequences at once
  std::unordered_map<uint64_t, Sequence> seqs_;
  std::vector<void*> free_full_, free_tail_;  // recycled blocks (counted as free memory)
};

}  // namespace fd
