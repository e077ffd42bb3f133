// AVX2 + F16C + FMA path of the CPU decode attention: vector traits for the shared SIMD kernel in
// decode_attention_impl.h (8 fp32 lanes, 2 query heads per register block: 16 ymm registers), and
// the read ceiling of fd-attn-bench. Compiled with -mavx2 -mf16c -mfma; only called after
// isa_supported(Isa::AVX2).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#define FD_ATTN_SIMD_TEMPLATE
#include "kernels/cpu/decode_attention_impl.h"
#include "kernels/cpu/decode_attention_qdot.h"

namespace fd::attn {
namespace {

struct V256 {
  using T = __m256;
  static constexpr int W = 8;
  static constexpr int HB = 2;  // K: 2 heads x 2 accumulators + 4 K vectors
  // V: 2 heads x 1 group (8 accumulators; each V row converted once per 2 heads) or 1 head x 2 groups
  // (8 accumulators, 64 channels) + the row vectors; weights broadcast from memory.
  static constexpr int HBV = 2;
  static constexpr int cg(int hb) { return hb >= 2 ? 1 : 2; }
  static T zero() { return _mm256_setzero_ps(); }
  static T set1(float x) { return _mm256_set1_ps(x); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T x) { _mm256_storeu_ps(p, x); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T max(T a, T b) { return _mm256_max_ps(a, b); }
  static T abs(T a) { return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }
  static T fmadd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static float hsum(T x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
  static float hmax(T x) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
  // out[k] = the max (sum) of v[k]'s lanes, k < 4: see the AVX-512 twin; here the two 128-bit lanes meet at the end.
  template <class Op>
  static __m128 reduce4(const T* v, Op op) {
    const T a = op(_mm256_unpacklo_ps(v[0], v[1]), _mm256_unpackhi_ps(v[0], v[1]));
    const T b = op(_mm256_unpacklo_ps(v[2], v[3]), _mm256_unpackhi_ps(v[2], v[3]));
    const T m = op(_mm256_shuffle_ps(a, b, 0x44), _mm256_shuffle_ps(a, b, 0xee));
    return _mm256_castps256_ps128(op(m, _mm256_permute2f128_ps(m, m, 0x01)));
  }
  static __m128 hmax4(const T* v) { return reduce4(v, [](T a, T b) { return _mm256_max_ps(a, b); }); }
  static __m128 hsum4(const T* v) { return reduce4(v, [](T a, T b) { return _mm256_add_ps(a, b); }); }
  // r: 8 rows of 8 floats -> lane i = sum of row i (unpack + add, shuffle + add, then the two 128-bit
  // halves of tokens 0-3 and 4-7 are summed across with permute2f128).
  static T reduce_rows(const float* r) {
    T u[4], w[2];
    for (int k = 0; k < 4; ++k) {
      const T a = load(r + 16 * k), b = load(r + 16 * k + 8);
      u[k] = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    }
    for (int k = 0; k < 2; ++k)
      w[k] = _mm256_add_ps(_mm256_shuffle_ps(u[2 * k], u[2 * k + 1], 0x44), _mm256_shuffle_ps(u[2 * k], u[2 * k + 1], 0xee));
    return _mm256_add_ps(_mm256_permute2f128_ps(w[0], w[1], 0x20), _mm256_permute2f128_ps(w[0], w[1], 0x31));
  }
  static T load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static T load_i8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  using TI = __m256i;  // int4 keys' words: see the AVX-512 twin (decode_attention_v512.h)
  static TI load_w(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static TI shr(TI x, int n) { return _mm256_srl_epi32(x, _mm_cvtsi32_si128(n)); }
  template <int B>
  static T sbyte(TI x) {
    if constexpr (B == 3) return _mm256_cvtepi32_ps(_mm256_srai_epi32(x, 24));
    else return _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(x, 24 - 8 * B), 24));
  }
  template <int P>
  static T nib(TI x) {
    __m256i y;
    if constexpr (P <= 19) y = _mm256_slli_epi32(x, 19 - P);
    else y = _mm256_srli_epi32(x, P - 19);
    return _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(y, _mm256_set1_epi32(0x00780000)), _mm256_set1_epi32(0x3f800000)));
  }
  static float h2f(uint16_t h) { return _cvtsh_ss(h); }
  // Cephes-style expf (see the AVX-512 twin); exactly 0 below -87.
  static T exp(T x) {
    const T under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.f), _CMP_LT_OQ);
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.f)), _mm256_set1_ps(-87.f));
    const T n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
    T y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(x, x), x), _mm256_set1_ps(1.f));
    // n in [-126, 127] after the clamp: build 2^n in the exponent field.
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
  }
};

// Integer traits for the integer-dot kernel (decode_attention_qdot.h): no VNNI at this level, so the
// AVX2 pair VPMADDUBSW (unsigned x signed bytes -> int16 pair sums) + VPMADDWD (-> int32). int8 keys are
// signed: |x| against q with x's sign (VPSIGNB), pair sums <= 2*127*127 < 2^15 (no saturation); int4
// codes (0..15) are unsigned already.
struct I256 {
  using B = __m256i;
  static constexpr int VB = 32;
  static constexpr int kBias = 0;
  static constexpr int HBPV = 2;  // p . V: 2 heads x 4 accumulators + rows and operands in 16 registers
  static B zero() { return _mm256_setzero_si256(); }
  static B load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
  static B load_part(const void* p, int) {  // only 16 bytes occur (rows are multiples of 16 bytes)
    return _mm256_inserti128_si256(_mm256_setzero_si256(), _mm_loadu_si128(static_cast<const __m128i*>(p)), 0);
  }
  static B prep_s8(B x) { return _mm256_abs_epi8(x); }
  static B dot_s8(B a, B xp, B x, B q) {
    return _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(xp, _mm256_sign_epi8(q, x)), _mm256_set1_epi16(1)));
  }
  static B dot_u8(B a, B x, B q) {
    return _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(x, q), _mm256_set1_epi16(1)));
  }
  static __m256 to_f32(B a) { return _mm256_cvtepi32_ps(a); }
  static float amax(const float* x, int n) {
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + i), abs));
    return V256::hmax(m);
  }
  // 16 query codes clamp(nearbyint(x * inv), -127, 127): the int32 -> int16 -> int8 packs work per 128-bit
  // lane, so the dwords come out as (0,4,1,5,...) and one permute puts them in order.
  static void quant16(const float* x, float inv, int8_t* out) {
    const __m256 s = _mm256_set1_ps(inv);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    const __m256i c0 = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), s)), lo), hi);
    const __m256i c1 = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), s)), lo), hi);
    const __m256i p = _mm256_packs_epi32(c0, c1);
    const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p, p), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(b));
  }
  static void quant64(const float* x, float inv, int8_t* out) {
    for (int k = 0; k < 64; k += 16) quant16(x + k, inv, out + k);
  }
  // 32 value-weight codes clamp(nearbyint(w * inv), 0, 127).
  static void wquant32(const float* w, float inv, uint8_t* out) {
    const __m256 s = _mm256_set1_ps(inv);
    const __m256i lo = _mm256_setzero_si256(), hi = _mm256_set1_epi32(127);
    __m256i c[4];
    for (int k = 0; k < 4; ++k)
      c[k] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(w + 8 * k), s)), lo), hi);
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
  // Four groups' value-weight codes (see the AVX-512 twin): per group, four vectors of 8 tokens packed to
  // dwords (t0-3, t8-11, t16-19, t24-27, t4-7, ...), put in token order by one permute.
  static void wcodes4(const __m256 (*w)[4], const float* inv, uint8_t* out) {
    for (int k = 0; k < 4; ++k) {
      __m256i c[4];
      for (int j = 0; j < 4; ++j) c[j] = _mm256_cvtps_epi32(_mm256_mul_ps(w[k][j], _mm256_set1_ps(inv[k])));
      const __m256i b = _mm256_packus_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k * 32), _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
  }
  static void store(void* p, B x) { _mm256_storeu_si256(static_cast<__m256i*>(p), x); }
  static B lo4(B x) { return _mm256_and_si256(x, _mm256_set1_epi8(15)); }
  static B hi4(B x) { return _mm256_and_si256(_mm256_srli_epi16(x, 4), _mm256_set1_epi8(15)); }
  static constexpr int kHi4 = 1;  // VPMADDUBSW: the high nibbles shifted down (see the AVX-512 twin)
  static B hi4x(B x) { return hi4(x); }
  static B unhi4(B a) { return a; }
  static B bcast32(const void* p) {
    int32_t w;
    std::memcpy(&w, p, 4);
    return _mm256_set1_epi32(w);
  }
  // See the AVX-512 twin (decode_attention_v512.h): the same unpacks per 128-bit lane.
  static void interleave4(const B* x, B* y) {
    const B a = _mm256_unpacklo_epi8(x[0], x[1]), b = _mm256_unpackhi_epi8(x[0], x[1]);
    const B c = _mm256_unpacklo_epi8(x[2], x[3]), d = _mm256_unpackhi_epi8(x[2], x[3]);
    y[0] = _mm256_unpacklo_epi16(a, c), y[1] = _mm256_unpackhi_epi16(a, c);
    y[2] = _mm256_unpacklo_epi16(b, d), y[3] = _mm256_unpackhi_epi16(b, d);
  }
  // a[k] 128-bit lane L holds lane-space channels 16L + 4k .. +3; n[j] = channels 8j .. 8j+7.
  static void unperm(const B* a, B* n) {
    n[0] = _mm256_permute2x128_si256(a[0], a[1], 0x20), n[1] = _mm256_permute2x128_si256(a[2], a[3], 0x20);
    n[2] = _mm256_permute2x128_si256(a[0], a[1], 0x31), n[3] = _mm256_permute2x128_si256(a[2], a[3], 0x31);
  }
};

}  // namespace

void run_chunk_avx2(const CallCtx& c, const Chunk& ch, const float* q, float* m, float* l, float* acc,
                    float* scratch) {
  if (c.q8 && c.dtype != KVDType::F16) return simd::run_qchunk<V256, I256>(c, ch, q, m, l, acc, scratch);
  simd::run_chunk<V256>(c, ch, q, m, l, acc, scratch);
}

// 32-byte loads, four independent integer accumulators, two loads per 64 bytes; software prefetch into
// L2 4 KB ahead, as the kernel does (see read_reduce_avx512).
uint64_t read_reduce_avx2(const void* p, size_t bytes) {
  const auto* v = static_cast<const __m256i*>(p);
  const size_t n = bytes / 32;
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int j = 0; j < 4; j += 2) _mm_prefetch(reinterpret_cast<const char*>(v + i + 128 + j), _MM_HINT_T1);
    a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(v + i));
    a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(v + i + 1));
    a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(v + i + 2));
    a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(v + i + 3));
  }
  for (; i < n; ++i) a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(v + i));
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  alignas(32) uint64_t out[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
  return out[0] + out[1] + out[2] + out[3];
}

}  // namespace fd::attn
