// The R-worker's fp16 <-> fp32 conversions (kernels/cpu/convert.h) against fd::fp16_to_fp32 / fp32_to_fp16, the
// scalar round-to-nearest-even twins: every fp16 value; fp32 values at every rounding boundary (ties, the subnormal
// range, overflow) and random bit patterns; unaligned buffers; the calling thread alone and split over threads; each
// ISA (F16C from AVX2 up) and the scalar path, one case per ISA: an ISA this CPU lacks skips its cases
// (require_isa.h). NaN must stay NaN (its payload may differ).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fastdecode/core/dtype.h"
#include "kernels/cpu/convert.h"
#include "require_isa.h"

using namespace fd;

namespace {

class ConvertIsa : public ::testing::TestWithParam<Isa> {};

bool same(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, 4) == 0;
}

bool same16(uint16_t a, uint16_t b) {
  const bool na = (a & 0x7c00u) == 0x7c00u && (a & 0x3ffu), nb = (b & 0x7c00u) == 0x7c00u && (b & 0x3ffu);
  if (na || nb) return na && nb && (a & 0x8000u) == (b & 0x8000u);
  return a == b;
}

}  // namespace

TEST_P(ConvertIsa, EveryFp16ValueToFp32) {
  const Isa isa = GetParam();
  FD_SKIP_UNLESS_ISA(isa);
  // All 65536 values, at an odd byte offset (unaligned), converted by the calling thread and by 3 threads.
  std::vector<uint8_t> src(2 * 65536 + 1);
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t v = uint16_t(h);
    std::memcpy(&src[1 + 2 * h], &v, 2);
  }
  for (int threads : {1, 3}) {
    std::vector<float> out(65536, -1.0f);
    convert_f16_to_f32(src.data() + 1, out.data(), out.size(), isa, threads);
    size_t bad = 0;
    for (uint32_t h = 0; h < 65536; ++h) bad += !same(out[h], fp16_to_fp32(uint16_t(h)));
    EXPECT_EQ(bad, 0u) << isa_name(isa) << ", " << threads << " thread(s)";
  }
}

TEST_P(ConvertIsa, Fp32ToFp16AtEveryBoundaryAndAtRandom) {
  const Isa isa = GetParam();
  FD_SKIP_UNLESS_ISA(isa);
  std::vector<float> v;
  // Every fp16 value, the midpoints between neighbours (ties: round to even) and one ulp either side of them.
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    const float a = fp16_to_fp32(uint16_t(h)), b = fp16_to_fp32(uint16_t(h + 1));
    const float mid = a + (b - a) / 2;
    for (float x : {a, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) v.push_back(x), v.push_back(-x);
  }
  for (float x : {65504.0f, 65519.99f, 65520.0f, 1e30f, INFINITY, -INFINITY, NAN, 1e-8f, 2.98e-8f, 5.96e-8f})
    v.push_back(x), v.push_back(-x);
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, 4);
    v.push_back(f);
  }
  for (int threads : {1, 4}) {
    std::vector<uint8_t> out(2 * v.size() + 1, 0xAB);
    convert_f32_to_f16(v.data(), out.data() + 1, v.size(), isa, threads);
    size_t bad = 0;
    std::string first;
    for (size_t i = 0; i < v.size(); ++i) {
      uint16_t got;
      std::memcpy(&got, &out[1 + 2 * i], 2);
      if (!same16(got, fp32_to_fp16(v[i])) && bad++ == 0) first = std::to_string(v[i]);
    }
    EXPECT_EQ(bad, 0u) << isa_name(isa) << ", " << threads << " thread(s); first at " << first;
    EXPECT_EQ(out[0], 0xAB);  // nothing written before dst
  }
}

TEST_P(ConvertIsa, EmptyAndTailsAreExact) {
  const Isa isa = GetParam();
  FD_SKIP_UNLESS_ISA(isa);
  // n = 0 writes nothing; lengths that are no multiple of 8 (the vector loops' tails).
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(9), size_t(33)}) {
    std::vector<float> f(n + 1, 1e9f), back(n + 1, 1e9f);
    for (size_t i = 0; i < n; ++i) f[i] = float(i) * 0.37f - 3.0f;
    std::vector<uint16_t> h(n + 1, 0xFFFF);
    convert_f32_to_f16(f.data(), h.data(), n, isa, 2);
    convert_f16_to_f32(h.data(), back.data(), n, isa, 2);
    EXPECT_EQ(h[n], 0xFFFF) << "written past n = " << n;
    EXPECT_EQ(back[n], 1e9f) << "written past n = " << n;
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(back[i], fp16_to_fp32(fp32_to_fp16(f[i]))) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Convert, ConvertIsa, ::testing::Values(Isa::Scalar, Isa::AVX2, Isa::AVX512, Isa::AVX512VNNI),
                         [](const auto& info) { return std::string(isa_name(info.param)); });
