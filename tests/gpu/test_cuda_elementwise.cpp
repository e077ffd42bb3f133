// The CUDA S-Part's elementwise kernels against host twins: the residual branch that a 16-bit GEMM output leaves
// (kernels/cuda/norm.h: added into x by the next norm, by add_rows, or by the LM head's row gather), and qkv_post
// writing k and v straight into a KV-cache (the GPU-only engine's decode) against its own fp32 outputs stored by
// append_kv. Skips when no CUDA device answers (label gpu); without CUDA in the build it is empty.
#include <gtest/gtest.h>

#ifdef FD_HAVE_CUDA
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <random>
#include <vector>

#include "fastdecode/core/dtype.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/embed.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/qkv.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/gpu/require_gpu.h"

namespace {

using fd::DType;
using fd::test::Dev;

std::vector<float> uniform(size_t n, float scale, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// v rounded to the 16-bit type t: the bits and their value again in fp32.
std::vector<uint16_t> to16(DType t, const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  fd::convert_from_f32(t, v.data(), h.data(), v.size());
  return h;
}
std::vector<float> from16(DType t, const std::vector<uint16_t>& h) {
  std::vector<float> v(h.size());
  fd::convert_to_f32(t, h.data(), v.data(), h.size());
  return v;
}

class CudaResidualBranch : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { FD_SKIP_WITHOUT_GPU(); }
};

// x += rows + bias (fp32, the kernel's order: (x + rows) + bias, so bit-exact), stored back; then the norm of the
// new x in 16 bits, within one rounding of the type. Also with out = add_rows (a GEMM output normalised in place).
TEST_P(CudaResidualBranch, NormsAddItIntoXFirst) {
  const DType t = GetParam();
  const int64_t T = 5, n = 96;
  std::mt19937 rng(7);
  const std::vector<float> x = uniform(size_t(T * n), 2.0f, rng), w = uniform(size_t(n), 1.5f, rng),
                           b = uniform(size_t(n), 0.5f, rng), bias = uniform(size_t(n), 0.25f, rng);
  const std::vector<uint16_t> r16 = to16(t, uniform(size_t(T * n), 1.0f, rng));
  const std::vector<float> r = from16(t, r16);
  std::vector<float> want_x(x.size());
  for (size_t i = 0; i < x.size(); ++i) want_x[i] = (x[i] + r[i]) + bias[i % size_t(n)];
  const double tol = t == DType::F16 ? 1.0 / 1024 : 1.0 / 128;  // one rounding of the output, relative
  for (bool rms : {true, false})
    for (bool in_place : {false, true}) {
      Dev<float> dx(x), dw(w), db(b), dbias(bias);
      Dev<uint16_t> dr(r16), dout(size_t(T * n));
      void* out = in_place ? static_cast<void*>(dr.get()) : static_cast<void*>(dout.get());
      if (rms) fd::cuda::rmsnorm(dx.get(), dr.get(), dbias.get(), dw.get(), 1e-5f, T, n, out, t, nullptr);
      else fd::cuda::layernorm(dx.get(), dr.get(), dbias.get(), dw.get(), db.get(), 1e-5f, T, n, out, t, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(dx.download(), want_x) << (rms ? "rmsnorm" : "layernorm");
      const std::vector<float> got = from16(t, (in_place ? dr : dout).download());
      for (int64_t row = 0; row < T; ++row) {
        const float* xr = &want_x[size_t(row * n)];
        double mean = 0, ss = 0;
        for (int64_t i = 0; i < n; ++i) mean += xr[i];
        mean = rms ? 0.0 : mean / double(n);
        for (int64_t i = 0; i < n; ++i) ss += (xr[i] - mean) * (xr[i] - mean);
        const double inv = 1.0 / std::sqrt(ss / double(n) + 1e-5);
        for (int64_t i = 0; i < n; ++i) {
          const double want = (xr[i] - mean) * inv * w[size_t(i)] + (rms ? 0.0 : b[size_t(i)]);
          EXPECT_NEAR(got[size_t(row * n + i)], want, tol * std::fabs(want) + 1e-5)
              << (rms ? "rmsnorm" : "layernorm") << (in_place ? " in place" : "") << " row " << row << " col " << i;
        }
      }
    }
}

// add_rows (a pipeline hand-off's settle; OPT's down bias): x += rows + bias, bit-exact, with rows alone, bias alone
// and both; the LM head's gather: out[i] = x[rows[i]] + add[rows[i]], x untouched.
TEST_P(CudaResidualBranch, AddRowsAndTheRowGatherAddIt) {
  const DType t = GetParam();
  const int64_t T = 70000, n = 8;  // more rows than a grid dimension holds: the kernel strides over them
  std::mt19937 rng(9);
  const std::vector<float> x = uniform(size_t(T * n), 2.0f, rng), bias = uniform(size_t(n), 0.25f, rng);
  const std::vector<uint16_t> r16 = to16(t, uniform(size_t(T * n), 1.0f, rng));
  const std::vector<float> r = from16(t, r16);
  for (int mode = 0; mode < 3; ++mode) {  // rows + bias, rows alone, bias alone
    const bool with_rows = mode != 2, with_bias = mode != 1;
    Dev<float> dx(x), dbias(bias);
    Dev<uint16_t> dr(r16);
    fd::cuda::add_rows(dx.get(), with_rows ? dr.get() : nullptr, t, with_bias ? dbias.get() : nullptr, T, n, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> got = dx.download();
    size_t bad = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      float want = x[i];
      if (with_rows) want = want + r[i];
      if (with_bias) want = want + bias[i % size_t(n)];
      bad += got[i] != want;
    }
    EXPECT_EQ(bad, 0u) << "mode " << mode;
  }
  const std::vector<int32_t> rows = {69999, 0, 31337, 0};
  Dev<float> dx(x), dout(rows.size() * size_t(n));
  Dev<uint16_t> dr(r16);
  Dev<int32_t> drows(rows);
  fd::cuda::gather_rows(dx.get(), drows.get(), int64_t(rows.size()), n, dout.get(), nullptr, dr.get(), t);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = dout.download();
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t c = 0; c < n; ++c) {
      const size_t at = size_t(rows[i]) * size_t(n) + size_t(c);
      EXPECT_EQ(got[i * size_t(n) + size_t(c)], x[at] + r[at]) << "row " << i << " col " << c;
    }
  EXPECT_EQ(dx.download(), x);  // the gather leaves x as it was
}

INSTANTIATE_TEST_SUITE_P(Types, CudaResidualBranch, ::testing::Values(DType::F16, DType::BF16),
                         [](const auto& info) { return info.param == DType::F16 ? "fp16" : "bf16"; });

class CudaQkvIntoCache : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { FD_SKIP_WITHOUT_GPU(); }
};

// qkv_post with the caches as k16 / v16 (QkvPostParams::slots) stores exactly what qkv_post's fp32 k and v, put
// there by append_kv, store (GQA, bias, RoPE, permuted slots); every other cache entry untouched; q the same.
TEST_P(CudaQkvIntoCache, IsAppendKvOfItsFp32Outputs) {
  const DType t = GetParam();
  const int64_t Hq = 8, Hkv = 2, D = 64, kv_dim = Hkv * D, max_ctx = 16, n_slots = 4;
  const std::vector<int32_t> slots = {2, 0, 3, 1, 2};
  const std::vector<int64_t> pos = {0, 5, 15, 7, 9};
  const std::vector<int32_t> pos32(pos.begin(), pos.end());
  const int64_t T = int64_t(slots.size()), ld = (Hq + 2 * Hkv) * D;
  std::mt19937 rng(11);
  const std::vector<uint16_t> qkv = to16(t, uniform(size_t(T * ld), 2.0f, rng));
  const std::vector<float> bias = uniform(size_t(ld), 0.5f, rng);
  std::vector<float> inv(size_t(D / 2));
  for (int64_t i = 0; i < D / 2; ++i) inv[size_t(i)] = float(std::pow(10000.0, -2.0 * double(i) / double(D)));
  Dev<uint16_t> dqkv(qkv);
  Dev<float> dbias(bias), dinv(inv), q1(size_t(T * Hq * D)), q2(size_t(T * Hq * D)), k(size_t(T * kv_dim)),
      v(size_t(T * kv_dim));
  Dev<int64_t> dpos(pos);
  Dev<int32_t> dslots(slots), dpos32(pos32);
  const size_t cache_n = size_t(n_slots * max_ctx * kv_dim);
  Dev<__half> kc1(cache_n), vc1(cache_n), kc2(cache_n), vc2(cache_n);
  for (auto* c : {&kc1, &vc1, &kc2, &vc2}) c->fill_bytes(0xAB);
  fd::cuda::QkvPostParams p{.qkv = dqkv.get(), .dtype = t, .bias = dbias.get(), .pos = dpos.get(),
                            .inv_freq = dinv.get(), .rope_scale = 1.25f, .T = T, .Hq = Hq, .Hkv = Hkv, .D = D};
  fd::cuda::QkvPostParams ref = p;
  ref.q = q1.get(), ref.k = k.get(), ref.v = v.get();
  fd::cuda::qkv_post(ref, nullptr);
  fd::cuda::append_kv({.k = k.get(), .v = v.get(), .slots = dslots.get(), .pos = dpos32.get(), .T = T,
                       .max_ctx = max_ctx, .kv_dim = int(kv_dim), .k_cache = kc1.get(), .v_cache = vc1.get()},
                      nullptr);
  fd::cuda::QkvPostParams direct = p;
  direct.q = q2.get(), direct.k16 = kc2.get(), direct.v16 = vc2.get(), direct.slots = dslots.get(),
  direct.max_ctx = max_ctx;
  fd::cuda::qkv_post(direct, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(q2.download(), q1.download());
  EXPECT_EQ(kc2.download<uint16_t>(), kc1.download<uint16_t>());
  EXPECT_EQ(vc2.download<uint16_t>(), vc1.download<uint16_t>());
  // The rows written are the ones asked for (not a no-op on both sides): a stored k row differs from the fill.
  const std::vector<uint16_t> hk = kc2.download<uint16_t>();
  size_t written = 0;
  for (uint16_t h : hk) written += h != 0xABAB;
  EXPECT_EQ(written, size_t(T * kv_dim));
}

INSTANTIATE_TEST_SUITE_P(Types, CudaQkvIntoCache, ::testing::Values(DType::F16, DType::BF16),
                         [](const auto& info) { return info.param == DType::F16 ? "fp16" : "bf16"; });

}  // namespace

#endif  // FD_HAVE_CUDA
