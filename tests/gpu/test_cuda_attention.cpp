// CUDA attention kernels (kernels/cuda/attention.h) vs the golden CPU reference fd::ref_decode_attention fed
// the same fp16-rounded K/V: decode (MHA and GQA, mixed lengths, permuted slots, split and unsplit
// sequences), causal prefill over packed sequences, the KV append (append_kv, and qkv_post writing k/v into the
// cache as append_kv stores them), the 16-bit decode output (the fp32 one rounded); bandwidth / throughput printed, never
// asserted. Skips when no CUDA device answers (label gpu); without CUDA in the build it is empty.
#include <gtest/gtest.h>

#ifdef FD_HAVE_CUDA
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <ostream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "fastdecode/core/dtype.h"
#include "fastdecode/core/error.h"
#include "fastdecode/model/model_config.h"
#include "fastdecode/model/reference.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/qkv.h"
#include "tests/gpu/require_gpu.h"
#include "tests/gpu/cuda_test_util.h"

namespace {

using fd::test::Dev;

fd::ModelConfig attn_config(int Hq, int Hkv, int D) {
  fd::ModelConfig c;
  c.num_heads = Hq;
  c.num_kv_heads = Hkv;
  c.head_dim = D;
  c.hidden_size = int64_t(Hq) * D;
  return c;
}

uint16_t f16(float x) { return fd::fp32_to_fp16(x); }
float f32(uint16_t h) { return fd::fp16_to_fp32(h); }
constexpr uint16_t kF16NaN = 0x7E00;

std::vector<float> uniform(size_t n, float scale, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// max |got - ref| and max |ref|; the check is err <= 1e-4 * (1 + max|ref|). Both sides accumulate in fp32
// over at most ~2k terms of |p * v| <= 1 (the reference sums its softmax denominator in double), so the
// expected difference is ~1e-6: 1e-4 leaves two orders of margin and still catches a wrong row or head.
struct Err {
  double err = 0, ref_max = 0;
  bool ok() const { return err <= 1e-4 * (1.0 + ref_max); }
};
Err compare(const std::vector<float>& got, const std::vector<float>& ref) {
  Err e;
  for (size_t i = 0; i < ref.size(); ++i) {
    e.ref_max = std::max(e.ref_max, std::fabs(double(ref[i])));
    const double d = std::fabs(double(got[i]) - double(ref[i]));
    if (!(d <= e.err)) e.err = std::isnan(d) ? INFINITY : d;  // NaN counts as an infinite error
  }
  return e;
}

struct Shape {
  int Hq, Hkv, D;
};
void PrintTo(const Shape& s, std::ostream* os) { *os << "Hq=" << s.Hq << " Hkv=" << s.Hkv << " D=" << s.D; }
std::string shape_name(const ::testing::TestParamInfo<Shape>& i) {
  return "Hq" + std::to_string(i.param.Hq) + "_Hkv" + std::to_string(i.param.Hkv) + "_D" + std::to_string(i.param.D);
}

// Decode over a KV-cache of n_slots slots: sequence b uses slot slots[b] and lens[b] positions; every other
// cache entry is NaN, so a read outside the sequence shows in the output. Compared with the reference.
void check_decode(const Shape& sh, const std::vector<int32_t>& lens, const std::vector<int32_t>& slots, int n_slots,
                  int64_t max_ctx, uint32_t seed) {
  const int Hq = sh.Hq, Hkv = sh.Hkv, D = sh.D;
  const int64_t B = int64_t(lens.size()), kvd = int64_t(Hkv) * D, qd = int64_t(Hq) * D;
  std::mt19937 rng(seed);
  std::vector<uint16_t> kc(size_t(n_slots * max_ctx * kvd), kF16NaN), vc(kc.size(), kF16NaN);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < lens[size_t(b)] * kvd; ++i) {
      const size_t at = size_t(slots[size_t(b)] * max_ctx * kvd + i);
      kc[at] = f16(std::uniform_real_distribution<float>(-1, 1)(rng));
      vc[at] = f16(std::uniform_real_distribution<float>(-1, 1)(rng));
    }
  const std::vector<float> q = uniform(size_t(B * qd), 4.0f, rng);  // scores of a few units: peaked softmax

  Dev<float> dq(q), dout(size_t(B * qd));
  Dev<__half> dk(kc), dv(vc);
  Dev<int32_t> dslots(slots), dlens(lens);
  dout.fill_bytes(0xFF);  // NaN: every output must be written
  const size_t ws_n = fd::cuda::decode_attention_workspace_floats(B, Hq, D, max_ctx);
  Dev<float> ws(ws_n);
  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreate(&st));
  fd::cuda::decode_attention({.q = dq.get(),
                              .k_cache = dk.get(),
                              .v_cache = dv.get(),
                              .slots = dslots.get(),
                              .lens = dlens.get(),
                              .B = B,
                              .max_ctx = max_ctx,
                              .Hq = Hq,
                              .Hkv = Hkv,
                              .D = D,
                              .out = dout.get(),
                              .workspace = ws_n ? ws.get() : nullptr},
                             st);
  CUDA_CHECK(cudaStreamSynchronize(st));
  const std::vector<float> got = dout.download<float>();
  // The 16-bit output (out_act, no fp32 out): every element as the fp32 output rounded to nearest even.
  for (const fd::DType dt : {fd::DType::F16, fd::DType::BF16}) {
    Dev<uint16_t> d16(size_t(B * qd));
    d16.fill_bytes(0xFF);
    fd::cuda::decode_attention({.q = dq.get(), .k_cache = dk.get(), .v_cache = dv.get(), .slots = dslots.get(),
                                .lens = dlens.get(), .B = B, .max_ctx = max_ctx, .Hq = Hq, .Hkv = Hkv, .D = D,
                                .workspace = ws_n ? ws.get() : nullptr, .out_act = d16.get(), .out_dtype = dt},
                               st);
    CUDA_CHECK(cudaStreamSynchronize(st));
    const std::vector<uint16_t> h = d16.download();
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < h.size(); ++i) {
      const uint16_t want = dt == fd::DType::F16 ? fd::fp32_to_fp16(got[i]) : fd::fp32_to_bf16(got[i]);
      if (h[i] != want && bad++ == 0) first = i;
    }
    EXPECT_EQ(bad, 0u) << fd::dtype_name(dt) << " output: " << bad << " elements differ from the fp32 output rounded, "
                       << "first at " << first << " (" << h[first] << " against fp32 " << got[first] << ")";
  }
  cudaStreamDestroy(st);

  const fd::ModelConfig cfg = attn_config(Hq, Hkv, D);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = lens[size_t(b)];
    if (n == 0) {  // nothing to attend to: zeros
      for (int64_t i = 0; i < qd; ++i) EXPECT_EQ(got[size_t(b * qd + i)], 0.0f) << "sequence " << b << " (len 0)";
      continue;
    }
    std::vector<float> kf(size_t(n * kvd)), vf(kf.size()), ref(static_cast<size_t>(qd));
    const size_t base = size_t(slots[size_t(b)] * max_ctx * kvd);
    for (size_t i = 0; i < kf.size(); ++i) kf[i] = f32(kc[base + i]), vf[i] = f32(vc[base + i]);
    fd::ref_decode_attention(&q[size_t(b * qd)], kf.data(), vf.data(), n, cfg, ref.data());
    const std::vector<float> g(got.begin() + b * qd, got.begin() + (b + 1) * qd);
    const Err e = compare(g, ref);
    EXPECT_TRUE(e.ok()) << "sequence " << b << " (len " << n << ", slot " << slots[size_t(b)] << "): max abs err "
                        << e.err << ", max |ref| " << e.ref_max;
  }
}

class CudaDecodeAttention : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    FD_SKIP_WITHOUT_GPU();
  }
};

class CudaDecodeAttentionLargeBatch : public CudaDecodeAttention {};

class CudaPrefillAttention : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override {
    FD_SKIP_WITHOUT_GPU();
  }
};

}  // namespace

// Lengths around the chunk boundaries (64 rows per split at this batch size: 255 = 4 splits, 1 = one
// unsplit block) in one batch, slots reversed with two unused slots, max_ctx above every length.
TEST_P(CudaDecodeAttention, MatchesReference) {
  const std::vector<int32_t> lens = {1, 2, 255, 256, 257, 1000};
  std::vector<int32_t> slots(lens.size());
  const int n_slots = 8;
  for (size_t b = 0; b < slots.size(); ++b) slots[b] = int32_t(n_slots - 1 - int(b));
  check_decode(GetParam(), lens, slots, n_slots, 1100, 1234);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaDecodeAttention,
                         ::testing::Values(Shape{8, 8, 64}, Shape{8, 8, 128}, Shape{16, 4, 128}, Shape{32, 4, 64},
                                           Shape{16, 2, 128}, Shape{12, 4, 96}, Shape{16, 1, 64}, Shape{4, 4, 256},
                                           Shape{4, 2, 32}),
                         shape_name);

// A bigger batch (the split plan picks larger chunks: 64 rows x 16 splits for GQA, 256 x 4 for MHA here),
// random lengths 1..max_ctx and a random slot permutation.
TEST_P(CudaDecodeAttentionLargeBatch, MatchesReference) {
  const int B = 32;
  const int64_t max_ctx = 1024;
  std::mt19937 rng(77);
  std::vector<int32_t> lens(B), slots(B);
  for (auto& l : lens) l = std::uniform_int_distribution<int32_t>(1, int32_t(max_ctx))(rng);
  lens[0] = int32_t(max_ctx);
  lens[1] = 512;
  lens[2] = 513;
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  check_decode(GetParam(), lens, slots, B, max_ctx, 99);
}

// A long cache with few sequences: the split count is capped (32), so a split reads ceil(len / 32) rows
// (125 and 79 here, not a multiple of anything); a zero length gives zeros.
TEST(CudaAttention, DecodeLongContextMatchesReference) {
  FD_SKIP_WITHOUT_GPU();
  check_decode(Shape{8, 2, 128}, {4000, 0, 2500}, {1, 2, 0}, 3, 4096, 2024);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaDecodeAttentionLargeBatch, ::testing::Values(Shape{32, 8, 128}, Shape{32, 32, 128}),
                         shape_name);

// Three sequences of 1, 70 and 130 tokens packed in one batch: every row against the reference over its
// sequence's rows 0..t (fp16-rounded K/V).
TEST_P(CudaPrefillAttention, MatchesReference) {
  const int Hq = GetParam().Hq, Hkv = GetParam().Hkv, D = GetParam().D;
  const std::vector<int32_t> starts = {0, 1, 71, 201};
  const int64_t T = starts.back(), qd = int64_t(Hq) * D, kvd = int64_t(Hkv) * D, max_len = 130;
  std::mt19937 rng(4321);
  const std::vector<float> q = uniform(size_t(T * qd), 4.0f, rng);
  std::vector<uint16_t> k16(size_t(T * kvd)), v16(k16.size());
  for (size_t i = 0; i < k16.size(); ++i) {
    k16[i] = f16(std::uniform_real_distribution<float>(-1, 1)(rng));
    v16[i] = f16(std::uniform_real_distribution<float>(-1, 1)(rng));
  }
  Dev<float> dq(q), dout(size_t(T * qd));
  Dev<__half> dk(k16), dv(v16);
  Dev<int32_t> dstarts(starts);
  dout.fill_bytes(0xFF);
  fd::cuda::prefill_attention({.q = dq.get(),
                               .k = dk.get(),
                               .v = dv.get(),
                               .starts = dstarts.get(),
                               .n_seq = int64_t(starts.size()) - 1,
                               .max_len = max_len,
                               .Hq = Hq,
                               .Hkv = Hkv,
                               .D = D,
                               .out = dout.get()},
                              nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> got = dout.download<float>();

  std::vector<float> kf(k16.size()), vf(v16.size()), ref(size_t(T * qd));
  for (size_t i = 0; i < kf.size(); ++i) kf[i] = f32(k16[i]), vf[i] = f32(v16[i]);
  const fd::ModelConfig cfg = attn_config(Hq, Hkv, D);
  for (size_t s = 0; s + 1 < starts.size(); ++s)
    for (int64_t t = starts[s]; t < starts[s + 1]; ++t)
      fd::ref_decode_attention(&q[size_t(t * qd)], &kf[size_t(starts[s] * kvd)], &vf[size_t(starts[s] * kvd)],
                               t - starts[s] + 1, cfg, &ref[size_t(t * qd)]);
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<float> g(got.begin() + t * qd, got.begin() + (t + 1) * qd);
    const std::vector<float> r(ref.begin() + t * qd, ref.begin() + (t + 1) * qd);
    const Err e = compare(g, r);
    EXPECT_TRUE(e.ok()) << "row " << t << ": max abs err " << e.err << ", max |ref| " << e.ref_max;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaPrefillAttention,
                         ::testing::Values(Shape{4, 4, 64}, Shape{8, 2, 128}, Shape{8, 1, 64}, Shape{6, 2, 96},
                                           Shape{2, 2, 256}, Shape{4, 1, 32}),
                         shape_name);

// Rows stored at (slot, pos) as fp16 bit-exactly (round to nearest even, overflow to inf, subnormals), every
// other cache entry untouched.
TEST(CudaAttention, AppendKvRoundTrip) {
  FD_SKIP_WITHOUT_GPU();
  const int kv_dim = 2 * 64, n_slots = 4;
  const int64_t max_ctx = 16;
  const std::vector<int32_t> slots = {2, 0, 3, 2, 1, 0, 3}, pos = {0, 5, 15, 1, 7, 0, 2};
  const int64_t T = int64_t(slots.size());
  std::mt19937 rng(5);
  std::vector<float> k = uniform(size_t(T * kv_dim), 3.0f, rng), v = uniform(k.size(), 3.0f, rng);
  k[0] = 70000.0f;   // overflows fp16
  k[1] = -1e-6f;     // fp16 subnormal
  v[2] = 65519.0f;   // rounds down to 65504
  v[3] = 1.0f + 1.0f / 2048;  // a tie: to even (1.0)
  Dev<float> dk(k), dv(v);
  Dev<int32_t> ds(slots), dp(pos);
  const size_t cache_n = size_t(n_slots * max_ctx * kv_dim);
  Dev<__half> kc(cache_n), vc(cache_n);
  kc.fill_bytes(0xAB);
  vc.fill_bytes(0xAB);
  fd::cuda::append_kv({.k = dk.get(),
                       .v = dv.get(),
                       .slots = ds.get(),
                       .pos = dp.get(),
                       .T = T,
                       .max_ctx = max_ctx,
                       .kv_dim = kv_dim,
                       .k_cache = kc.get(),
                       .v_cache = vc.get()},
                      nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> hk = kc.download<uint16_t>(), hv = vc.download<uint16_t>();
  std::vector<uint16_t> ek(cache_n, 0xABAB), ev(cache_n, 0xABAB);
  for (int64_t t = 0; t < T; ++t)
    for (int i = 0; i < kv_dim; ++i) {
      const size_t at = size_t((slots[size_t(t)] * max_ctx + pos[size_t(t)]) * kv_dim + i);
      ek[at] = f16(k[size_t(t * kv_dim + i)]);
      ev[at] = f16(v[size_t(t * kv_dim + i)]);
    }
  size_t bad = 0;
  for (size_t i = 0; i < cache_n; ++i) bad += (hk[i] != ek[i]) + (hv[i] != ev[i]);
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(hk[size_t((2 * max_ctx + 0) * kv_dim)], 0x7C00);  // +inf
}

class CudaQkvIntoCache : public ::testing::TestWithParam<fd::DType> {
 protected:
  void SetUp() override { FD_SKIP_WITHOUT_GPU(); }
};

// qkv_post with the caches as k16 / v16 (QkvPostParams::slots) stores exactly what qkv_post's fp32 k and v, put
// there by append_kv, store (GQA, bias, RoPE, permuted slots); every other cache entry untouched; q the same.
TEST_P(CudaQkvIntoCache, IsAppendKvOfItsFp32Outputs) {
  const fd::DType t = GetParam();
  const int64_t Hq = 8, Hkv = 2, D = 64, kv_dim = Hkv * D, max_ctx = 16, n_slots = 4;
  const std::vector<int32_t> slots = {2, 0, 3, 1, 2};
  const std::vector<int64_t> pos = {0, 5, 15, 7, 9};
  const std::vector<int32_t> pos32(pos.begin(), pos.end());
  const int64_t T = int64_t(slots.size()), ld = (Hq + 2 * Hkv) * D;
  std::mt19937 rng(11);
  const std::vector<float> qkv32 = uniform(size_t(T * ld), 2.0f, rng);
  std::vector<uint16_t> qkv(qkv32.size());
  fd::convert_from_f32(t, qkv32.data(), qkv.data(), qkv.size());
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

INSTANTIATE_TEST_SUITE_P(Types, CudaQkvIntoCache, ::testing::Values(fd::DType::F16, fd::DType::BF16),
                         [](const auto& info) { return info.param == fd::DType::F16 ? "fp16" : "bf16"; });

TEST(CudaAttention, RejectsUnsupportedShapes) {
  FD_SKIP_WITHOUT_GPU();
  // Shape checks come before any launch: null pointers never reach the device.
  const fd::cuda::DecodeAttentionParams dec{.B = 1, .max_ctx = 16, .Hq = 4, .Hkv = 4, .D = 64};
  const auto decode_with = [&](auto edit) {
    fd::cuda::DecodeAttentionParams p = dec;
    edit(p);
    fd::cuda::decode_attention(p, nullptr);
  };
  EXPECT_THROW(decode_with([](auto& p) { p.Hq = 6; }), fd::Error);        // Hq not a multiple of Hkv
  EXPECT_THROW(decode_with([](auto& p) { p.D = 48; }), fd::Error);        // D not a multiple of 32
  EXPECT_THROW(decode_with([](auto& p) { p.max_ctx = 4096; }), fd::Error);  // a split plan without a workspace
  EXPECT_THROW(fd::cuda::prefill_attention({.n_seq = 1, .max_len = 16, .Hq = 4, .Hkv = 4, .D = 288}, nullptr),
               fd::Error);  // D > 256
  EXPECT_EQ(fd::cuda::decode_attention_workspace_floats(4, 8, 64, 64), 0u);  // one split: no workspace
}

// Speed of these kernels: fd-kernel-bench (decode, prefill), not a test.

#endif  // FD_HAVE_CUDA
