// AVX-512 (F/BW/VL/DQ) + F16C path of the CPU decode attention: the shared SIMD kernel of
// decode_attention_impl.h with the vector traits of decode_attention_v512.h (16 fp32 lanes, 4 query heads
// per register block), the integer-dot kernel without VNNI (VPMADDUBSW) for a q8 call, and the read
// ceiling of fd-attn-bench. Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mf16c -mfma;
// only called after isa_supported(Isa::AVX512).
#include <immintrin.h>

#define FD_ATTN_SIMD_TEMPLATE
#include "kernels/cpu/decode_attention_impl.h"
#include "kernels/cpu/decode_attention_v512.h"
#include "kernels/cpu/decode_attention_qdot.h"

namespace fd::attn {

void run_chunk_avx512(const CallCtx& c, const Chunk& ch, const float* q, float* m, float* l, float* acc,
                      float* scratch) {
  if (c.q8 && c.dtype != KVDType::F16) return simd::run_qchunk<V512, I512<false>>(c, ch, q, m, l, acc, scratch);
  simd::run_chunk<V512>(c, ch, q, m, l, acc, scratch);
}

// 64-byte loads, four independent integer accumulators (no FP-latency chain, no denormal stalls), and
// the same software prefetch into L2 the kernel uses (4 KB ahead): on the 16-core Xeon of the GPU
// machine a plain streaming loop reached only ~100 GB/s while the prefetching kernel read ~120 GB/s, so
// without it this "ceiling" was beaten and was no ceiling.
uint64_t read_reduce_avx512(const void* p, size_t bytes) {
  const auto* v = static_cast<const __m512i*>(p);
  const size_t n = bytes / 64;
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int j = 0; j < 4; ++j) _mm_prefetch(reinterpret_cast<const char*>(v + i + 64 + j), _MM_HINT_T1);
    a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(v + i));
    a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(v + i + 1));
    a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(v + i + 2));
    a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(v + i + 3));
  }
  for (; i < n; ++i) a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(v + i));
  alignas(64) uint64_t out[8];
  _mm512_store_si512(out, _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  uint64_t sum = 0;
  for (uint64_t x : out) sum += x;
  return sum;
}

}  // namespace fd::attn
