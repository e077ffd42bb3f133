// The CUDA S-Part's elementwise kernels against their twins: qkv_post writing k and v straight into a KV-cache (the
// GPU-only engine's decode) against its own fp32 outputs stored by append_kv. Skips when no CUDA device answers
// (label gpu); without CUDA in the build it is empty.
#include <gtest/gtest.h>

#ifdef FD_HAVE_CUDA
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <random>
#include <vector>

#include "fastdecode/core/dtype.h"
#include "kernels/cuda/attention.h"
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

// v rounded to the 16-bit type t.
std::vector<uint16_t> to16(DType t, const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  fd::convert_from_f32(t, v.data(), h.data(), v.size());
  return h;
}

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
