// The R-worker's KV-cache: per sequence, per layer, blocks of kKVBlockTokens tokens holding all KV
// heads (layout in kernels/cpu/decode_attention.h). Full blocks are stored in the worker's KV dtype;
// the newest partial block stays fp16 and is quantized when it fills. Memory is accounted against a
// limit; an append that would exceed it changes nothing.
#pragma once
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/decode_attention.h"

namespace fd {

class KVStore {
 public:
  KVStore(KVDType dtype, int n_layers, int n_kv_heads, int head_dim, size_t memory_limit_bytes);
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
  int64_t total_tokens() const { return total_tokens_; }

  // Appends n tokens. k, v: [n, n_kv_heads, head_dim] as fp16 bits (kv_half) or fp32. The caller has
  // checked memory with extra_bytes(); append throws fd::Error if the limit would be exceeded anyway.
  void append_f16(uint64_t seq, int layer, const uint16_t* k, const uint16_t* v, int64_t n);
  void append_f32(uint64_t seq, int layer, const float* k, const float* v, int64_t n);

  // The kernel's view of one (sequence, layer); valid until the next append or free of that sequence.
  SeqKVView view(uint64_t seq, int layer) const;

 private:
  struct LayerCache {
    std::vector<const void*> full;  // blocks in dtype_ layout
    uint16_t* tail = nullptr;       // fp16 block, allocated with the first token
    int32_t n_tail = 0;
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
  size_t limit_, used_ = 0, meta_ = 0;
  size_t full_bytes_, tail_bytes_;
  int64_t total_tokens_ = 0;
  std::unordered_map<uint64_t, Sequence> seqs_;
  std::vector<void*> free_full_, free_tail_;  // recycled blocks (counted as free memory)
};

}  // namespace fd
