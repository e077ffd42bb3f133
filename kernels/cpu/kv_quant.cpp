// KV dtypes and their full-block layouts; quantize (once per block when it fills) and dequantize.
//
// Shapes: H = n_kv_heads, D = head_dim (multiple of 32), kBT = 32 tokens per block. Byte counts are for
// one head at D = 128.
//
//   fp16 (the tail layout):  K fp16 [H][kBT][D], V fp16 [H][kBT][D].                       16384 B/head
//   int8 and int4 are head-major: head h's codes and scales are one contiguous run (the block of one head), the
//   H runs one after the other, so a task reading a head (or heads_per_task adjacent heads) reads one run.
//   int8 (symmetric, per token and head; x = scale * code, code in [-127, 127]), a head's run:
//        K int8 [D/4][kBT][4] (token-interleaved words of 4 channels, as the int4 keys'), V int8 [kBT][D],
//        K scale fp32 [kBT], V scale fp32 [kBT].                                            8448 B/head (1.94x)
//        fp32 scales: 256 B/head more than fp16 ones (3%) and no rounding of the scale to think about.
//   int4 (KIVI-style, asymmetric; x = scale * code + min, code in [0, 15]), a head's run:
//        K codes [D/8][kBT][4] (token-interleaved words), V codes [kBT/4][D/32][16][4] (quad-group words),
//        K params fp16 [2][D]       (row 0: scale per channel over the block's 32 tokens, row 1: min),
//        V params fp16 [D/32][2][kBT] (per group of 32 channels: the 32 tokens' scales, then their
//        mins; token-contiguous so a block's scales convert with vector loads).          5120 B/head (3.2x)
//        Head-major since issue 18's step 3.8: with the codes of all heads first and the scales after, a head was
//        four short runs (2 KiB, 2 KiB, 0.5 KiB, 0.5 KiB at d = 128 for int4). Measured: no change on the GPU
//        machine's Xeon beyond its spread, int4 2-3 % faster on the dev VM (artifacts/rworker/gpu-machine-headmajor-0c7afb6/).
//        Keys per channel because LLM keys have outlier *channels* (a per-token scale would be set by
//        them); values per token because their outliers are not channel-aligned (KIVI, arXiv 2402.02750).
//
// int4 value packing, chosen for p . V: a token's 32-channel group is 16 bytes, byte j holding channel j in the
// low nibble and channel 16 + j in the high one; the 4 tokens of a quad (4q..4q+3) put their byte j side by side
// in a 4-byte word, and a group's 16 words make 64 bytes ([kBT/4][D/32][16][4]; u4_val and pack_u4_values in
// decode_attention_impl.h). A 64-byte load is then VPDPBUSD's operand as it lies (4 tokens of 16 channels a
// lane, low nibbles; the high ones the next 16 channels), against the quad's 4 weight codes of that group
// broadcast; in rows the integer kernel interleaved each quad's rows with 8 shuffles and built per-lane
// weights. The fp32 path takes token t's byte with a shift by 8 (t % 4).
// int4 key packing, chosen for the score q . K: 4-byte words of 8 channels, the block's 32 tokens' words of
// channels 8w..8w+7 side by side ([D/8][kBT][4]; byte b: channel 8w + b low, 8w + 4 + b high; u4_key and
// pack_u4_keys in decode_attention_impl.h). A 64-byte load is one word of 16 tokens, so a VPDPBUSD against a
// broadcast query word (or an FMA per channel) makes 16 tokens' partial scores in 16 lanes, with no sum
// across lanes per token; in rows (as the values are) each token's score was a reduction of 16 lanes, ~40 %
// of the int4 integer kernel's time on the dev Xeon.
//
// Rounding: codes are round-to-nearest-even of the value in units of the *stored* (fp16-rounded)
// scale and min, so dequantization uses exactly what was quantized against.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "fastdecode/core/dtype.h"
#include "fastdecode/core/error.h"
#include "fd_fault_int4_wrong_nibble.h"  // planted fault (scripts/fault-check.sh; fastdecode/core/fault.h)
#include "kernels/cpu/decode_attention_impl.h"

namespace fd {

using attn::kBT;

std::string_view kv_dtype_name(KVDType t) {
  switch (t) {
    case KVDType::F16: return "fp16";
    case KVDType::I8: return "int8";
    case KVDType::I4: return "int4";
  }
  FD_THROW("unknown KV dtype " << int(t));
}

KVDType kv_dtype_from_name(std::string_view name) {
  if (name == "fp16") return KVDType::F16;
  if (name == "int8") return KVDType::I8;
  if (name == "int4") return KVDType::I4;
  FD_THROW("unknown KV dtype '" << name << "' (expected fp16, int8 or int4)");
}

static void check_shape(int H, int D) {
  FD_CHECK(H > 0 && D > 0 && D % 32 == 0 && D <= 256,
           "KV block shape: n_kv_heads " << H << " must be > 0 and head_dim " << D
                                          << " a multiple of 32 in [32, 256]");
}

size_t kv_block_bytes(KVDType dtype, int H, int D) {
  check_shape(H, D);
  switch (dtype) {  // int8 / int4: H heads' runs (decode_attention_impl.h)
    case KVDType::F16: return kv_fp16_block_bytes(H, D);
    case KVDType::I8: return size_t(H) * attn::i8_head_bytes(D);
    case KVDType::I4: return size_t(H) * attn::i4_head_bytes(D);
  }
  FD_THROW("unknown KV dtype " << int(dtype));
}

namespace {

// int8, one row of n values: scale = max|x| / 127.
void quant_i8_row(const uint16_t* x, int n, int8_t* code, float* scale) {
  float amax = 0;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(fp16_to_fp32(x[i])));
  const float s = amax / 127.f;
  *scale = s;
  for (int i = 0; i < n; ++i) {
    const float c = s > 0 ? std::nearbyint(fp16_to_fp32(x[i]) / s) : 0.f;
    code[i] = int8_t(std::clamp(c, -127.f, 127.f));
  }
}

// int4 parameters for values in [lo, hi]: lo is itself an fp16 value (the inputs are fp16), so the
// min is stored exactly; the scale is rounded up (next fp16) until 15 steps reach hi.
void u4_params(float lo, float hi, uint16_t* s_h, uint16_t* z_h) {
  const uint16_t z = fp32_to_fp16(lo);
  const float zf = fp16_to_fp32(z);
  uint16_t s = fp32_to_fp16((hi - zf) / 15.f);
  for (int i = 0; i < 4 && fp16_to_fp32(s) * 15.f + zf < hi; ++i) s = uint16_t(s + 1);  // s >= 0: next fp16 up
  *s_h = s;
  *z_h = z;
}

inline uint8_t u4_code(float x, float s, float z) {
  if (!(s > 0)) return 0;
  return uint8_t(std::clamp(std::nearbyint((x - z) / s), 0.f, 15.f));
}

}  // namespace

namespace kvq {
#ifndef FD_SCALAR_KERNELS_ONLY
void quantize_block_avx512(KVDType dtype, const uint16_t* src, void* out, int H, int D);  // kv_quant_avx512.cpp
#endif

// The scalar int8 / int4 quantizer: the definition of the codes (the AVX-512 twin matches it bit for bit).
static void quantize_block_scalar(KVDType dtype, const uint16_t* src, void* out, int H, int D) {
  switch (dtype) {
    case KVDType::F16: return;
    case KVDType::I8: {
      int8_t kcodes[kBT][256];
      for (int h = 0; h < H; ++h) {
        const attn::I8Head hd = attn::i8_head(out, H, D, h);
        const attn::F16Head in = attn::f16_head(src, H, D, h);
        for (int t = 0; t < kBT; ++t) {
          quant_i8_row(in.k + size_t(t) * D, D, kcodes[t], const_cast<float*>(hd.ks) + t);
          quant_i8_row(in.v + size_t(t) * D, D, const_cast<int8_t*>(hd.v) + size_t(t) * D, const_cast<float*>(hd.vs) + t);
        }
        attn::pack_i8_keys(&kcodes[0][0], 256, D, const_cast<int8_t*>(hd.k));
      }
      return;
    }
    case KVDType::I4: {
      uint8_t codes[kBT][256];
      for (int h = 0; h < H; ++h) {
        const attn::I4Head hd = attn::i4_head(out, H, D, h);
        const attn::F16Head in = attn::f16_head(src, H, D, h);
        auto* kp = const_cast<uint16_t*>(hd.kp);
        auto* vp = const_cast<uint16_t*>(hd.vp);
        // Keys: per channel over the 32 tokens.
        for (int d = 0; d < D; ++d) {
          float lo = INFINITY, hi = -INFINITY;
          for (int t = 0; t < kBT; ++t) {
            const float x = fp16_to_fp32(in.k[size_t(t) * D + d]);
            lo = std::min(lo, x);
            hi = std::max(hi, x);
          }
          u4_params(lo, hi, &kp[d], &kp[D + d]);
          const float s = fp16_to_fp32(kp[d]), z = fp16_to_fp32(kp[D + d]);
          for (int t = 0; t < kBT; ++t) codes[t][d] = u4_code(fp16_to_fp32(in.k[size_t(t) * D + d]), s, z);
        }
        attn::pack_u4_keys(&codes[0][0], 256, D, const_cast<uint8_t*>(hd.k));
        // Values: per token, groups of 32 channels.
        for (int t = 0; t < kBT; ++t) {
          const uint16_t* x = in.v + size_t(t) * D;
          for (int g = 0; g < D / 32; ++g) {
            float lo = INFINITY, hi = -INFINITY;
            for (int d = g * 32; d < g * 32 + 32; ++d) {
              lo = std::min(lo, fp16_to_fp32(x[d]));
              hi = std::max(hi, fp16_to_fp32(x[d]));
            }
            uint16_t* sp = vp + (2 * g) * kBT + t;  // scale; the min is kBT further
            u4_params(lo, hi, sp, sp + kBT);
            const float s = fp16_to_fp32(sp[0]), z = fp16_to_fp32(sp[kBT]);
            for (int d = g * 32; d < g * 32 + 32; ++d) codes[t][d] = u4_code(fp16_to_fp32(x[d]), s, z);
          }
        }
        attn::pack_u4_values(&codes[0][0], 256, D, const_cast<uint8_t*>(hd.v));
      }
      return;
    }
  }
}
}  // namespace kvq

void kv_quantize_block_isa(KVDType dtype, const uint16_t* src, void* out, int H, int D, Isa isa) {
  const size_t bytes = kv_block_bytes(dtype, H, D);
  FD_CHECK(src && out, "kv_quantize_block: null pointer");
  FD_CHECK(isa_supported(isa), "kv_quantize_block: ISA " << isa_name(isa) << " is not supported on this CPU");
  switch (dtype) {
    case KVDType::F16: std::memcpy(out, src, bytes); return;
    case KVDType::I8:
    case KVDType::I4:
#ifndef FD_SCALAR_KERNELS_ONLY
      if (isa >= Isa::AVX512) kvq::quantize_block_avx512(dtype, src, out, H, D);
      else
#endif
        kvq::quantize_block_scalar(dtype, src, out, H, D);
#ifdef FD_FAULT_INT4_WRONG_NIBBLE  // planted fault: head 0's first K code of the block is off by one
      if (dtype == KVDType::I4) static_cast<uint8_t*>(out)[0] ^= 1;
#endif
      return;
  }
  FD_THROW("unknown KV dtype " << int(dtype));
}

void kv_quantize_block(KVDType dtype, const uint16_t* src, void* out, int H, int D) {
  static const Isa isa = isa_supported(Isa::AVX512) ? Isa::AVX512 : Isa::Scalar;
  kv_quantize_block_isa(dtype, src, out, H, D, isa);
}

void kv_dequantize_block_f32(KVDType dtype, const void* block, float* out, int H, int D) {
  check_shape(H, D);
  FD_CHECK(block && out, "kv_dequantize_block: null pointer");
  const size_t hs = size_t(kBT) * D;  // one head's K (or V) in the fp16 layout
  for (int h = 0; h < H; ++h) {
    float* ko = out + h * hs;
    float* vo = out + H * hs + h * hs;
    switch (dtype) {
      case KVDType::F16: {
        const attn::F16Head hd = attn::f16_head(block, H, D, h);
        for (size_t i = 0; i < hs; ++i) ko[i] = fp16_to_fp32(hd.k[i]), vo[i] = fp16_to_fp32(hd.v[i]);
        break;
      }
      case KVDType::I8: {
        const attn::I8Head hd = attn::i8_head(block, H, D, h);
        for (int t = 0; t < kBT; ++t)
          for (int d = 0; d < D; ++d) {
            ko[t * D + d] = hd.ks[t] * float(attn::i8_key(hd.k, t, d));
            vo[t * D + d] = hd.vs[t] * float(hd.v[size_t(t) * D + d]);
          }
        break;
      }
      case KVDType::I4: {
        const attn::I4Head hd = attn::i4_head(block, H, D, h);
        for (int t = 0; t < kBT; ++t)
          for (int d = 0; d < D; ++d) {
            const uint16_t* vp = hd.vp + (2 * (d / 32)) * kBT + t;
            ko[t * D + d] = float(double(fp16_to_fp32(hd.kp[d])) * attn::u4_key(hd.k, t, d) +
                                  double(fp16_to_fp32(hd.kp[D + d])));
            vo[t * D + d] = float(double(fp16_to_fp32(vp[0])) * attn::u4_val(hd.v, t, d, D) +
                                  double(fp16_to_fp32(vp[kBT])));
          }
        break;
      }
      default: FD_THROW("unknown KV dtype " << int(dtype));
    }
  }
}

void kv_dequantize_block(KVDType dtype, const void* block, uint16_t* fp16_block, int H, int D) {
  const size_t n = kv_fp16_block_bytes(H, D) / 2;
  std::vector<float> tmp(n);
  kv_dequantize_block_f32(dtype, block, tmp.data(), H, D);
  for (size_t i = 0; i < n; ++i) fp16_block[i] = fp32_to_fp16(tmp[i]);
}

}  // namespace fd
