// AVX-512 (F, BW, VL, F16C) twin of kv_quantize_block's int8 and int4 paths (kv_quant.cpp): the same codes,
// scales and mins bit for bit, in vectors. Every element goes through the same IEEE operations as the scalar
// code — fp16 -> fp32 widening, max |x| (int8) or min / max (int4), one division by the stored scale,
// round-to-nearest-even, clamp, the fp16 rounding of the int4 parameters (VCVTPS2PH, round to nearest even,
// as fp32_to_fp16) — so the quantized cache does not depend on the machine that filled it
// (test_kv_quant's ScalarTwin grid checks it byte for byte). Compiled with -ffp-contract=off: a fused
// multiply-add in `s * 15 + z < hi` would change the int4 scale's rounding test.
//
// Prefill fills every block of a prompt at once (APPEND_KV); with the scalar code the int8 and int4 stores'
// prefill took 3.4x fp16's time to first token on the GPU machine (issue 18). Only called after
// isa_supported(Isa::AVX512).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/decode_attention_impl.h"

namespace fd::kvq {

using attn::kBT;

namespace {

inline __m512 ld_h(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline __m256i to_h(__m512 x) { return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline __m512 rne(__m512 x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

// One int8 row (D values): scale = max|x| / 127, code = clamp(rne(x / scale), -127, 127); all zero if scale is 0.
void i8_row(const uint16_t* x, int D, int8_t* code, float* scale) {
  __m512 am = _mm512_setzero_ps();
  for (int d = 0; d < D; d += 16) am = _mm512_max_ps(am, _mm512_abs_ps(ld_h(x + d)));
  const float s = _mm512_reduce_max_ps(am) / 127.f;
  *scale = s;
  if (!(s > 0)) {
    std::memset(code, 0, size_t(D));
    return;
  }
  const __m512 vs = _mm512_set1_ps(s), lo = _mm512_set1_ps(-127.f), hi = _mm512_set1_ps(127.f);
  for (int d = 0; d < D; d += 16) {
    const __m512 c = _mm512_min_ps(_mm512_max_ps(rne(_mm512_div_ps(ld_h(x + d), vs)), lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(code + d), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(c)));
  }
}

// u4_params for 16 lanes: z = fp16(lo) (exact: lo is an fp16 value), s = fp16((hi - z) / 15), raised by one
// fp16 step (at most 4 times) while s * 15 + z < hi.
inline void u4_params16(__m512 lo, __m512 hi, __m256i* s_h, __m256i* z_h) {
  const __m256i z = to_h(lo);
  const __m512 zf = _mm512_cvtph_ps(z);
  __m256i s = to_h(_mm512_div_ps(_mm512_sub_ps(hi, zf), _mm512_set1_ps(15.f)));
  for (int i = 0; i < 4; ++i) {
    const __m512 t = _mm512_add_ps(_mm512_mul_ps(_mm512_cvtph_ps(s), _mm512_set1_ps(15.f)), zf);
    const __mmask16 m = _mm512_cmp_ps_mask(t, hi, _CMP_LT_OQ);
    s = _mm256_mask_add_epi16(s, m, s, _mm256_set1_epi16(1));
  }
  *s_h = s;
  *z_h = z;
}

// Codes clamp(rne((x - z) / s), 0, 15) of 16 values as int32 lanes; 0 where s is not > 0.
inline __m512i u4_codes(__m512 x, __m512 s, __m512 z) {
  const __mmask16 ok = _mm512_cmp_ps_mask(s, _mm512_setzero_ps(), _CMP_GT_OQ);
  __m512 c = rne(_mm512_div_ps(_mm512_sub_ps(x, z), s));
  c = _mm512_min_ps(_mm512_max_ps(c, _mm512_setzero_ps()), _mm512_set1_ps(15.f));
  return _mm512_maskz_cvtps_epi32(ok, c);
}

// Token-interleaved key words from token-major ones: out[w][t] = in[t][w] (in: kBT rows of `stride` 32-bit words,
// nw of them used), as 16 x 16 transposes of 32-bit words: pairs of rows interleaved (32-bit, then 64-bit unpacks),
// leaving in each 128-bit lane L of u[4k + j] word 4L + j of rows 4k..4k+3, then a 4 x 4 transpose of 128-bit lanes
// across u[j], u[4 + j], u[8 + j], u[12 + j] gives word 4L + j of all 16 rows. (A gather per 16 words measured
// about as long on the dev Xeon, and gathers are microcoded slow where the GDS mitigation is on; this is 64
// shuffles per 256 words. Streaming stores for the words measured no faster.)
inline void transpose_words(const int32_t* in, int stride, int nw, void* out) {
  auto* o = static_cast<int32_t*>(out);
  for (int w0 = 0; w0 < nw; w0 += 16) {
    const int n = std::min(16, nw - w0);
    const __mmask16 m = __mmask16((1u << n) - 1);
    for (int t0 = 0; t0 < kBT; t0 += 16) {
      __m512i r[16], t[16], u[16];
      for (int k = 0; k < 16; ++k) r[k] = _mm512_maskz_loadu_epi32(m, in + (t0 + k) * stride + w0);
      for (int k = 0; k < 16; k += 2) {
        t[k] = _mm512_unpacklo_epi32(r[k], r[k + 1]);
        t[k + 1] = _mm512_unpackhi_epi32(r[k], r[k + 1]);
      }
      for (int k = 0; k < 16; k += 4) {
        u[k] = _mm512_unpacklo_epi64(t[k], t[k + 2]);
        u[k + 1] = _mm512_unpackhi_epi64(t[k], t[k + 2]);
        u[k + 2] = _mm512_unpacklo_epi64(t[k + 1], t[k + 3]);
        u[k + 3] = _mm512_unpackhi_epi64(t[k + 1], t[k + 3]);
      }
      for (int j = 0; j < 4; ++j) {
        const __m512i a01l = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x44), a23l = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x44);
        const __m512i a01h = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xee), a23h = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xee);
        const __m512i c[4] = {_mm512_shuffle_i32x4(a01l, a23l, 0x88), _mm512_shuffle_i32x4(a01l, a23l, 0xdd),
                              _mm512_shuffle_i32x4(a01h, a23h, 0x88), _mm512_shuffle_i32x4(a01h, a23h, 0xdd)};
        for (int L = 0; L < 4; ++L)
          if (4 * L + j < n) _mm512_storeu_si512(o + (w0 + 4 * L + j) * kBT + t0, c[L]);
      }
    }
  }
}

// The keys' token-interleaved words (attn::pack_u4_keys, whose bytes these are): per token, each 8 codes
// (one qword) become the word lo | hi << 4 of its low and high 4 codes (codes < 16, so q >> 28 brings the
// high dword's codes to bits 4.. without touching the low dword's, whose top 4 bits are 0); a word per 4 bytes
// of wt[t][D/8], then transposed to [D/8][kBT].
inline void pack_keys(const uint8_t* codes, int D, uint8_t* k) {
  alignas(64) int32_t wt[kBT][32];
  for (int t = 0; t < kBT; ++t)
    for (int d = 0; d < D; d += 64) {
      const __mmask8 m = __mmask8((1u << std::min(8, (D - d) / 8)) - 1);
      const __m512i q = _mm512_maskz_loadu_epi64(m, codes + size_t(t) * 256 + d);
      _mm256_mask_storeu_epi32(&wt[t][d / 8], m, _mm512_cvtepi64_epi32(_mm512_or_si512(q, _mm512_srli_epi64(q, 28))));
    }
  transpose_words(&wt[0][0], 32, D / 8, k);
}

}  // namespace

void quantize_block_avx512(KVDType dtype, const uint16_t* src, void* out, int H, int D) {
  if (dtype == KVDType::I8) {
    alignas(64) int32_t kw[kBT][64];  // the key codes of a token as words of 4 channels, before the scatter
    for (int h = 0; h < H; ++h) {
      const attn::I8Head hd = attn::i8_head(out, H, D, h);
      const attn::F16Head in = attn::f16_head(src, H, D, h);
      for (int t = 0; t < kBT; ++t) {
        i8_row(in.k + size_t(t) * D, D, reinterpret_cast<int8_t*>(kw[t]), const_cast<float*>(hd.ks) + t);
        i8_row(in.v + size_t(t) * D, D, const_cast<int8_t*>(hd.v) + size_t(t) * D, const_cast<float*>(hd.vs) + t);
      }
      transpose_words(&kw[0][0], 64, D / 4, const_cast<int8_t*>(hd.k));  // attn::pack_i8_keys' layout
    }
    return;
  }
  // int4 (the caller passes I8 or I4 only).
  alignas(64) float ks[256], kz[256];        // the stored key parameters, widened
  alignas(64) float vlo[8][kBT], vhi[8][kBT];  // per value group and token: min, max
  alignas(64) uint8_t kcodes[kBT][256];         // the key codes, a byte each, before packing
  for (int h = 0; h < H; ++h) {
    const attn::I4Head hd = attn::i4_head(out, H, D, h);
    const attn::F16Head in = attn::f16_head(src, H, D, h);
    auto* kp = const_cast<uint16_t*>(hd.kp);
    auto* vp = const_cast<uint16_t*>(hd.vp);
    auto* kc = const_cast<uint8_t*>(hd.k);
    auto* vc = const_cast<uint8_t*>(hd.v);
    // Keys: per channel over the 32 tokens (16 channels a vector).
    for (int d = 0; d < D; d += 16) {
      __m512 lo = _mm512_set1_ps(INFINITY), hi = _mm512_set1_ps(-INFINITY);
      for (int t = 0; t < kBT; ++t) {
        const __m512 x = ld_h(in.k + size_t(t) * D + d);
        lo = _mm512_min_ps(lo, x);
        hi = _mm512_max_ps(hi, x);
      }
      __m256i s, z;
      u4_params16(lo, hi, &s, &z);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(kp + d), s);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(kp + D + d), z);
      _mm512_store_ps(ks + d, _mm512_cvtph_ps(s));
      _mm512_store_ps(kz + d, _mm512_cvtph_ps(z));
    }
    for (int t = 0; t < kBT; ++t) {
      const uint16_t* x = in.k + size_t(t) * D;
      for (int d = 0; d < D; d += 16)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(&kcodes[t][d]),
                         _mm512_cvtepi32_epi8(u4_codes(ld_h(x + d), _mm512_load_ps(ks + d), _mm512_load_ps(kz + d))));
    }
    pack_keys(&kcodes[0][0], D, kc);
    // Values: per token, groups of 32 channels; the parameters 16 tokens a vector (token-contiguous).
    for (int t = 0; t < kBT; ++t) {
      const uint16_t* x = in.v + size_t(t) * D;
      for (int g = 0; g < D / 32; ++g) {
        const __m512 a = ld_h(x + 32 * g), b = ld_h(x + 32 * g + 16);
        vlo[g][t] = _mm512_reduce_min_ps(_mm512_min_ps(a, b));
        vhi[g][t] = _mm512_reduce_max_ps(_mm512_max_ps(a, b));
      }
    }
    for (int g = 0; g < D / 32; ++g)
      for (int t = 0; t < kBT; t += 16) {
        __m256i s, z;
        u4_params16(_mm512_loadu_ps(&vlo[g][t]), _mm512_loadu_ps(&vhi[g][t]), &s, &z);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(vp + (2 * g) * kBT + t), s);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(vp + (2 * g + 1) * kBT + t), z);
      }
    // Codes in quad-group words (attn::pack_u4_values): lane j of (quad q, group g) holds byte j of the group's
    // 16 for tokens 4q..4q+3, one byte each, made from the int32 code lanes with shifts.
    for (int q = 0; q < kBT / 4; ++q)
      for (int g = 0; g < D / 32; ++g) {
        __m512i word = _mm512_setzero_si512();
        for (int r = 0; r < 4; ++r) {
          const int t = 4 * q + r;
          const uint16_t* x = in.v + size_t(t) * D + 32 * g;
          const uint16_t* sp = vp + (2 * g) * kBT + t;  // this token's stored scale; its min is kBT further
          const __m512 s = _mm512_set1_ps(_cvtsh_ss(sp[0])), z = _mm512_set1_ps(_cvtsh_ss(sp[kBT]));
          const __m512i b = _mm512_or_si512(u4_codes(ld_h(x), s, z), _mm512_slli_epi32(u4_codes(ld_h(x + 16), s, z), 4));
          word = _mm512_or_si512(word, _mm512_slli_epi32(b, 8 * r));
        }
        _mm512_storeu_si512(vc + (size_t(q) * (D / 32) + g) * 64, word);
      }
  }
}

}  // namespace fd::kvq
