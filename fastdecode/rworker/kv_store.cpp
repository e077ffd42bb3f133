#include "fastdecode/rworker/kv_store.h"

#include <cstdlib>
#include <cstring>

#include "fastdecode/core/dtype.h"
#include "fastdecode/core/error.h"

namespace fd {

KVStore::KVStore(KVDType dtype, int n_layers, int n_kv_heads, int head_dim, size_t memory_limit_bytes)
    : dtype_(dtype),
      n_layers_(n_layers),
      n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      limit_(memory_limit_bytes),
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
}

void* KVStore::alloc_block(size_t bytes) {
  auto& pool = bytes == full_bytes_ ? free_full_ : free_tail_;
  used_ += bytes;
  if (!pool.empty()) {
    void* p = pool.back();
    pool.pop_back();
    return p;
  }
  // 64-byte alignment: whole cache lines for SIMD loads. Sizes are multiples of 64 bytes here.
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) {
    used_ -= bytes;
    FD_THROW("out of host memory allocating a KV block of " << bytes << " bytes");
  }
  return p;
}

void KVStore::release_block(const void* p, size_t bytes) {
  if (!p) return;
  used_ -= bytes;
  // Keep a bounded number of blocks for reuse; the rest go back to the system.
  auto& pool = bytes == full_bytes_ ? free_full_ : free_tail_;
  if (pool.size() < 1024) pool.push_back(const_cast<void*>(p));
  else std::free(const_cast<void*>(p));
}

size_t KVStore::sequence_bytes(int n_layers) {
  constexpr size_t kMapNode = 64;  // a std::map node: key, value header, three pointers and the colour
  return kMapNode + sizeof(Sequence) + size_t(n_layers) * sizeof(LayerCache);
}

void KVStore::add(uint64_t seq) {
  if (has(seq)) FD_THROW("sequence " << seq << " already exists");
  const size_t bytes = sequence_bytes();
  if (bytes_total() + bytes > limit_)
    FD_THROW("out of KV memory: a sequence's bookkeeping takes " << bytes << " bytes, " << (limit_ - bytes_total())
                                                                 << " of " << limit_ << " free");
  Sequence s;
  s.layers.resize(size_t(n_layers_));  // may throw bad_alloc: nothing is registered yet
  seqs_.emplace(seq, std::move(s));
  meta_ += bytes;
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
  if (bytes_total() + extra > limit_)
    FD_THROW("out of KV memory: appending " << n << " tokens needs " << extra << " more bytes, "
                                            << (limit_ - bytes_total()) << " of " << limit_ << " free");
  LayerCache& l = cache(seq, layer);
  const int64_t H = n_kv_heads_, D = head_dim_, row = H * D;
  for (int64_t t = 0; t < n; ++t) {
    if (!l.tail) l.tail = static_cast<uint16_t*>(alloc_block(tail_bytes_));
    // Token t goes to row n_tail of every head: K[h][n_tail][:], V at offset H*32*D.
    for (int64_t h = 0; h < H; ++h) {
      uint16_t* kd = l.tail + (h * kKVBlockTokens + l.n_tail) * D;
      uint16_t* vd = kd + H * kKVBlockTokens * D;
      const T* ks = k + t * row + h * D;
      const T* vs = v + t * row + h * D;
      if constexpr (sizeof(T) == 2) {
        std::memcpy(kd, ks, size_t(D) * 2);
        std::memcpy(vd, vs, size_t(D) * 2);
      } else {
        convert_from_f32(DType::F16, ks, kd, size_t(D));
        convert_from_f32(DType::F16, vs, vd, size_t(D));
      }
    }
    if (++l.n_tail == kKVBlockTokens) {
      if (dtype_ == KVDType::F16) {
        // The full fp16 tail becomes a block as it is; a new tail is allocated with the next token.
        l.full.push_back(l.tail);
        l.tail = nullptr;
      } else {
        void* b = alloc_block(full_bytes_);
        kv_quantize_block(dtype_, l.tail, b, n_kv_heads_, head_dim_);
        l.full.push_back(b);
      }
      l.n_tail = 0;
    }
  }
  total_tokens_ += n;
}

void KVStore::append_f16(uint64_t seq, int layer, const uint16_t* k, const uint16_t* v, int64_t n) {
  append(seq, layer, k, v, n);
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
