// fp16 / bf16 conversion (exhaustive where cheap) and dtype names.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "fastdecode/core/dtype.h"
#include "fastdecode/core/error.h"

namespace {

using fd::DType;
using ::testing::HasSubstr;

float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
bool fp16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool bf16_is_nan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }

// Value of a half bit pattern computed independently of the library (via ldexp).
double fp16_reference(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int man = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exp == 31) return sign * std::numeric_limits<double>::infinity();
  if (exp == 0) return sign * std::ldexp(man, -24);
  return sign * std::ldexp(1024 + man, exp - 25);
}

TEST(DTypeFp16, ExhaustiveRoundTripAndValue) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float f = fd::fp16_to_fp32(h);
    if (fp16_is_nan(h)) {
      EXPECT_TRUE(std::isnan(f)) << "half bits 0x" << std::hex << i;
      EXPECT_TRUE(fp16_is_nan(fd::fp32_to_fp16(f))) << "half bits 0x" << std::hex << i;
      continue;
    }
    EXPECT_EQ(static_cast<double>(f), fp16_reference(h)) << "half bits 0x" << std::hex << i;
    EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0) << "half bits 0x" << std::hex << i;
    EXPECT_EQ(fd::fp32_to_fp16(f), h) << "half bits 0x" << std::hex << i;
  }
}

// Every midpoint between two adjacent finite halves is exact in fp32: it must round to the even one,
// and the floats just below / above it to the lower / upper neighbour.
TEST(DTypeFp16, RoundsToNearestEvenAtEveryMidpoint) {
  for (uint16_t lo = 0; lo < 0x7bff; ++lo) {
    const uint16_t hi = lo + 1;
    const float mid = static_cast<float>((fp16_reference(lo) + fp16_reference(hi)) / 2);
    ASSERT_EQ(static_cast<double>(mid), (fp16_reference(lo) + fp16_reference(hi)) / 2);
    const uint16_t even = (lo & 1) ? hi : lo;
    EXPECT_EQ(fd::fp32_to_fp16(mid), even) << "lo 0x" << std::hex << lo;
    EXPECT_EQ(fd::fp32_to_fp16(-mid), even | 0x8000) << "lo 0x" << std::hex << lo;
    EXPECT_EQ(fd::fp32_to_fp16(std::nextafter(mid, 0.f)), lo) << "lo 0x" << std::hex << lo;
    EXPECT_EQ(fd::fp32_to_fp16(std::nextafter(mid, 1e9f)), hi) << "lo 0x" << std::hex << lo;
  }
}

TEST(DTypeFp16, SpecificRounding) {
  EXPECT_EQ(fd::fp32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(fd::fp32_to_fp16(1.0f + 0x1p-11f), 0x3c00);         // halfway 1 and 1+2^-10 -> even
  EXPECT_EQ(fd::fp32_to_fp16(1.0f + 3 * 0x1p-11f), 0x3c02);     // halfway odd/even -> even (up)
  EXPECT_EQ(fd::fp32_to_fp16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
  EXPECT_EQ(fd::fp32_to_fp16(2047.5f), 0x6800);                 // halfway 2047 / 2048 -> 2048 (even)
  EXPECT_EQ(fd::fp32_to_fp16(2049.0f), 0x6800);                 // halfway 2048 / 2050 -> 2048 (even)
  EXPECT_EQ(fd::fp32_to_fp16(2051.0f), 0x6802);                 // halfway 2050 / 2052 -> 2052 (even)
  EXPECT_EQ(fd::fp32_to_fp16(-0.0f), 0x8000);
}

TEST(DTypeFp16, OverflowToInfinity) {
  EXPECT_EQ(fd::fp32_to_fp16(65504.f), 0x7bff);
  EXPECT_EQ(fd::fp32_to_fp16(std::nextafter(65520.f, 0.f)), 0x7bff);
  EXPECT_EQ(fd::fp32_to_fp16(65520.f), 0x7c00);
  EXPECT_EQ(fd::fp32_to_fp16(-65520.f), 0xfc00);
  EXPECT_EQ(fd::fp32_to_fp16(1e10f), 0x7c00);
  EXPECT_EQ(fd::fp32_to_fp16(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(fd::fp32_to_fp16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(fd::fp32_to_fp16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_TRUE(fp16_is_nan(fd::fp32_to_fp16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(fp16_is_nan(fd::fp32_to_fp16(bits_to_f32(0x7f800001u))));  // signalling NaN, low payload
  EXPECT_TRUE(std::isinf(fd::fp16_to_fp32(0x7c00)));
}

TEST(DTypeFp16, Subnormals) {
  EXPECT_EQ(fd::fp32_to_fp16(0x1p-24f), 0x0001);                // smallest subnormal
  EXPECT_EQ(fd::fp16_to_fp32(0x0001), 0x1p-24f);
  EXPECT_EQ(fd::fp32_to_fp16(0x1p-25f), 0x0000);                // halfway 0 / 2^-24 -> 0 (even)
  EXPECT_EQ(fd::fp32_to_fp16(-0x1p-25f), 0x8000);
  EXPECT_EQ(fd::fp32_to_fp16(std::nextafter(0x1p-25f, 1.f)), 0x0001);
  EXPECT_EQ(fd::fp32_to_fp16(3 * 0x1p-26f), 0x0001);
  EXPECT_EQ(fd::fp32_to_fp16(3 * 0x1p-25f), 0x0002);            // 1.5 * 2^-24 -> 2 (even)
  EXPECT_EQ(fd::fp32_to_fp16(5 * 0x1p-25f), 0x0002);            // 2.5 * 2^-24 -> 2 (even)
  EXPECT_EQ(fd::fp32_to_fp16(0x1p-30f), 0x0000);
  EXPECT_EQ(fd::fp32_to_fp16(bits_to_f32(1)), 0x0000);          // fp32 subnormal
  EXPECT_EQ(fd::fp32_to_fp16(1023 * 0x1p-24f), 0x03ff);         // largest subnormal
  EXPECT_EQ(fd::fp32_to_fp16(1023.5f * 0x1p-24f), 0x0400);      // halfway -> smallest normal (even)
  EXPECT_EQ(fd::fp32_to_fp16(0x1p-14f), 0x0400);
}

TEST(DTypeBf16, ExhaustiveRoundTrip) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float f = fd::bf16_to_fp32(h);
    EXPECT_EQ(f32_to_bits(f), i << 16);
    if (bf16_is_nan(h)) {
      EXPECT_TRUE(bf16_is_nan(fd::fp32_to_bf16(f))) << "bf16 bits 0x" << std::hex << i;
    } else {
      EXPECT_EQ(fd::fp32_to_bf16(f), h) << "bf16 bits 0x" << std::hex << i;
    }
  }
}

TEST(DTypeBf16, RoundsToNearestEvenAtEveryMidpoint) {
  for (uint32_t lo = 0; lo < 0x7f7f; ++lo) {
    const uint32_t mid = (lo << 16) | 0x8000u;  // exactly between lo and lo + 1
    const uint32_t even = (lo & 1) ? lo + 1 : lo;
    EXPECT_EQ(fd::fp32_to_bf16(bits_to_f32(mid)), even) << "lo 0x" << std::hex << lo;
    EXPECT_EQ(fd::fp32_to_bf16(bits_to_f32(mid | 0x80000000u)), even | 0x8000u) << "lo 0x" << std::hex << lo;
    EXPECT_EQ(fd::fp32_to_bf16(bits_to_f32(mid - 1)), lo) << "lo 0x" << std::hex << lo;
    EXPECT_EQ(fd::fp32_to_bf16(bits_to_f32(mid + 1)), lo + 1) << "lo 0x" << std::hex << lo;
  }
}

TEST(DTypeBf16, SpecificCases) {
  EXPECT_EQ(fd::fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(fd::fp32_to_bf16(1.0f + 0x1p-8f), 0x3f80);          // halfway -> even (down)
  EXPECT_EQ(fd::fp32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);      // halfway -> even (up)
  EXPECT_EQ(fd::fp32_to_bf16(-2.0f), 0xc000);
  // Overflow: the largest bf16 is 0x7f7f; FLT_MAX is above the midpoint to 2^128 -> inf.
  EXPECT_EQ(fd::fp32_to_bf16(bits_to_f32(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(fd::fp32_to_bf16(bits_to_f32(0x7f7f8000u)), 0x7f80);
  EXPECT_EQ(fd::fp32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(fd::fp32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_TRUE(bf16_is_nan(fd::fp32_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(bf16_is_nan(fd::fp32_to_bf16(bits_to_f32(0x7f800001u))));  // payload only in low bits
  EXPECT_TRUE(bf16_is_nan(fd::fp32_to_bf16(bits_to_f32(0xff800001u))));
  // Subnormals (fp32 and bf16 share the exponent range).
  EXPECT_EQ(fd::fp32_to_bf16(bits_to_f32(0x00000001u)), 0x0000);
  EXPECT_EQ(fd::fp32_to_bf16(bits_to_f32(0x00008000u)), 0x0000);  // halfway 0 / smallest -> 0
  EXPECT_EQ(fd::fp32_to_bf16(bits_to_f32(0x00008001u)), 0x0001);
  EXPECT_EQ(fd::fp32_to_bf16(bits_to_f32(0x00018000u)), 0x0002);  // halfway 1 / 2 -> 2
  EXPECT_EQ(fd::fp32_to_bf16(bits_to_f32(0x007fffffu)), 0x0080);  // largest subnormal -> smallest normal
  EXPECT_EQ(fd::bf16_to_fp32(0x0001), bits_to_f32(0x00010000u));
}

TEST(DTypeConvert, ArraysMatchScalarFunctions) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.f, 100.f);
  std::vector<float> src(1000);
  for (auto& x : src) x = dist(rng);
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    std::vector<unsigned char> buf(src.size() * fd::dtype_size(t));
    fd::convert_from_f32(t, src.data(), buf.data(), src.size());
    std::vector<float> back(src.size());
    fd::convert_to_f32(t, buf.data(), back.data(), src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      float expect = src[i];
      if (t == DType::F16) expect = fd::fp16_to_fp32(fd::fp32_to_fp16(src[i]));
      if (t == DType::BF16) expect = fd::bf16_to_fp32(fd::fp32_to_bf16(src[i]));
      ASSERT_EQ(back[i], expect) << fd::dtype_name(t) << " element " << i;
    }
  }
}

TEST(DTypeNames, RoundTripAndSizes) {
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    EXPECT_EQ(fd::dtype_from_name(fd::dtype_name(t)), t);
    DType parsed{};
    ASSERT_TRUE(fd::dtype_from_safetensors_name(fd::dtype_safetensors_name(t), &parsed));
    EXPECT_EQ(parsed, t);
  }
  EXPECT_EQ(fd::dtype_from_name("float32"), DType::F32);
  EXPECT_EQ(fd::dtype_from_name("float16"), DType::F16);
  EXPECT_EQ(fd::dtype_from_name("bfloat16"), DType::BF16);
  EXPECT_EQ(fd::dtype_name(DType::BF16), "bf16");
  EXPECT_EQ(fd::dtype_safetensors_name(DType::F16), "F16");
  EXPECT_EQ(fd::dtype_size(DType::F32), 4u);
  EXPECT_EQ(fd::dtype_size(DType::F16), 2u);
  EXPECT_EQ(fd::dtype_size(DType::BF16), 2u);
}

TEST(DTypeNames, BadNames) {
  try {
    fd::dtype_from_name("fp8");
    ADD_FAILURE() << "expected fd::Error";
  } catch (const fd::Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("fp8"));
  }
  EXPECT_THROW(fd::dtype_from_name("F16"), fd::Error);  // safetensors spelling is not a CLI name
  EXPECT_THROW(fd::dtype_from_name(""), fd::Error);
  DType out = DType::F32;
  for (const char* bad : {"I64", "F8_E4M3", "f16", "F64", "", "BF16 "})
    EXPECT_FALSE(fd::dtype_from_safetensors_name(bad, &out)) << bad;
}

}  // namespace
