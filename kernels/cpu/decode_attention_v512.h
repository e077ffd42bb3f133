// AVX-512 vector traits of the CPU decode attention, shared by decode_attention_avx512.cpp and
// decode_attention_avx512vnni.cpp (each includes it after decode_attention_impl.h with
// FD_ATTN_SIMD_TEMPLATE; everything here is in an anonymous namespace, so each translation unit has its
// own copy compiled with its own flags):
//   V512        16 fp32 lanes for the shared float kernel (decode_attention_impl.h)
//   I512<VNNI>  64 int8 lanes for the integer-dot kernel (decode_attention_qdot.h): VNNI = true uses
//               VPDPBUSD (AVX512-VNNI; only decode_attention_avx512vnni.cpp instantiates it), false the
//               AVX512BW pair VPMADDUBSW + VPMADDWD.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

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
  static T abs(T a) { return _mm512_abs_ps(a); }
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
  // out[k] = the max (sum) of v[k]'s lanes, k < 4, for four vectors at once: pairs interleaved (unpack), then
  // pairs of pairs (shuffle), leaving one partial per vector in each 128-bit lane, then across the lanes.
  template <class Op>
  static __m128 reduce4(const T* v, Op op) {
    const T a = op(_mm512_unpacklo_ps(v[0], v[1]), _mm512_unpackhi_ps(v[0], v[1]));
    const T b = op(_mm512_unpacklo_ps(v[2], v[3]), _mm512_unpackhi_ps(v[2], v[3]));
    T m = op(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xee));
    m = op(m, _mm512_shuffle_f32x4(m, m, 0x4e));
    m = op(m, _mm512_shuffle_f32x4(m, m, 0xb1));
    return _mm512_castps512_ps128(m);
  }
  static __m128 hmax4(const T* v) { return reduce4(v, [](T a, T b) { return _mm512_max_ps(a, b); }); }
  static __m128 hsum4(const T* v) { return reduce4(v, [](T a, T b) { return _mm512_add_ps(a, b); }); }
  static T load_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static T load_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  // int4 keys' words (u4_key): W words of 4 bytes, one token a lane; nib<P> = 1 + (bits P..P+3)/16 of each lane,
  // built in the mantissa of 1.0 ((bits & mask) | 1.0f in one vpternlogd): no int->float conversion on the FMA ports.
  using TI = __m512i;
  static TI load_w(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static TI shr(TI x, int n) { return _mm512_srl_epi32(x, _mm_cvtsi32_si128(n)); }
  template <int B>
  static T sbyte(TI x) {
    if constexpr (B == 3) return _mm512_cvtepi32_ps(_mm512_srai_epi32(x, 24));
    else return _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(x, 24 - 8 * B), 24));
  }
  template <int P>
  static T nib(TI x) {
    __m512i y;
    if constexpr (P <= 19) y = _mm512_slli_epi32(x, 19 - P);
    else y = _mm512_srli_epi32(x, P - 19);
    return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(y, _mm512_set1_epi32(0x00780000), _mm512_set1_epi32(0x3f800000), 0xea));
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

// Integer traits (see decode_attention_qdot.h for the interface and the operand-sign handling).
template <bool VNNI>
struct I512 {
  using B = __m512i;
  static constexpr int VB = 64;
  static constexpr int kBias = VNNI ? 128 : 0;
  static constexpr int HBPV = 4;  // p . V: 4 heads x 4 accumulators + 4 rows + 4 operands + temps
  static B zero() { return _mm512_setzero_si512(); }
  static B load(const void* p) { return _mm512_loadu_si512(p); }
  static B load_part(const void* p, int n) { return _mm512_maskz_loadu_epi8(__mmask64((uint64_t(1) << n) - 1), p); }
  // int8 keys x against the signed query q. VNNI: VPDPBUSD multiplies unsigned by signed bytes, so the
  // keys become x + 128 (flip the sign bit) and the caller subtracts 128 * sum(q) (kBias) per head.
  // Without VNNI: VPMADDUBSW on |x| and q with x's sign (pair sums <= 2*127*127, no saturation).
  static B prep_s8(B x) {
    if constexpr (VNNI) return _mm512_xor_si512(x, _mm512_set1_epi8(char(0x80)));
    else return _mm512_abs_epi8(x);
  }
  static B dot_s8(B a, B xp, B x, B q) {
    if constexpr (VNNI) {
      (void)x;
      return _mm512_dpbusd_epi32(a, xp, q);
    } else {
      const B qs = _mm512_mask_sub_epi8(q, _mm512_movepi8_mask(x), _mm512_setzero_si512(), q);
      return _mm512_add_epi32(a, _mm512_madd_epi16(_mm512_maddubs_epi16(xp, qs), _mm512_set1_epi16(1)));
    }
  }
  // Unsigned int4 codes (0..15) against the signed query: no offset needed.
  static B dot_u8(B a, B x, B q) {
    if constexpr (VNNI) return _mm512_dpbusd_epi32(a, x, q);
    else return _mm512_add_epi32(a, _mm512_madd_epi16(_mm512_maddubs_epi16(x, q), _mm512_set1_epi16(1)));
  }
  static __m512 to_f32(B a) { return _mm512_cvtepi32_ps(a); }
  static float amax(const float* x, int n) {
    __m512 m = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    return _mm512_reduce_max_ps(m);
  }
  // 16 query codes clamp(nearbyint(x * inv), -127, 127) (round to nearest even: the MXCSR default).
  static void quant16(const float* x, float inv, int8_t* out) {
    const __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), _mm512_set1_ps(inv)));
    const __m512i cl = _mm512_min_epi32(_mm512_max_epi32(c, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(cl));
  }
  // 64 query codes: quant16's, the clamp left to the saturating packs (x is within +-amax and inv = 127 / amax, so
  // the products round into [-127, 127] and the clamp never acts). The packs work per 128-bit lane (dwords of
  // 4 codes come out as (0-3, 16-19, 32-35, 48-51, 4-7, ...)): one permute puts them in order.
  static void quant64(const float* x, float inv, int8_t* out) {
    const __m512 s = _mm512_set1_ps(inv);
    __m512i c[4];
    for (int k = 0; k < 4; ++k) c[k] = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * k), s));
    const __m512i p = _mm512_packs_epi16(_mm512_packs_epi32(c[0], c[1]), _mm512_packs_epi32(c[2], c[3]));
    _mm512_storeu_si512(out, _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), p));
  }
  // 32 value-weight codes clamp(nearbyint(w * inv), 0, 127).
  static void wquant32(const float* w, float inv, uint8_t* out) {
    for (int i = 0; i < 32; i += 16) {
      const __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(w + i), _mm512_set1_ps(inv)));
      const __m512i cl = _mm512_min_epi32(_mm512_max_epi32(c, _mm512_setzero_si512()), _mm512_set1_epi32(127));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm512_cvtepi32_epi8(cl));
    }
  }
  // The value-weight codes nearbyint(w * inv[k]) of four groups k (w[k]: kBT weights in two vectors), 4 * kBT
  // bytes. No clamp: w is in [0, amax] and inv = 127 / amax, so the product is at most 127 (1 + 2^-23)^2 and
  // rounds into [0, 127] as wquant32's clamped code does; a NaN (inv infinite where amax is 0) converts to
  // INT_MIN and the saturating packs make it 0 (the caller zeroes such a group anyway). The packs work per
  // 128-bit lane: 4-token dwords come out as (g t0-3, g t16-19, g+1 t0-3, g+1 t16-19) per lane, and one
  // permute puts each group's 32 bytes in token order.
  static void wcodes4(const __m512 (*w)[2], const float* inv, uint8_t* out) {
    __m512i c[4][2];
    for (int k = 0; k < 4; ++k)
      for (int j = 0; j < 2; ++j) c[k][j] = _mm512_cvtps_epi32(_mm512_mul_ps(w[k][j], _mm512_set1_ps(inv[k])));
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for (int k = 0; k < 4; k += 2) {
      const __m512i p = _mm512_packus_epi16(_mm512_packs_epi32(c[k][0], c[k][1]), _mm512_packs_epi32(c[k + 1][0], c[k + 1][1]));
      _mm512_storeu_si512(out + k * 32, _mm512_permutexvar_epi32(idx, p));
    }
  }
  static void store(void* p, B x) { _mm512_storeu_si512(p, x); }
  static B lo4(B x) { return _mm512_and_si512(x, _mm512_set1_epi8(15)); }
  static B hi4(B x) { return _mm512_and_si512(_mm512_srli_epi16(x, 4), _mm512_set1_epi8(15)); }
  // The high nibbles times kHi4 as VPDPBUSD's unsigned operand: VNNI takes them in place (x & 0xf0: products
  // up to 240 * 127 fit its 16-bit intermediates); VPMADDUBSW's pair sums would saturate, so without VNNI they
  // are shifted down. unhi4 divides such a sum (a multiple of kHi4) back, exactly.
  static constexpr int kHi4 = VNNI ? 16 : 1;
  static B hi4x(B x) {
    if constexpr (VNNI) return _mm512_and_si512(x, _mm512_set1_epi8(char(0xf0)));
    else return hi4(x);
  }
  static B unhi4(B a) { return VNNI ? _mm512_srai_epi32(a, 4) : a; }  // arithmetic: q . K sums may be negative
  static B bcast32(const void* p) {
    int32_t w;
    std::memcpy(&w, p, 4);
    return _mm512_set1_epi32(w);
  }
  // y[k]: 32-bit lane i of 128-bit lane L = byte 4k + i of lane L of x[0..3], side by side.
  static void interleave4(const B* x, B* y) {
    const B a = _mm512_unpacklo_epi8(x[0], x[1]), b = _mm512_unpackhi_epi8(x[0], x[1]);
    const B c = _mm512_unpacklo_epi8(x[2], x[3]), d = _mm512_unpackhi_epi8(x[2], x[3]);
    y[0] = _mm512_unpacklo_epi16(a, c), y[1] = _mm512_unpackhi_epi16(a, c);
    y[2] = _mm512_unpacklo_epi16(b, d), y[3] = _mm512_unpackhi_epi16(b, d);
  }
  // n[j] = 128-bit lane j of a[0], a[1], a[2], a[3] (a 4x4 transpose of 128-bit lanes).
  static void unperm(const B* a, B* n) {
    const B t0 = _mm512_shuffle_i32x4(a[0], a[1], 0x44), t1 = _mm512_shuffle_i32x4(a[2], a[3], 0x44);
    const B t2 = _mm512_shuffle_i32x4(a[0], a[1], 0xee), t3 = _mm512_shuffle_i32x4(a[2], a[3], 0xee);
    n[0] = _mm512_shuffle_i32x4(t0, t1, 0x88), n[1] = _mm512_shuffle_i32x4(t0, t1, 0xdd);
    n[2] = _mm512_shuffle_i32x4(t2, t3, 0x88), n[3] = _mm512_shuffle_i32x4(t2, t3, 0xdd);
  }
};

}  // namespace
}  // namespace fd::attn
