// AVX-512 (F/BW/VL/DQ) + F16C path of the CPU decode attention: vector traits for the shared SIMD
// kernel in decode_attention_impl.h (16 fp32 lanes, 4 query heads per register block), and the
// read ceiling of fd-attn-bench. Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mf16c -mfma;
// only called after isa_supported(Isa::AVX512).
#include <immintrin.h>

#define FD_ATTN_SIMD_TEMPLATE
#include "kernels/cpu/decode_attention_impl.h"

namespace fd::attn {
namespace {

struct V512 {
  using T = __m512;
  static constexpr int W = 16;
  static constexpr int HB = 4;  // K: 4 heads x 2 accumulators + 2 K vectors
  // V: up to 4 heads (a GQA group of 4: each V row converted once); 32-channel groups per pass for HB
  // heads: 4 heads x 2 groups or 2 heads x 4 groups = 16 accumulators + 4..8 row vectors; 1 head x 4
  // groups = 8 independent FMA chains. Weights are broadcast from memory (no register).
  static constexpr int HBV = 4;
  static constexpr int cg(int hb) { return hb >= 4 ? 2 : 4; }
  static T zero() { return _mm512_setzero_ps(); }
  static T set1(float x) { return _mm512_set1_ps(x); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T x) { _mm512_storeu_ps(p, x); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T max(T a, T b) { return _mm512_max_ps(a, b); }
  static T fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static float hsum(T x) { return _mm512_reduce_add_ps(x); }
  static float hmax(T x) { return _mm512_reduce_max_ps(x); }
  // r: 16 rows of 16 floats -> lane i = sum of row i. Pairs of rows: unpack lo/hi + add (per 128-bit
  // lane: 2 partials of each row); pairs of those: shuffle + add (1 partial per row and 128-bit lane);
  // then the four 128-bit lanes are summed across with shuffle_f32x4.
  static T reduce_rows(const float* r) {
    T u[8], w[4];
    for (int k = 0; k < 8; ++k) {
      const T a = load(r + 32 * k), b = load(r + 32 * k + 16);
      u[k] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    }
    for (int k = 0; k < 4; ++k)
      w[k] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * k], u[2 * k + 1], 0x44), _mm512_shuffle_ps(u[2 * k], u[2 * k + 1], 0xee));
    const T z01 = _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88), _mm512_shuffle_f32x4(w[0], w[1], 0xdd));
    const T z23 = _mm512_add_ps(_mm512_shuffle_f32x4(w[2], w[3], 0x88), _mm512_shuffle_f32x4(w[2], w[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(z01, z23, 0x88), _mm512_shuffle_f32x4(z01, z23, 0xdd));
  }
  static T load_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static T load_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  // 16 packed bytes -> f = 1 + code/16 for the low and the high nibbles, built in the mantissa of 1.0
  // ((bits & mask) | 1.0f in one vpternlogd): no int->float conversion on the FMA ports.
  static void load_u4(const uint8_t* p, T& lo, T& hi) {
    const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m512i mask = _mm512_set1_epi32(0x00780000), one = _mm512_set1_epi32(0x3f800000);
    lo = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_slli_epi32(x, 19), mask, one, 0xea));  // (a&b)|c
    hi = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_slli_epi32(x, 15), mask, one, 0xea));
  }
  static float h2f(uint16_t h) { return _cvtsh_ss(h); }
  // Cephes-style expf: 2^n * poly(r), |rel err| ~ 2e-7; exactly 0 below -87 (so exp(-inf) = 0).
  static T exp(T x) {
    const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.f), _CMP_LT_OQ);
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.f)), _mm512_set1_ps(-87.f));
    const T n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
    T y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(x, x), x), _mm512_set1_ps(1.f));
    return _mm512_maskz_mov_ps(_mm512_knot(under), _mm512_scalef_ps(y, n));
  }
};

}  // namespace

void run_chunk_avx512(const CallCtx& c, const Chunk& ch, const float* q, float* m, float* l, float* acc,
                      float* scratch) {
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
