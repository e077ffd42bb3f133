// An independent quantizer for the KV block formats, for tests: written from the formats documented in
// kernels/cpu/kv_quant.cpp's header comment (and the int4 scale rule at its u4_params), never calling
// kv_quantize_block, kv_dequantize_block* or kv_block_bytes, so a fault in the store's quantizer is not
// copied into the expectation. tests/unit/test_kv_store.cpp checks every code and scale of the store's
// blocks against it; tests/integration/test_fastdecode_engine.cpp builds the reference model's quantized
// KV with it.
//
// The formats (H = n_kv_heads, D = head_dim, T = 32 tokens a block; head-major: [H][one head's run]):
//   int8: symmetric per token and head: scale = max|row| / 127 as an fp32 (correctly rounded),
//         code = round-half-even(x / scale) in [-127, 127], value = scale * code.
//         A head's run: K codes int8 [D/4][T][4], V codes [T][D], K scales fp32 [T], V scales [T].
//   int4: asymmetric (value = scale * code + min, code = round-half-even((x - min) / scale) in [0, 15]) with
//         fp16 scale and min: keys per channel over the block's 32 tokens, values per token and group of 32
//         channels; min = the smallest value (the inputs are fp16 values, so it is exact), scale = the
//         smallest fp16 with 15 * scale + min >= max (the fp16 rounding of (max - min) / 15, upwards).
//         A head's run: K codes [D/8][T][4], V codes [T/4][D/32][16][4] (4 bits each), K params fp16 [2][D],
//         V params fp16 [D/32][2][T].
// A zero scale (all values of a row or group equal; int8: all zero) gives code 0.
// Quotients are computed in double: exact at an exact tie (fp16 operands, an fp16 or fp32 scale), where
// the code is the even neighbour.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "fastdecode/core/dtype.h"
#include "kernels/cpu/decode_attention.h"

namespace fd::test::kvref {

constexpr int kT = 32;  // tokens a block (the documented format; kKVBlockTokens must agree)
static_assert(kT == kKVBlockTokens, "the documented block is 32 tokens");

// Bytes of one full block of H heads, from the layouts above.
inline size_t block_bytes(KVDType t, int H, int D) {
  const size_t h = size_t(H), d = size_t(D), T = kT;
  switch (t) {
    case KVDType::F16: return 2 * h * T * d * 2;                                 // K and V fp16 [H][T][D]
    case KVDType::I8: return h * (2 * T * d + 2 * T * 4);                        // codes; fp32 scales per token
    case KVDType::I4: return h * (2 * T * d / 2 + 2 * d * 2 + (d / 32) * 2 * T * 2);  // nibbles; K, V params
  }
  return 0;
}

// Round-half-even (the default rounding mode) and clamp to [lo, hi].
inline int round_code(double q, int lo, int hi) { return int(std::clamp(std::nearbyint(q), double(lo), double(hi))); }

// ---- int8 ----
inline float i8_scale(double amax) { return float(amax) / 127.0f; }  // amax is an fp16 value: float(amax) exact
// x in units of the scale (the code before rounding).
inline double i8_units(double x, float scale) { return scale > 0 ? x / double(scale) : 0.0; }
inline int i8_code(double x, float scale) { return round_code(i8_units(x, scale), -127, 127); }
inline float i8_value(float scale, int code) { return float(double(scale) * code); }  // exact product, one rounding

// ---- int4 ----
// The smallest fp16 value >= x (x >= 0).
inline uint16_t fp16_round_up(double x) {
  uint16_t c = fp32_to_fp16(float(x));
  while (double(fp16_to_fp32(c)) < x) ++c;
  while (c > 0 && double(fp16_to_fp32(uint16_t(c - 1))) >= x) --c;
  return c;
}

struct U4Params {
  uint16_t scale = 0, min = 0;  // fp16 bits
  double s() const { return fp16_to_fp32(scale); }
  double z() const { return fp16_to_fp32(min); }
};
// For values in [lo, hi] (fp16 values).
inline U4Params u4_params(double lo, double hi) {
  U4Params p;
  p.min = fp32_to_fp16(float(lo));
  p.scale = fp16_round_up((hi - p.z()) / 15);
  return p;
}
inline double u4_units(double x, const U4Params& p) { return p.s() > 0 ? (x - p.z()) / p.s() : 0.0; }
inline int u4_code(double x, const U4Params& p) { return round_code(u4_units(x, p), 0, 15); }
inline float u4_value(const U4Params& p, int code) { return float(p.s() * code + p.z()); }

// One head's K and V of a block (32 tokens): element (token t, channel d) at k[t * stride + d], v likewise,
// fp16 values (anything else is rounded to fp16 first, as the store receives fp16), replaced by the values
// its codes stand for. F16: the fp16 rounding only.
inline void roundtrip_head(KVDType t, float* k, float* v, int64_t stride, int D) {
  const auto at = [&](float* x, int tok, int d) -> float& { return x[tok * stride + d]; };
  for (float* x : {k, v})
    for (int tok = 0; tok < kT; ++tok)
      for (int d = 0; d < D; ++d) at(x, tok, d) = fp16_to_fp32(fp32_to_fp16(at(x, tok, d)));
  if (t == KVDType::I8) {
    for (float* x : {k, v})  // keys and values alike: per token
      for (int tok = 0; tok < kT; ++tok) {
        double amax = 0;
        for (int d = 0; d < D; ++d) amax = std::max(amax, std::fabs(double(at(x, tok, d))));
        const float s = i8_scale(amax);
        for (int d = 0; d < D; ++d) at(x, tok, d) = i8_value(s, i8_code(at(x, tok, d), s));
      }
  } else if (t == KVDType::I4) {
    for (int d = 0; d < D; ++d) {  // keys: per channel over the 32 tokens
      double lo = INFINITY, hi = -INFINITY;
      for (int tok = 0; tok < kT; ++tok) {
        lo = std::min(lo, double(at(k, tok, d)));
        hi = std::max(hi, double(at(k, tok, d)));
      }
      const U4Params p = u4_params(lo, hi);
      for (int tok = 0; tok < kT; ++tok) at(k, tok, d) = u4_value(p, u4_code(at(k, tok, d), p));
    }
    for (int tok = 0; tok < kT; ++tok)  // values: per token, groups of 32 channels
      for (int g = 0; g < D / 32; ++g) {
        double lo = INFINITY, hi = -INFINITY;
        for (int d = g * 32; d < g * 32 + 32; ++d) {
          lo = std::min(lo, double(at(v, tok, d)));
          hi = std::max(hi, double(at(v, tok, d)));
        }
        const U4Params p = u4_params(lo, hi);
        for (int d = g * 32; d < g * 32 + 32; ++d) at(v, tok, d) = u4_value(p, u4_code(at(v, tok, d), p));
      }
  }
}

// A block in the reference model's layout (ReferenceModel::KVBlockCodec): K and V [32][kv_dim], head h's
// channels at h * D.., every head quantized and dequantized in place.
inline void roundtrip_block(KVDType t, float* k, float* v, int64_t kv_dim, int D) {
  for (int64_t h = 0; h < kv_dim / D; ++h) roundtrip_head(t, k + h * D, v + h * D, kv_dim, D);
}

}  // namespace fd::test::kvref
