// The codec list and the served formats (fp16, int8, int4) as codecs: kv_codec.h.
#include "kernels/cpu/kv_codec.h"

#include <cmath>
#include <mutex>

#include "fastdecode/core/error.h"

namespace fd {

void KVCodec::check_shape(int H, int D) const {
  if (!(H > 0 && D > 0 && D % 32 == 0 && D <= 256))
    FD_THROW_BAD_INPUT("KV format " << name() << ": n_kv_heads " << H << " must be > 0 and head_dim " << D
                                    << " a multiple of 32 in [32, 256]");
}

namespace {

class ServedCodec final : public KVCodec {
 public:
  explicit ServedCodec(KVDType t) : t_(t) {}
  std::string_view name() const override { return kv_dtype_name(t_); }
  std::string_view describe() const override {
    switch (t_) {
      case KVDType::F16: return "fp16 K and V";
      case KVDType::I8: return "int8 symmetric: K and V per token and head (fp32 scales)";
      case KVDType::I4:
        return "int4 asymmetric: K per channel over the block's 32 tokens (KIVI), V per token in 32-channel groups "
               "(fp16 scale and min)";
    }
    return "?";
  }
  std::optional<KVDType> kernel() const override { return t_; }
  size_t block_bytes(int H, int D) const override { return kv_block_bytes(t_, H, D); }
  void quantize(const uint16_t* in, void* out, int H, int D) const override { kv_quantize_block(t_, in, out, H, D); }
  void dequantize_f32(const void* block, float* out, int H, int D) const override {
    kv_dequantize_block_f32(t_, block, out, H, D);
  }

 private:
  KVDType t_;
};

struct Registry {
  std::vector<std::unique_ptr<KVCodec>> codecs;
  Registry() {
    // Served formats first, then the study formats. A new format: one line here.
    for (KVDType t : {KVDType::F16, KVDType::I8, KVDType::I4}) codecs.push_back(make_served_kv_codec(t));
    for (const char* n : {"int4-ktoken", "int4-ktoken-rot", "int4-rot"}) codecs.push_back(make_int4_study_codec(n));
  }
};

const Registry& registry() {
  static const Registry r;
  return r;
}

}  // namespace

std::unique_ptr<KVCodec> make_served_kv_codec(KVDType dtype) { return std::make_unique<ServedCodec>(dtype); }

const KVCodec& kv_codec(std::string_view name) {
  std::string known;
  for (const auto& c : registry().codecs) {
    if (c->name() == name) return *c;
    known += (known.empty() ? "" : ", ") + std::string(c->name());
  }
  FD_THROW_BAD_INPUT("unknown KV format '" << name << "' (known: " << known << ")");
}

std::vector<std::string> kv_codec_names() {
  std::vector<std::string> n;
  for (const auto& c : registry().codecs) n.emplace_back(c->name());
  return n;
}

void kv_codec_round_trip(const KVCodec& c, const uint16_t* in, float* out, int H, int D) {
  c.check_shape(H, D);
  std::vector<uint8_t> q(c.block_bytes(H, D));
  c.quantize(in, q.data(), H, D);
  c.dequantize_f32(q.data(), out, H, D);
}

void hadamard_transform(float* x, int n) {
  FD_CHECK(n > 0 && (n & (n - 1)) == 0, "hadamard_transform: n = " << n << " is not a power of 2");
  for (int len = 1; len < n; len <<= 1)
    for (int i = 0; i < n; i += 2 * len)
      for (int j = i; j < i + len; ++j) {
        const float a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
  const float s = 1.0f / std::sqrt(float(n));
  for (int i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace fd
