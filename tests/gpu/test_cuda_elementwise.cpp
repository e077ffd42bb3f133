// The CUDA S-Part's small kernels against host twins: RMSNorm and LayerNorm (rows held in registers, every
// width up to the largest allowed; the bias stored back; the rows gathered as the LM head reads them), the
// embedding (the 16-byte path and the scalar one, learned positions, a tensor rank's vocabulary slice) and a
// graph step's inputs (cuda::step_inputs: fed tokens and widened positions); the benchmarks' operand fill
// (cuda::fill_uniform16: the same bits as its host twin); bias + RoPE + split (cuda::qkv_post) at head sizes of
// both its access widths; the MLP activations (cuda::silu_mul on both its paths, cuda::relu_bias). Skips when no CUDA device answers
// (label gpu); without CUDA in the build it is empty.
#include <gtest/gtest.h>

#ifdef FD_HAVE_CUDA
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fastdecode/core/dtype.h"
#include "fastdecode/core/error.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/ceilings.h"
#include "kernels/cuda/embed.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/qkv.h"
#include "kernels/cuda/sampling.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/gpu/require_gpu.h"

namespace {

using fd::DType;
using fd::test::Dev;

std::vector<float> uniform(size_t n, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

float to_f32(uint16_t h, DType dt) { return dt == DType::F16 ? fd::fp16_to_fp32(h) : fd::bf16_to_fp32(h); }
uint16_t to_16(float f, DType dt) { return dt == DType::F16 ? fd::fp32_to_fp16(f) : fd::fp32_to_bf16(f); }

// One norm call: x [rows_in, n] (rows: output row t reads x[rows[t]]), against the host twin in double.
// The output is 16-bit: within one rounding of the type (relative 2^-11 fp16, 2^-8 bf16), doubled for the fp32
// arithmetic before it. With a bias, x + bias must be stored back exactly as the host sums it in fp32. With store
// (LayerNorm only), x must hold the normalized rows in fp32 after: within 1e-5 relative of the double twin.
void check_norm(bool rms, DType dt, int64_t n, int64_t rows_in, const std::vector<int32_t>& rows, bool bias,
                uint32_t seed, bool store = false) {
  std::mt19937 rng(seed);
  const int64_t T = rows.empty() ? rows_in : int64_t(rows.size());
  std::vector<float> x = uniform(size_t(rows_in * n), -3, 3, rng), w = uniform(size_t(n), 0.5f, 1.5f, rng),
                     b = uniform(size_t(n), -0.5f, 0.5f, rng), add = uniform(size_t(n), -1, 1, rng);
  Dev<float> dx(x), dw(w), db(b), dadd(add);
  Dev<int32_t> drows(rows.empty() ? std::vector<int32_t>{0} : rows);
  Dev<uint16_t> out(size_t(T * n));
  out.fill_bytes(0xFF);
  const int32_t* rp = rows.empty() ? nullptr : drows.get();
  if (rms) fd::cuda::rmsnorm(dx.get(), bias ? dadd.get() : nullptr, dw.get(), 1e-5f, T, n, out.get(), dt, nullptr, rp);
  else
    fd::cuda::layernorm(dx.get(), bias ? dadd.get() : nullptr, dw.get(), db.get(), 1e-5f, T, n, out.get(), dt, nullptr,
                        rp, store);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = out.download();
  const std::vector<float> xs = dx.download();
  if (bias)
    for (int64_t i = 0; i < rows_in * n; ++i) x[size_t(i)] += add[size_t(i % n)];
  size_t stored_bad = 0;
  if (!store)
    for (size_t i = 0; i < x.size(); ++i) stored_bad += xs[i] != x[i];
  EXPECT_EQ(stored_bad, 0u) << "x as stored back (bias " << bias << ")";
  const double tol = dt == DType::F16 ? 2 * std::ldexp(1.0, -11) : 2 * std::ldexp(1.0, -8);
  size_t bad = 0, store_bad = 0;
  std::string first;
  for (int64_t t = 0; t < T; ++t) {
    const float* r = &x[size_t((rows.empty() ? t : rows[size_t(t)]) * n)];
    double mean = 0, ss = 0;
    for (int64_t i = 0; i < n; ++i) mean += r[i], ss += double(r[i]) * r[i];
    mean /= double(n);
    double var = 0;
    for (int64_t i = 0; i < n; ++i) var += (r[i] - mean) * (r[i] - mean);
    const double inv = rms ? 1 / std::sqrt(ss / double(n) + 1e-5) : 1 / std::sqrt(var / double(n) + 1e-5);
    for (int64_t i = 0; i < n; ++i) {
      const double ref = rms ? w[size_t(i)] * (r[i] * inv) : (r[i] - mean) * inv * w[size_t(i)] + b[size_t(i)];
      const double g = to_f32(got[size_t(t * n + i)], dt);
      if (store) store_bad += !(std::fabs(double(xs[size_t(t * n + i)]) - ref) <= 1e-5 * std::fabs(ref) + 1e-6);
      if (!(std::fabs(g - ref) <= tol * std::fabs(ref) + 1e-6) && bad++ == 0)
        first = "row " + std::to_string(t) + " col " + std::to_string(i) + ": " + std::to_string(g) + " against " +
                std::to_string(ref);
    }
  }
  EXPECT_EQ(bad, 0u) << (rms ? "rmsnorm" : "layernorm") << " " << fd::dtype_name(dt) << " n=" << n << " T=" << T
                     << (rows.empty() ? "" : " gathered") << (bias ? " +bias" : "") << ": " << bad
                     << " elements off, first " << first;
  EXPECT_EQ(store_bad, 0u) << "layernorm " << fd::dtype_name(dt) << " n=" << n << ": normalized rows stored into x";
}

class CudaElementwise : public ::testing::Test {
 protected:
  void SetUp() override { FD_SKIP_WITHOUT_GPU(); }
};

}  // namespace

// Widths: a handful of float4s (most threads idle), Llama's 4096 (256 threads, four float4s each), OPT-66B's
// 9216 (more threads than 256), the largest allowed 16384 (1024 threads); 16-bit outputs of both types.
TEST_F(CudaElementwise, NormsMatchTheHostTwin) {
  uint32_t seed = 1;
  for (const bool rms : {true, false})
    for (const DType dt : {DType::F16, DType::BF16})
      for (const int64_t n : {int64_t(36), int64_t(4096), int64_t(9216), int64_t(16384)}) {
        check_norm(rms, dt, n, 5, {}, false, seed++);
        check_norm(rms, dt, n, 3, {}, true, seed++);
      }
}

// Post-LayerNorm OPT: the LayerNorm stores its normalized rows back into the fp32 residual (with and without the
// o-projection's bias added first).
TEST_F(CudaElementwise, LayerNormStoresTheNormalizedRows) {
  uint32_t seed = 40;
  for (const DType dt : {DType::F16, DType::BF16})
    for (const int64_t n : {int64_t(36), int64_t(1024), int64_t(9216)}) {
      check_norm(false, dt, n, 5, {}, false, seed++, true);
      check_norm(false, dt, n, 3, {}, true, seed++, true);
    }
}

// Post-LayerNorm OPT's final hidden (no final norm): rows gathered and cast to 16 bits, round to nearest even.
TEST_F(CudaElementwise, RowsToActGatherAndCast) {
  std::mt19937 rng(41);
  for (const DType dt : {DType::F16, DType::BF16}) {
    const int64_t n = 100, rows_in = 6;
    const std::vector<float> x = uniform(size_t(rows_in * n), -4, 4, rng);
    const std::vector<int32_t> rows = {5, 0, 0, 3};
    Dev<float> dx(x);
    Dev<int32_t> dr(rows);
    for (const bool gather : {true, false}) {
      const int64_t T = gather ? int64_t(rows.size()) : rows_in;
      Dev<uint16_t> out(size_t(T * n));
      out.fill_bytes(0xFF);
      fd::cuda::rows_to_act(dx.get(), gather ? dr.get() : nullptr, T, n, out.get(), dt, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<uint16_t> got = out.download();
      size_t bad = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < n; ++i)
          bad += got[size_t(t * n + i)] != to_16(x[size_t((gather ? rows[size_t(t)] : t) * n + i)], dt);
      EXPECT_EQ(bad, 0u) << fd::dtype_name(dt) << (gather ? " gathered" : "");
    }
  }
}

// The LM head's rows gathered by the norm: repeated and permuted sources, fewer outputs than rows.
TEST_F(CudaElementwise, NormsGatherTheirRows) {
  for (const bool rms : {true, false}) {
    check_norm(rms, DType::F16, 4096, 6, {5, 0, 0, 3}, false, 11);
    check_norm(rms, DType::BF16, 9216, 3, {2, 1}, false, 12);
  }
}

TEST_F(CudaElementwise, NormsRefuseWhatTheyCannotDo) {
  Dev<float> x(16388), w(16388);
  Dev<uint16_t> out(16388);
  Dev<int32_t> rows(1);
  EXPECT_THROW(fd::cuda::rmsnorm(x.get(), nullptr, w.get(), 1e-5f, 1, 16388, out.get(), DType::F16, nullptr),
               fd::Error);  // wider than 16384
  EXPECT_THROW(fd::cuda::rmsnorm(x.get(), nullptr, w.get(), 1e-5f, 1, 18, out.get(), DType::F16, nullptr),
               fd::Error);  // not a multiple of 4
  EXPECT_THROW(fd::cuda::layernorm(x.get(), w.get(), w.get(), w.get(), 1e-5f, 1, 64, out.get(), DType::F16, nullptr,
                                   rows.get()),
               fd::Error);  // a bias stored back into gathered rows
  EXPECT_THROW(fd::cuda::layernorm(x.get(), nullptr, w.get(), w.get(), 1e-5f, 1, 64, out.get(), DType::F16, nullptr,
                                   rows.get(), true),
               fd::Error);  // normalized rows stored back into gathered rows
}

// The embedding exactly as the host sums it: the 16-byte path (H % 8 == 0) and the scalar one, with learned
// positions (OPT) and a tensor rank's slice of the vocabulary (tokens outside it embed as 0).
TEST_F(CudaElementwise, EmbeddingMatchesTheHostTwin) {
  std::mt19937 rng(5);
  for (const DType dt : {DType::F16, DType::BF16})
    for (const int64_t H : {int64_t(4096), int64_t(100), int64_t(8)})
      for (const int positions_mode : {0, 1, 2})  // 0: none, 1: with positions, 2: positions alone (no table)
        for (const bool slice : {false, true}) {
          const bool positions = positions_mode > 0, no_table = positions_mode == 2;
          const int64_t V = 50, P = 40, off = 2, v0 = slice ? 10 : 0, v1 = slice ? 30 : V;
          std::vector<uint16_t> table(size_t((v1 - v0) * H)), pt(size_t(P * H));
          for (auto& e : table) e = to_16(std::uniform_real_distribution<float>(-2, 2)(rng), dt);
          for (auto& e : pt) e = to_16(std::uniform_real_distribution<float>(-2, 2)(rng), dt);
          const std::vector<int32_t> tokens = {12, 0, 29, 49, 12, 10};
          const std::vector<int64_t> pos = {0, 5, 37, 1, 2, 3};
          const int64_t T = int64_t(tokens.size());
          Dev<uint16_t> dt_(table), dp(pt);
          Dev<int32_t> dtok(tokens);
          Dev<int64_t> dpos(pos);
          Dev<float> x(size_t(T * H));
          x.fill_bytes(0xFF);
          fd::cuda::embed(dtok.get(), dpos.get(), no_table ? nullptr : dt_.get(), positions ? dp.get() : nullptr, dt,
                          off, T, H, x.get(), nullptr, v0, v1);
          CUDA_CHECK(cudaDeviceSynchronize());
          const std::vector<float> got = x.download();
          size_t bad = 0;
          for (int64_t t = 0; t < T; ++t)
            for (int64_t i = 0; i < H; ++i) {
              const int64_t tok = tokens[size_t(t)];
              const float e = !no_table && tok >= v0 && tok < v1 ? to_f32(table[size_t((tok - v0) * H + i)], dt) : 0.0f;
              const float p = positions ? to_f32(pt[size_t((pos[size_t(t)] + off) * H + i)], dt) : 0.0f;
              bad += got[size_t(t * H + i)] != e + p;
            }
          EXPECT_EQ(bad, 0u) << fd::dtype_name(dt) << " H=" << H << " positions " << positions_mode << " slice " << slice;
        }
}

// A graph step's inputs: fed rows take the step before's pick (any row of it), the others their own token;
// positions widened to int64; the whole of a padded batch written.
TEST_F(CudaElementwise, StepInputsFeedPicksAndWidenPositions) {
  const int64_t n = 300;  // more than one block of 256
  std::vector<int32_t> in(static_cast<size_t>(5 * n)), picks(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    in[size_t(2 * n + i)] = int32_t(1000 + i);                         // tokens
    in[size_t(3 * n + i)] = i % 3 == 0 ? int32_t((i * 7) % n) : -1;   // feed
    in[size_t(4 * n + i)] = int32_t(100000 + i);                      // positions
    picks[size_t(i)] = int32_t(50000 + i);
  }
  Dev<int32_t> din(in), dpicks(picks), tokens(static_cast<size_t>(n));
  Dev<int64_t> pos(static_cast<size_t>(n));
  tokens.fill_bytes(0xFF), pos.fill_bytes(0xFF);
  fd::cuda::step_inputs(din.get(), n, dpicks.get(), tokens.get(), pos.get(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<int32_t> t = tokens.download();
  const std::vector<int64_t> p = pos.download();
  for (int64_t i = 0; i < n; ++i) {
    const int32_t feed = in[size_t(3 * n + i)];
    ASSERT_EQ(t[size_t(i)], feed >= 0 ? picks[size_t(feed)] : in[size_t(2 * n + i)]) << "row " << i;
    ASSERT_EQ(p[size_t(i)], 100000 + i) << "row " << i;
  }
}

// qkv_post against a host twin in double: 16-byte items (D % 16 == 0: 64, 96, 128) and 8-byte ones (8, 24), GQA,
// bias or none, RoPE (positions to 5000, a rope_scale) or none (OPT); the fp32 outputs within float rounding of the
// twin, the fp16 ones the fp32 ones rounded (bit for bit); rows over several blocks.
TEST_F(CudaElementwise, QkvPostMatchesTheHostTwin) {
  struct Shape {
    int64_t Hq, Hkv, D;
    bool bias, rope;
  };
  const Shape shapes[] = {{4, 2, 8, true, true}, {3, 1, 24, false, true}, {8, 2, 64, true, true},
                          {12, 4, 96, false, true}, {32, 8, 128, false, true}, {32, 32, 128, true, false}};
  std::mt19937 rng(5);
  for (const DType dt : {DType::F16, DType::BF16})
    for (const Shape& sh : shapes) {
      const int64_t T = 37, D = sh.D, hd = D / 2, heads = sh.Hq + 2 * sh.Hkv, ld = heads * D;
      std::vector<uint16_t> qkv(static_cast<size_t>(T * ld));
      for (auto& x : qkv) x = to_16(std::uniform_real_distribution<float>(-2, 2)(rng), dt);
      const std::vector<float> bias = uniform(size_t(ld), -0.5f, 0.5f, rng);
      std::vector<float> inv(static_cast<size_t>(hd));
      for (int64_t i = 0; i < hd; ++i) inv[size_t(i)] = float(std::pow(10000.0, -2.0 * double(i) / double(D)));
      std::vector<int64_t> pos(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = (t * 137) % 5000;
      const float scale = 1.25f;
      Dev<uint16_t> dqkv(qkv);
      Dev<float> dbias(bias), dinv(inv), q(size_t(T * sh.Hq * D)), k(size_t(T * sh.Hkv * D)), v(size_t(T * sh.Hkv * D));
      Dev<__half> q16(size_t(T * sh.Hq * D)), k16(size_t(T * sh.Hkv * D)), v16(size_t(T * sh.Hkv * D));
      Dev<int64_t> dpos(pos);
      fd::cuda::qkv_post({.qkv = dqkv.get(), .dtype = dt, .bias = sh.bias ? dbias.get() : nullptr, .pos = dpos.get(),
                          .inv_freq = sh.rope ? dinv.get() : nullptr, .rope_scale = scale, .T = T, .Hq = sh.Hq,
                          .Hkv = sh.Hkv, .D = D, .q = q.get(), .k = k.get(), .v = v.get(), .q16 = q16.get(),
                          .k16 = k16.get(), .v16 = v16.get()},
                         nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> got[3] = {q.download(), k.download(), v.download()};
      const std::vector<uint16_t> got16[3] = {q16.download<uint16_t>(), k16.download<uint16_t>(), v16.download<uint16_t>()};
      size_t bad = 0, bad16 = 0;
      std::string first;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < heads; ++h) {
          const int which = h < sh.Hq ? 0 : h < sh.Hq + sh.Hkv ? 1 : 2;
          const int64_t oh = which == 0 ? h : which == 1 ? h - sh.Hq : h - sh.Hq - sh.Hkv;
          const int64_t width = (which == 0 ? sh.Hq : sh.Hkv) * D;
          for (int64_t i = 0; i < hd; ++i) {
            const int64_t col = h * D + i;
            double a = to_f32(qkv[size_t(t * ld + col)], dt), b = to_f32(qkv[size_t(t * ld + col + hd)], dt);
            if (sh.bias) a += bias[size_t(col)], b += bias[size_t(col + hd)];
            if (sh.rope && which < 2) {
              const double ang = double(float(pos[size_t(t)]) * inv[size_t(i)]);
              const double c = std::cos(ang) * scale, sn = std::sin(ang) * scale, a2 = a * c - b * sn;
              b = b * c + a * sn, a = a2;
            }
            const size_t o = size_t(t * width + oh * D + i);
            for (const auto& [ref, at] : {std::pair{a, o}, std::pair{b, o + size_t(hd)}}) {
              const float g = got[which][at];
              if (std::fabs(g - ref) > 2e-6 * (4.0 + std::fabs(ref))) {
                if (!bad++) first = "t " + std::to_string(t) + " head " + std::to_string(h) + " i " + std::to_string(i) +
                                    ": " + std::to_string(g) + " vs " + std::to_string(ref);
              }
              bad16 += got16[which][at] != fd::fp32_to_fp16(g);
            }
          }
        }
      const std::string what = std::string(fd::dtype_name(dt)) + " Hq " + std::to_string(sh.Hq) + " Hkv " +
                               std::to_string(sh.Hkv) + " D " + std::to_string(D);
      EXPECT_EQ(bad, 0u) << what << ": first " << first;
      EXPECT_EQ(bad16, 0u) << what;
    }
}

// silu(gate) * up and relu(up + bias) against a host twin in double, within two units of the 16-bit type's last
// place: the 8-wide path at Llama-2's n = 11008 (a row's last block partly used) and at a tiny n = 40,
// the scalar path at n = 36 (n % 8 != 0); silu_mul with and without mlp_bias's [gate|up] biases.
TEST_F(CudaElementwise, ActivationsMatchTheHostTwin) {
  std::mt19937 rng(9);
  for (const DType dt : {DType::F16, DType::BF16}) {
    const double ulp2 = dt == DType::F16 ? 0x1p-10 : 0x1p-7;
    for (const auto& [T, n] : {std::pair<int64_t, int64_t>{37, 11008}, {3, 40}, {5, 36}})
    for (const bool with_bias : {false, true}) {
      std::vector<uint16_t> gu(static_cast<size_t>(T * 2 * n));
      for (auto& x : gu) x = to_16(std::uniform_real_distribution<float>(-6, 6)(rng), dt);
      const std::vector<float> gb = uniform(static_cast<size_t>(2 * n), -2.0f, 2.0f, rng);
      Dev<uint16_t> dgu(gu), out(static_cast<size_t>(T * n));
      Dev<float> dgb(gb);
      out.fill_bytes(0xFF);
      fd::cuda::silu_mul(dgu.get(), dt, T, n, out.get(), nullptr, with_bias ? dgb.get() : nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<uint16_t> got = out.download();
      size_t bad = 0;
      std::string first;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < n; ++i) {
          const double g = to_f32(gu[size_t(t * 2 * n + i)], dt) + (with_bias ? gb[size_t(i)] : 0.0f),
                       u = to_f32(gu[size_t(t * 2 * n + n + i)], dt) + (with_bias ? gb[size_t(n + i)] : 0.0f);
          const double ref = g / (1.0 + std::exp(-g)) * u, v = to_f32(got[size_t(t * n + i)], dt);
          if (std::fabs(v - ref) > ulp2 * std::fabs(ref) + 1e-6 && !bad++)
            first = "t " + std::to_string(t) + " i " + std::to_string(i) + ": " + std::to_string(v) + " vs " + std::to_string(ref);
        }
      EXPECT_EQ(bad, 0u) << "silu_mul " << fd::dtype_name(dt) << " T " << T << " n " << n << " bias " << with_bias
                         << ": first " << first;
    }
    const int64_t T = 7, n = 100;
    std::vector<uint16_t> up(static_cast<size_t>(T * n));
    for (auto& x : up) x = to_16(std::uniform_real_distribution<float>(-3, 3)(rng), dt);
    const std::vector<float> bias = uniform(static_cast<size_t>(n), -1.0f, 1.0f, rng);
    Dev<uint16_t> dup(up), out(static_cast<size_t>(T * n));
    Dev<float> dbias(bias);
    fd::cuda::relu_bias(dup.get(), dt, dbias.get(), T, n, out.get(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> got = out.download();
    size_t bad = 0;
    for (int64_t k = 0; k < T * n; ++k)
      bad += got[size_t(k)] != to_16(std::max(to_f32(up[size_t(k)], dt) + bias[size_t(k % n)], 0.0f), dt);
    EXPECT_EQ(bad, 0u) << "relu_bias " << fd::dtype_name(dt);
  }
}

// The benchmarks' GEMM operands (fill_uniform16): bit for bit the host twin's hash, in range, both 16-bit types,
// a length that is no multiple of the grid (the grid-stride loop's tail).
TEST_F(CudaElementwise, UniformFillMatchesItsHostTwin) {
  const size_t n = 1000003;
  for (const DType dt : {DType::F16, DType::BF16}) {
    const float amp = dt == DType::F16 ? 0.05f : 2.0f;
    Dev<uint16_t> d(n);
    fd::cuda::fill_uniform16(d.get(), n, amp, 42, dt == DType::BF16, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> got = d.download();
    size_t bad = 0, neg = 0;
    double sum = 0;
    for (size_t i = 0; i < n; ++i) {
      uint64_t z = 42 * 0x9e3779b97f4a7c15ull + i;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      const float u = float(z >> 40) * 0x1p-24f;
      bad += got[i] != to_16(amp * (2.0f * u - 1.0f), dt);
      const float v = to_f32(got[i], dt);
      ASSERT_LE(std::fabs(v), amp * (1.0f + 0x1p-7f)) << i;  // within the range, up to the 16-bit rounding
      neg += v < 0, sum += v;
    }
    EXPECT_EQ(bad, 0u) << fd::dtype_name(dt);
    EXPECT_NEAR(double(neg) / double(n), 0.5, 0.01) << fd::dtype_name(dt);
    EXPECT_NEAR(sum / double(n), 0.0, 0.01 * amp) << fd::dtype_name(dt);
  }
}

#endif  // FD_HAVE_CUDA
