// KV formats behind one interface (kernels/cpu/kv_codec.h): the list, every codec's contract, the served
// formats through the codec, the study formats against an independent twin and the served int4, the rotation,
// and the property the key-format study rests on (an outlier key channel ruins per-token keys; per-channel keys
// and a rotation before per-token keys keep it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "fastdecode/core/dtype.h"
#include "fastdecode/core/error.h"
#include "kernels/cpu/kv_codec.h"

namespace {

constexpr int kT = fd::kKVBlockTokens;

// K [H][32][D] then V: N(0,1), key channel 3 of each head a fixed-sign outlier of magnitude `big` (the pattern
// reported for LLM keys) when big > 0.
std::vector<uint16_t> block(uint32_t seed, int H, int D, float big) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> b(fd::kv_fp16_block_bytes(H, D) / 2);
  const size_t hs = size_t(kT) * D;
  for (int h = 0; h < H; ++h)
    for (int t = 0; t < kT; ++t)
      for (int d = 0; d < D; ++d) {
        const float k = nd(rng) + (big > 0 && d == 3 ? big : 0.f);
        b[h * hs + t * D + d] = fd::fp32_to_fp16(k);
        b[H * hs + h * hs + t * D + d] = fd::fp32_to_fp16(nd(rng));
      }
  return b;
}

std::vector<float> round_trip(const fd::KVCodec& c, const std::vector<uint16_t>& b, int H, int D) {
  std::vector<float> out(b.size());
  fd::kv_codec_round_trip(c, b.data(), out.data(), H, D);
  return out;
}

// Relative RMS error of the K half (keys: k = true) or the V half of a round trip.
double rel_err(const std::vector<uint16_t>& b, const std::vector<float>& r, bool keys) {
  const size_t half = b.size() / 2, off = keys ? 0 : half;
  double e = 0, n = 0;
  for (size_t i = off; i < off + half; ++i) {
    const double x = fd::fp16_to_fp32(b[i]);
    e += (r[i] - x) * (r[i] - x);
    n += x * x;
  }
  return std::sqrt(e / n);
}

TEST(KVCodec, ListAndNames) {
  const std::vector<std::string> expect = {"fp16", "int8", "int4", "int4-ktoken", "int4-ktoken-rot", "int4-rot"};
  EXPECT_EQ(fd::kv_codec_names(), expect);
  for (const std::string& n : expect) EXPECT_EQ(fd::kv_codec(n).name(), n);
  EXPECT_EQ(fd::kv_codec("int8").kernel(), fd::KVDType::I8);
  EXPECT_EQ(fd::kv_codec("int4").kernel(), fd::KVDType::I4);
  EXPECT_FALSE(fd::kv_codec("int4-ktoken-rot").kernel().has_value());
  try {
    fd::kv_codec("int3");
    FAIL() << "an unknown format must be refused";
  } catch (const fd::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("int4-ktoken-rot"), std::string::npos) << e.what();
  }
}

// Every listed codec: deterministic, its byte count, fp16 exact, int8 within 1 %, int4 within 12 % (RMS, N(0,1)).
TEST(KVCodec, EveryCodecsContract) {
  const int H = 2, D = 128;
  const auto b = block(1, H, D, 0.f);
  for (const std::string& n : fd::kv_codec_names()) {
    const fd::KVCodec& c = fd::kv_codec(n);
    SCOPED_TRACE(n);
    EXPECT_FALSE(c.describe().empty());
    const size_t bytes = c.block_bytes(H, D);
    EXPECT_LE(bytes, fd::kv_fp16_block_bytes(H, D));
    std::vector<uint8_t> q1(bytes + 64, 0xAB), q2(bytes + 64, 0xCD);
    c.quantize(b.data(), q1.data(), H, D);
    c.quantize(b.data(), q2.data(), H, D);
    EXPECT_EQ(0, std::memcmp(q1.data(), q2.data(), bytes)) << "quantize must be deterministic";
    EXPECT_EQ(q1[bytes], 0xAB) << "quantize wrote past block_bytes";
    const auto r = round_trip(c, b, H, D);
    const double bound = n == "fp16" ? 0.0 : n == "int8" ? 0.01 : 0.12;
    EXPECT_LE(rel_err(b, r, true), bound);
    EXPECT_LE(rel_err(b, r, false), bound);
  }
  EXPECT_EQ(fd::kv_codec("int4-ktoken").block_bytes(32, 128), fd::kv_block_bytes(fd::KVDType::I4, 32, 128));
}

// The served codecs are the R-worker's store: the same bytes and values as kv_quantize_block / _f32.
TEST(KVCodec, ServedCodecsAreTheStoresFormat) {
  const int H = 3, D = 64;
  const auto b = block(2, H, D, 12.f);
  for (fd::KVDType t : {fd::KVDType::I8, fd::KVDType::I4}) {
    std::vector<uint8_t> want(fd::kv_block_bytes(t, H, D)), got(want.size());
    fd::kv_quantize_block(t, b.data(), want.data(), H, D);
    fd::kv_codec(fd::kv_dtype_name(t)).quantize(b.data(), got.data(), H, D);
    EXPECT_EQ(want, got);
  }
}

// Two implementations of the same numbers: the study file's per-channel twin (plain layout, its own quantizer)
// gives the served int4's values exactly, K and V; and the study formats' V is the served int4's V.
TEST(KVCodec, PerChannelTwinEqualsServedInt4) {
  const int H = 2, D = 128;
  for (float big : {0.f, 20.f}) {
    const auto b = block(3, H, D, big);
    const auto twin = fd::make_int4_study_codec("int4-kchannel");
    const auto want = round_trip(fd::kv_codec("int4"), b, H, D);
    const auto got = round_trip(*twin, b, H, D);
    size_t diff = 0;
    for (size_t i = 0; i < want.size(); ++i) diff += want[i] != got[i];
    EXPECT_EQ(diff, 0u) << "values that differ from the served int4 (outlier " << big << ")";
    for (const char* n : {"int4-ktoken", "int4-ktoken-rot", "int4-rot"}) {
      const auto r = round_trip(fd::kv_codec(n), b, H, D);
      EXPECT_TRUE(std::equal(r.begin() + r.size() / 2, r.end(), want.begin() + want.size() / 2)) << n << ": V differs";
    }
  }
}

TEST(KVCodec, HadamardIsOrthonormalAndItsOwnInverse) {
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int n : {1, 2, 32, 64, 128, 256}) {
    std::vector<float> x(n), y;
    for (float& v : x) v = nd(rng);
    y = x;
    fd::hadamard_transform(y.data(), n);
    double nx = 0, ny = 0;
    for (int i = 0; i < n; ++i) nx += x[i] * x[i], ny += y[i] * y[i];
    EXPECT_NEAR(ny, nx, 1e-4 * nx) << n;
    fd::hadamard_transform(y.data(), n);
    for (int i = 0; i < n; ++i) EXPECT_NEAR(y[i], x[i], 1e-5) << n << " at " << i;
  }
  std::vector<float> e(8, 0.f);
  e[0] = 1.f;
  fd::hadamard_transform(e.data(), 8);
  for (float v : e) EXPECT_FLOAT_EQ(v, 1.f / std::sqrt(8.f));
  std::vector<float> bad(96);
  EXPECT_THROW(fd::hadamard_transform(bad.data(), 96), fd::Error);
}

TEST(KVCodec, ShapesEachFormatCannotHold) {
  EXPECT_NO_THROW(fd::kv_codec("int4-ktoken").block_bytes(2, 96));
  EXPECT_THROW(fd::kv_codec("int4-ktoken-rot").block_bytes(2, 96), fd::ConfigError);
  EXPECT_THROW(fd::kv_codec("int4-rot").block_bytes(2, 96), fd::ConfigError);
  EXPECT_THROW(fd::kv_codec("int4").block_bytes(2, 48), fd::Error);
}

// Why the key format matters: with a fixed-sign outlier channel, a per-token key scale is set by it and the other
// channels lose their resolution; per-channel keys isolate it, and a rotation spreads it before per-token keys.
TEST(KVCodec, OutlierKeyChannelFavoursPerChannelOrRotatedKeys) {
  const int H = 2, D = 128;
  const auto b = block(5, H, D, 40.f);
  const double per_channel = rel_err(b, round_trip(fd::kv_codec("int4"), b, H, D), true);
  const double per_token = rel_err(b, round_trip(fd::kv_codec("int4-ktoken"), b, H, D), true);
  const double rotated = rel_err(b, round_trip(fd::kv_codec("int4-ktoken-rot"), b, H, D), true);
  const double rot_channel = rel_err(b, round_trip(fd::kv_codec("int4-rot"), b, H, D), true);
  std::printf("K relative RMS error with an outlier channel: per channel %.4f, per token %.4f, rotated per token %.4f, "
              "rotated per channel %.4f\n", per_channel, per_token, rotated, rot_channel);
  EXPECT_GT(per_token, 2.0 * per_channel);
  EXPECT_LT(rotated, 0.75 * per_token);
  // Without the outlier the per-token format is no worse than per channel by much.
  const auto flat = block(5, H, D, 0.f);
  EXPECT_LT(rel_err(flat, round_trip(fd::kv_codec("int4-ktoken"), flat, H, D), true),
            1.5 * rel_err(flat, round_trip(fd::kv_codec("int4"), flat, H, D), true));
}

}  // namespace
