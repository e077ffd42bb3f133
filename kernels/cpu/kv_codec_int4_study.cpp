// int4 study formats (kv_codec.h): the key formats issue 44 judges by accuracy before any kernel reads them.
// Values are stored as the served int4 stores them (per token, groups of 32 channels, asymmetric); keys by
//   int4-ktoken       per token in groups of 32 channels (as the values)
//   int4-ktoken-rot   each token's key rotated by the orthonormal Walsh-Hadamard transform of its head (QuaRot /
//                     llama.cpp's rotation: it spreads an outlier channel over all channels), then per token
//   int4-rot          rotated, then per channel over the block's 32 tokens (as the served int4)
//   int4-kchannel     not listed: per channel without a rotation, i.e. the served int4's numbers in this file's
//                     plain layout; the tests hold it equal to the served int4, value for value.
// Layout, each head's run one after the other (plain, not kernel-shaped: no kernel reads these):
//   K codes [32][D/2], V codes [32][D/2] (channel 2i in the low nibble, 2i + 1 in the high one), then the fp16
//   parameters: K per token [32][D/32][2] (scale, min) or per channel [2][D] (scales, then mins), V [32][D/32][2].
//   40·D bytes a head, as the served int4 (5120 at D = 128).
// Parameters: min = the group's minimum rounded down to fp16 (exact for fp16 inputs), scale = (max - min) / 15
// rounded to fp16 and raised until 15 steps reach the maximum; codes round to nearest even in units of the
// stored scale and min, clamped to [0, 15].
#include <algorithm>
#include <cmath>
#include <cstring>

#include "fastdecode/core/dtype.h"
#include "fastdecode/core/error.h"
#include "kernels/cpu/kv_codec.h"

namespace fd {
namespace {

constexpr int kBT = kKVBlockTokens;

uint16_t fp16_floor(float x) {  // the largest fp16 value <= x
  uint16_t h = fp32_to_fp16(x);
  for (int i = 0; i < 2 && fp16_to_fp32(h) > x; ++i) h = (h & 0x8000) ? uint16_t(h + 1) : (h == 0 ? uint16_t(0x8001) : uint16_t(h - 1));
  return h;
}

struct Params {
  uint16_t scale, min;
};

Params u4_params(const float* x, int n, int stride) {
  float lo = INFINITY, hi = -INFINITY;
  for (int i = 0; i < n; ++i) lo = std::min(lo, x[i * stride]), hi = std::max(hi, x[i * stride]);
  const uint16_t z = fp16_floor(lo);
  const float zf = fp16_to_fp32(z);
  uint16_t s = fp32_to_fp16((hi - zf) / 15.f);
  for (int i = 0; i < 4 && fp16_to_fp32(s) * 15.f + zf < hi; ++i) s = uint16_t(s + 1);
  return {s, z};
}

uint8_t u4_code(float x, Params p) {
  const float s = fp16_to_fp32(p.scale), z = fp16_to_fp32(p.min);
  if (!(s > 0)) return 0;
  return uint8_t(std::clamp(std::nearbyint((x - z) / s), 0.f, 15.f));
}

float u4_value(uint8_t code, Params p) {
  return float(double(fp16_to_fp32(p.scale)) * code + double(fp16_to_fp32(p.min)));
}

class Int4Study final : public KVCodec {
 public:
  Int4Study(std::string name, bool keys_per_token, bool rotate, std::string describe)
      : name_(std::move(name)), per_token_(keys_per_token), rotate_(rotate), describe_(std::move(describe)) {}
  std::string_view name() const override { return name_; }
  std::string_view describe() const override { return describe_; }
  std::optional<KVDType> kernel() const override { return std::nullopt; }
  void check_shape(int H, int D) const override {
    KVCodec::check_shape(H, D);
    if (rotate_ && (D & (D - 1)) != 0)
      FD_THROW_BAD_INPUT("KV format " << name_ << ": the Hadamard rotation needs head_dim a power of 2, not " << D);
  }
  size_t block_bytes(int H, int D) const override {
    check_shape(H, D);
    return size_t(H) * head_bytes(D);
  }

  void quantize(const uint16_t* in, void* out, int H, int D) const override {
    check_shape(H, D);
    std::vector<float> k(size_t(kBT) * D), v(size_t(kBT) * D);
    for (int h = 0; h < H; ++h) {
      const uint16_t* ki = in + size_t(h) * kBT * D;
      const uint16_t* vi = in + size_t(H + h) * kBT * D;
      for (size_t i = 0; i < k.size(); ++i) k[i] = fp16_to_fp32(ki[i]), v[i] = fp16_to_fp32(vi[i]);
      if (rotate_)
        for (int t = 0; t < kBT; ++t) hadamard_transform(k.data() + size_t(t) * D, D);
      Head hd = head(out, D, h);
      std::vector<uint8_t> codes(size_t(kBT) * D);
      if (per_token_) {
        group_per_token(k.data(), D, codes.data(), hd.kp);
      } else {
        for (int d = 0; d < D; ++d) {
          const Params p = u4_params(k.data() + d, kBT, D);
          hd.kp[d] = p.scale, hd.kp[D + d] = p.min;
          for (int t = 0; t < kBT; ++t) codes[size_t(t) * D + d] = u4_code(k[size_t(t) * D + d], p);
        }
      }
      pack(codes.data(), D, hd.k);
      group_per_token(v.data(), D, codes.data(), hd.vp);
      pack(codes.data(), D, hd.v);
    }
  }

  void dequantize_f32(const void* block, float* out, int H, int D) const override {
    check_shape(H, D);
    for (int h = 0; h < H; ++h) {
      const Head hd = head(const_cast<void*>(block), D, h);
      float* ko = out + size_t(h) * kBT * D;
      float* vo = out + size_t(H + h) * kBT * D;
      for (int t = 0; t < kBT; ++t)
        for (int d = 0; d < D; ++d) {
          const Params kp = per_token_ ? Params{hd.kp[(t * (D / 32) + d / 32) * 2], hd.kp[(t * (D / 32) + d / 32) * 2 + 1]}
                                       : Params{hd.kp[d], hd.kp[D + d]};
          const Params vp{hd.vp[(t * (D / 32) + d / 32) * 2], hd.vp[(t * (D / 32) + d / 32) * 2 + 1]};
          ko[t * D + d] = u4_value(nibble(hd.k, D, t, d), kp);
          vo[t * D + d] = u4_value(nibble(hd.v, D, t, d), vp);
        }
      if (rotate_)
        for (int t = 0; t < kBT; ++t) hadamard_transform(ko + size_t(t) * D, D);  // its own inverse
    }
  }

 private:
  struct Head {
    uint8_t* k;
    uint8_t* v;
    uint16_t* kp;
    uint16_t* vp;
  };
  static size_t head_bytes(int D) { return size_t(kBT) * D + size_t(8) * D; }
  static Head head(void* block, int D, int h) {
    auto* b = static_cast<uint8_t*>(block) + size_t(h) * head_bytes(D);
    const size_t codes = size_t(kBT) * D / 2;
    return {b, b + codes, reinterpret_cast<uint16_t*>(b + 2 * codes), reinterpret_cast<uint16_t*>(b + 2 * codes + 4 * D)};
  }
  static void pack(const uint8_t* codes, int D, uint8_t* out) {
    for (size_t i = 0; i < size_t(kBT) * D / 2; ++i) out[i] = uint8_t(codes[2 * i] | (codes[2 * i + 1] << 4));
  }
  static uint8_t nibble(const uint8_t* packed, int D, int t, int d) {
    const uint8_t b = packed[(size_t(t) * D + d) / 2];
    return (d & 1) ? uint8_t(b >> 4) : uint8_t(b & 15);
  }
  // Per token, groups of 32 channels: params [32][D/32][2].
  static void group_per_token(const float* x, int D, uint8_t* codes, uint16_t* params) {
    for (int t = 0; t < kBT; ++t)
      for (int g = 0; g < D / 32; ++g) {
        const float* row = x + size_t(t) * D + g * 32;
        const Params p = u4_params(row, 32, 1);
        params[(t * (D / 32) + g) * 2] = p.scale;
        params[(t * (D / 32) + g) * 2 + 1] = p.min;
        for (int d = 0; d < 32; ++d) codes[size_t(t) * D + g * 32 + d] = u4_code(row[d], p);
      }
  }

  std::string name_;
  bool per_token_, rotate_;
  std::string describe_;
};

}  // namespace

std::unique_ptr<KVCodec> make_int4_study_codec(std::string_view name) {
  const std::string v = ", V per token in 32-channel groups (fp16 scale and min)";
  if (name == "int4-ktoken")
    return std::make_unique<Int4Study>(std::string(name), true, false, "int4: K per token in 32-channel groups" + v);
  if (name == "int4-ktoken-rot")
    return std::make_unique<Int4Study>(std::string(name), true, true,
                                       "int4: K Hadamard-rotated per head, then per token in 32-channel groups" + v);
  if (name == "int4-rot")
    return std::make_unique<Int4Study>(std::string(name), false, true,
                                       "int4: K Hadamard-rotated per head, then per channel over the block's 32 tokens" + v);
  if (name == "int4-kchannel")
    return std::make_unique<Int4Study>(std::string(name), false, false,
                                       "int4: K per channel over the block's 32 tokens" + v + " (the served int4's numbers)");
  FD_THROW("make_int4_study_codec: no study format '" << name << "'");
}

}  // namespace fd
