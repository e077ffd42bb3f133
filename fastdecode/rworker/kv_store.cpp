#include "fastdecode/rworker/kv_store.h"

#include <sys/mman.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "fastdecode/core/dtype.h"
#include "fastdecode/core/error.h"

namespace fd {

KVStore::KVStore(KVDType dtype, int n_layers, int n_kv_heads, int head_dim, size_t memory_limit_bytes, KVMemory* shared)
    : dtype_(dtype),
      n_layers_(n_layers),
      n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      limit_(memory_limit_bytes),
      shared_(shared),
      full_bytes_(kv_block_bytes(dtype, n_kv_heads, head_dim)),
      tail_bytes_(kv_fp16_block_bytes(n_kv_heads, head_dim)) {
  FD_CHECK(n_layers > 0 && n_kv_heads > 0 && head_dim > 0 && head_dim % 32 == 0, "bad KV store shape");
}

KVStore::~KVStore() {
  for (auto& [id, s] : seqs_)
    for (auto& l : s.layers) {
      for (const void* b : l.full) std::free(const_cast<void*>(b));
      std::free(l.tail);
    }
  for (void* p : free_full_) std::free(p);
  for (void* p : free_tail_) std::free(p);
  if (shared_) shared_->used -= used_ + meta_, shared_->pooled -= pooled_;
}

void KVStore::charge(size_t bytes) {
  if (shared_) shared_->used += bytes;
}
void KVStore::credit(size_t bytes) {
  if (shared_) shared_->used -= bytes;
}

bool KVStore::fits(size_t extra) const {
  if (bytes_total() + extra > limit_) return false;
  // Blocks this store keeps for reuse are given back before new memory is taken (alloc_block), so they count as
  // free here; other stores' pools do not.
  return !shared_ || shared_->held() - pooled_ + extra <= shared_->limit;
}

size_t KVStore::free_bytes() const {
  size_t f = limit_ > bytes_total() ? limit_ - bytes_total() : 0;
  if (shared_) {
    const size_t held = shared_->held() - pooled_;
    f = std::min(f, shared_->limit > held ? shared_->limit - held : 0);
  }
  return f;
}

namespace {

// A fresh block's pages made present in one call (MADV_POPULATE_WRITE, Linux 5.14) instead of one page fault per
// 4 KiB as the append first writes each: a prompt's APPEND_KV fills hundreds of MB of new blocks. Best effort: a
// kernel without it leaves the faults to the writes.
void populate(void* p, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
  const uintptr_t page = 4096, a = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1),
                  e = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(page - 1);
  if (e > a) (void)madvise(reinterpret_cast<void*>(a), e - a, MADV_POPULATE_WRITE);
#else
  (void)p, (void)bytes;
#endif
}

// An fp16 row of a token into a head's tail rows with streaming (non-temporal) stores where SSE2 has them: an appended
// token's rows land in lines no cache holds, and an ordinary store first reads each such line from memory (decode
// appends on the GPU machine's Xeon: the busiest R-worker's took 0.37-0.71x the time at fp16,
// artifacts/rworker/gpu-machine-stream-append-e885ccc/). Whole aligned 16-byte stores: head_dim is a multiple of 32
// (the constructor checks) and blocks are 64-byte aligned.
inline void copy_row_streaming(uint16_t* dst, const uint8_t* src, size_t bytes) {
#if defined(__SSE2__)
  auto* d = reinterpret_cast<__m128i*>(dst);
  const auto* q = reinterpret_cast<const __m128i*>(src);
  for (size_t i = 0; i < bytes / 16; ++i) _mm_stream_si128(d + i, _mm_loadu_si128(q + i));
#else
  std::memcpy(dst, src, bytes);
#endif
}

// Streaming stores are weakly ordered: fenced before the rows are read.
inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace

void* KVStore::alloc_block(size_t bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  auto& pool = bytes == full_bytes_ ? free_full_ : free_tail_;
  auto& other = bytes == full_bytes_ ? free_tail_ : free_full_;
  used_ += bytes;
  charge(bytes);
  if (!pool.empty()) {
    void* p = pool.back();
    pool.pop_back();
    pooled_ -= bytes;
    if (shared_) shared_->pooled -= bytes;
    return p;
  }
  // Room for a new block under the shared limit: this store's pooled blocks of the other size go first.
  const size_t other_bytes = bytes == full_bytes_ ? tail_bytes_ : full_bytes_;
  while (shared_ && shared_->held() > shared_->limit && !other.empty()) {
    std::free(other.back());
    other.pop_back();
    pooled_ -= other_bytes;
    shared_->pooled -= other_bytes;
  }
  // 64-byte alignment: whole cache lines for SIMD loads. Sizes are multiples of 64 bytes here.
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) {
    used_ -= bytes;
    credit(bytes);
    FD_THROW("out of host memory allocating a KV block of " << bytes << " bytes");
  }
  lock.unlock();  // the pages are this caller's alone
  populate(p, bytes);
  return p;
}

void KVStore::release_block(const void* p, size_t bytes) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  used_ -= bytes;
  credit(bytes);
  // Keep a bounded number of blocks for reuse (never more than the shared limit leaves); the rest go back to the
  // system.
  auto& pool = bytes == full_bytes_ ? free_full_ : free_tail_;
  if (pool.size() < 1024 && (!shared_ || shared_->held() + bytes <= shared_->limit)) {
    pool.push_back(const_cast<void*>(p));
    pooled_ += bytes;
    if (shared_) shared_->pooled += bytes;
  } else {
    std::free(const_cast<void*>(p));
  }
}

size_t KVStore::sequence_bytes(int n_layers) {
  constexpr size_t kMapNode = 64;  // a std::map node: key, value header, three pointers and the colour
  return kMapNode + sizeof(Sequence) + size_t(n_layers) * sizeof(LayerCache);
}

void KVStore::add(uint64_t seq) {
  if (has(seq)) FD_THROW("sequence " << seq << " already exists");
  const size_t bytes = sequence_bytes();
  if (!fits(bytes))
    FD_THROW("out of KV memory: a sequence's bookkeeping takes " << bytes << " bytes, " << free_bytes() << " free");
  Sequence s;
  s.layers.resize(size_t(n_layers_));  // may throw bad_alloc: nothing is registered yet
  seqs_.emplace(seq, std::move(s));
  meta_ += bytes;
  charge(bytes);
}

void KVStore::free(uint64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) FD_THROW("unknown sequence " << seq);
  for (auto& l : it->second.layers) {
    for (const void* b : l.full) release_block(b, full_bytes_);
    release_block(l.tail, tail_bytes_);
    total_tokens_ -= int64_t(l.full.size()) * kKVBlockTokens + l.n_tail;
  }
  seqs_.erase(it);
  meta_ -= sequence_bytes();
  credit(sequence_bytes());
}

bool KVStore::can_truncate(uint64_t seq, int64_t len) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || len < 0) return false;
  for (const LayerCache& l : it->second.layers) {
    const int64_t cur = int64_t(l.full.size()) * kKVBlockTokens + l.n_tail;
    if (cur <= len || cur - len <= l.n_tail) continue;  // nothing to drop, or only tail tokens
    // Full blocks must reopen: fp16 blocks always can; a quantized one only if it is the one the tail still holds,
    // and only one block can be.
    const int64_t reopen = (cur - len - l.n_tail + kKVBlockTokens - 1) / kKVBlockTokens;
    if (dtype_ != KVDType::F16 && !(reopen == 1 && l.tail_holds_last_full && l.n_tail == 0)) return false;
  }
  return true;
}

void KVStore::truncate(uint64_t seq, int64_t len) {
  if (!has(seq)) FD_THROW("unknown sequence " << seq);
  if (len < 0) FD_THROW("cannot truncate sequence " << seq << " to " << len << " tokens");
  if (!can_truncate(seq, len))
    FD_THROW("sequence " << seq << ": truncating to " << len << " tokens would reopen a quantized block whose fp16 values "
                         << "are gone");
  for (LayerCache& l : seqs_.at(seq).layers) {
    int64_t drop = int64_t(l.full.size()) * kKVBlockTokens + l.n_tail - len;
    while (drop > 0) {
      if (l.n_tail == 0) {  // reopen the last full block as the tail (checked above)
        const void* b = l.full.back();
        l.full.pop_back();
        if (dtype_ == KVDType::F16) {
          release_block(l.tail, tail_bytes_);  // an empty tail allocated after the block filled, if any
          l.tail = static_cast<uint16_t*>(const_cast<void*>(b));
        } else {
          release_block(b, full_bytes_);  // the tail buffer already holds its fp16 values
          l.tail_holds_last_full = false;
        }
        l.n_tail = kKVBlockTokens;
      }
      const int64_t take = std::min<int64_t>(drop, l.n_tail);
      l.n_tail -= int32_t(take);
      drop -= take;
      total_tokens_ -= take;
    }
    // An empty tail: an fp16 store allocates it with the first token again; a quantized store keeps it while any
    // token remains (bytes_at counts it from the first token on).
    const int64_t now = int64_t(l.full.size()) * kKVBlockTokens + l.n_tail;
    if (l.n_tail == 0 && (dtype_ == KVDType::F16 || now == 0)) {
      release_block(l.tail, tail_bytes_);
      l.tail = nullptr;
      l.tail_holds_last_full = false;
    }
  }
}

KVStore::LayerCache& KVStore::cache(uint64_t seq, int layer) {
  return const_cast<LayerCache&>(static_cast<const KVStore*>(this)->cache(seq, layer));
}

const KVStore::LayerCache& KVStore::cache(uint64_t seq, int layer) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) FD_THROW("unknown sequence " << seq);
  if (layer < 0 || layer >= n_layers_) FD_THROW("layer " << layer << " outside [0, " << n_layers_ << ")");
  return it->second.layers[size_t(layer)];
}

int64_t KVStore::length(uint64_t seq, int layer) const {
  const LayerCache& l = cache(seq, layer);
  return int64_t(l.full.size()) * kKVBlockTokens + l.n_tail;
}

size_t KVStore::bytes_at(int64_t tokens) const {
  // fp16: every block, full or not, is one fp16 block. Quantized: full blocks in their dtype plus one
  // fp16 tail buffer, kept from the first token on (reused when a block fills).
  if (tokens <= 0) return 0;
  if (dtype_ == KVDType::F16) return size_t((tokens + kKVBlockTokens - 1) / kKVBlockTokens) * tail_bytes_;
  return size_t(tokens / kKVBlockTokens) * full_bytes_ + tail_bytes_;
}

size_t KVStore::extra_bytes(uint64_t seq, int layer, int64_t n) const {
  const int64_t len = length(seq, layer);
  return bytes_at(len + n) - bytes_at(len);
}

template <typename T>
void KVStore::append(uint64_t seq, int layer, const T* k, const T* v, int64_t n) {
  if (n <= 0) return;
  const size_t extra = extra_bytes(seq, layer, n);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!fits(extra))
      FD_THROW("out of KV memory: appending " << n << " tokens needs " << extra << " more bytes, " << free_bytes() << " free");
  }
  LayerCache& l = cache(seq, layer);
  const int64_t H = n_kv_heads_, D = head_dim_, row = H * D;
  // Streamed: fp16 rows, and a decode token's (n = 1) of a quantized store; a prompt's rows into a quantized store's
  // tail stay in cache for the quantizer that reads each block as it fills.
  const bool stream = dtype_ == KVDType::F16 || n == 1;
  for (int64_t t = 0; t < n; ++t) {
    if (!l.tail) l.tail = static_cast<uint16_t*>(alloc_block(tail_bytes_));
    l.tail_holds_last_full = false;  // this token overwrites the last full block's fp16 values
    // Token t goes to row n_tail of every head: K[h][n_tail][:], V at offset H*32*D.
    for (int64_t h = 0; h < H; ++h) {
      uint16_t* kd = l.tail + (h * kKVBlockTokens + l.n_tail) * D;
      uint16_t* vd = kd + H * kKVBlockTokens * D;
      if constexpr (sizeof(T) == 1) {  // fp16 bits as bytes
        if (stream) {
          copy_row_streaming(kd, k + (t * row + h * D) * 2, size_t(D) * 2);
          copy_row_streaming(vd, v + (t * row + h * D) * 2, size_t(D) * 2);
        } else {
          std::memcpy(kd, k + (t * row + h * D) * 2, size_t(D) * 2);
          std::memcpy(vd, v + (t * row + h * D) * 2, size_t(D) * 2);
        }
      } else {
        convert_from_f32(DType::F16, k + t * row + h * D, kd, size_t(D));
        convert_from_f32(DType::F16, v + t * row + h * D, vd, size_t(D));
      }
    }
    if (++l.n_tail == kKVBlockTokens) {
      if (sizeof(T) == 1 && stream && dtype_ != KVDType::F16) stream_fence();  // the quantizer below reads the rows
      if (dtype_ == KVDType::F16) {
        // The full fp16 tail becomes a block as it is; a new tail is allocated with the next token.
        l.full.push_back(l.tail);
        l.tail = nullptr;
      } else {
        void* b = alloc_block(full_bytes_);
        kv_quantize_block(dtype_, l.tail, b, n_kv_heads_, head_dim_);
        l.full.push_back(b);
        l.tail_holds_last_full = true;
      }
      l.n_tail = 0;
    }
  }
  if (sizeof(T) == 1 && stream) stream_fence();
  total_tokens_ += n;
}

void KVStore::append_f16(uint64_t seq, int layer, const void* k, const void* v, int64_t n) {
  append(seq, layer, static_cast<const uint8_t*>(k), static_cast<const uint8_t*>(v), n);
}
void KVStore::append_f32(uint64_t seq, int layer, const float* k, const float* v, int64_t n) {
  append(seq, layer, k, v, n);
}

SeqKVView KVStore::view(uint64_t seq, int layer) const {
  const LayerCache& l = cache(seq, layer);
  SeqKVView v;
  v.blocks = l.full.data();
  v.n_full = int32_t(l.full.size());
  v.tail = l.n_tail > 0 ? l.tail : nullptr;
  v.n_tail = l.n_tail;
  return v;
}

}  // namespace fd
