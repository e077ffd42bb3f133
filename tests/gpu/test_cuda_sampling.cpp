// GPU sampling (kernels/cuda/sampling.h) against fd::sample_token on the rows of the host-model test
// (tests/unit/sampling_cases.h: many exact ties, V from 1 to 128256, every kind of top-k cut, top-p 0.05 .. 1,
// temperatures 0.3 .. 2, greedy): tokens identical, or the host's own numbers put the draw / nucleus cut within
// 1e-12 of a boundary (printed). Also counted: differences from the host model (which should only come from the
// device exp's last bit). A CUDA-graph replay, the parameter checks, and one timing line (printed, not asserted).
// Skips when no CUDA device answers (label gpu); without CUDA in the build it is empty.
#include <gtest/gtest.h>

#ifdef FD_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "fastdecode/core/error.h"
#include "fastdecode/core/sampling.h"
#include "kernels/cuda/device_info.h"
#include "tests/gpu/require_gpu.h"
#include "tests/gpu/cuda_test_util.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/sampling_model.h"
#include "tests/unit/sampling_cases.h"

namespace {

using fd::test::Dev;

std::vector<int32_t> run_batch(const fd::test::SamplingBatch& b) {
  const Dev<float> logits(b.logits);
  const Dev<uint64_t> rids(b.request_ids), steps(b.steps);
  Dev<int32_t> out(size_t(b.rows()));
  fd::cuda::sample_rows(logits.get(), b.rows(), b.V, b.p, rids.get(), steps.get(), out.get(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  return out.download();
}

int64_t rows_for(int64_t V) {
  if (V >= 100000) return 2;
  if (V >= 30000) return 4;
  if (V >= 4000) return 8;
  return 16;
}

}  // namespace

TEST(CudaSampling, SameTokensAsHostSampler) {
  FD_SKIP_WITHOUT_GPU();
  const std::vector<int64_t> vocabs = {1, 2, 5, 17, 64, 300, 2048, 2049, 5000, 32000, 128256};
  const auto batches = fd::test::sampling_batches(vocabs, rows_for, 20261202);
  int64_t rows = 0, same = 0, accepted = 0, model_diff = 0;
  for (const auto& b : batches) {
    const std::vector<int32_t> got = run_batch(b);
    for (int64_t r = 0; r < b.rows(); ++r) {
      const float* row = b.row(r);
      const uint64_t rid = b.request_ids[size_t(r)], step = b.steps[size_t(r)];
      const int32_t host = fd::sample_token(row, b.V, b.p, rid, step);
      const int32_t gpu = got[size_t(r)];
      ++rows;
      model_diff += gpu != fd::cuda::sample_row_model(row, b.V, b.p, rid, step);
      if (gpu == host) {
        ++same;
        continue;
      }
      const std::string where = "V " + std::to_string(b.V) + ", T " + std::to_string(b.p.temperature) + ", top_k " +
                                std::to_string(b.p.top_k) + ", top_p " + std::to_string(b.p.top_p) + ", row kind " +
                                fd::test::row_kind_name(b.kinds[size_t(r)]);
      ASSERT_FALSE(b.p.greedy()) << "greedy: gpu " << gpu << " != host " << host << " (" << where << ")";
      const auto why = fd::test::explain_difference(fd::test::host_trace(row, b.V, b.p, rid, step), b.p, gpu);
      ASSERT_TRUE(why.has_value()) << "gpu token " << gpu << " != host token " << host << " (" << where << ")";
      ++accepted;
      std::printf("[accepted] %s: host %d gpu %d: %s\n", where.c_str(), host, gpu, why->c_str());
    }
  }
  std::printf("[cuda sampling] %lld rows: %lld identical to sample_token, %lld accepted on a boundary; %lld differ "
              "from the host model\n",
              (long long)rows, (long long)same, (long long)accepted, (long long)model_diff);
}

// Captured in a CUDA graph and replayed: the same tokens as an eager call (nothing allocated or synchronised).
TEST(CudaSampling, GraphReplayMatchesEager) {
  FD_SKIP_WITHOUT_GPU();
  const int64_t n = 64, V = 32000;
  std::mt19937_64 rng(5);
  std::vector<float> h(size_t(n * V));
  std::vector<uint64_t> rid(static_cast<size_t>(n)), step(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) {
    fd::test::fill_row(h.data() + r * V, V, int(r % fd::test::kRowKinds), rng);
    rid[size_t(r)] = rng(), step[size_t(r)] = uint64_t(r);
  }
  fd::SamplingParams p;
  p.temperature = 0.8, p.top_k = 50, p.top_p = 0.9, p.seed = 3;
  const Dev<float> logits(h);
  const Dev<uint64_t> rids(rid), steps(step);
  Dev<int32_t> eager(static_cast<size_t>(n)), replay(static_cast<size_t>(n));
  fd::cuda::sample_rows(logits.get(), n, V, p, rids.get(), steps.get(), eager.get(), nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  fd::cuda::sample_rows(logits.get(), n, V, p, rids.get(), steps.get(), replay.get(), s);
  CUDA_CHECK(cudaStreamEndCapture(s, &g));
  CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  CUDA_CHECK(cudaGraphLaunch(ge, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  const std::vector<int32_t> tokens = eager.download();
  EXPECT_EQ(replay.download(), tokens);
  for (int64_t r = 0; r < n; ++r)
    EXPECT_EQ(tokens[size_t(r)], fd::cuda::sample_row_model(h.data() + r * V, V, p, rid[size_t(r)], step[size_t(r)]))
        << "row " << r;
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}

// argmax_rows = fd::argmax, row by row: the first of tied maxima (planted within one float4, across threads, at
// the row's ends), NaN at index 0 (then 0) and elsewhere (ignored), all -inf, every V % 4 (the vector and the
// scalar path), V from 1 to 128256, and a batch of 300 rows.
TEST(CudaSampling, ArgmaxRowsIsTheHostArgmax) {
  FD_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(20261202);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (int64_t V : {1, 2, 3, 5, 17, 1000, 1001, 1002, 4099, 32000, 50272, 128256}) {
    for (int64_t n : {int64_t(7), V == 32000 ? int64_t(300) : int64_t(1)}) {
      std::vector<float> h(size_t(n * V));
      for (auto& x : h) x = nd(rng);
      for (int64_t r = 0; r < n; ++r) {
        float* row = h.data() + r * V;
        const float top = 100.0f + float(r);
        switch (r % 7) {
          case 0: row[V - 1] = top; break;                                      // the last element
          case 1: for (int64_t i = V / 3; i < V; i += 4097) row[i] = top; break;  // tied across threads
          case 2: row[V / 2] = top, row[V / 2 + 1 < V ? V / 2 + 1 : V / 2] = top; break;  // tied within a vector
          case 3: row[0] = nan, row[V - 1] = top; break;                        // NaN first: index 0
          case 4: row[V / 2] = nan, row[0] = top, row[V - 1] = top; break;      // NaN elsewhere: ignored
          case 5: for (int64_t i = 0; i < V; ++i) row[i] = -inf; break;        // nothing beats index 0
          default: row[0] = top, row[V - 1] = top; break;                       // tied at both ends
        }
      }
      const Dev<float> logits(h);
      Dev<int32_t> out(static_cast<size_t>(n));
      fd::cuda::argmax_rows(logits.get(), n, V, out.get(), nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<int32_t> got = out.download();
      for (int64_t r = 0; r < n; ++r)
        ASSERT_EQ(got[size_t(r)], fd::argmax(h.data() + r * V, V)) << "V " << V << " row " << r << " (case " << r % 7 << ")";
    }
  }
}

// Checked before anything touches the device (no device needed).
TEST(CudaSampling, RejectsBadParameters) {
  fd::SamplingParams p;
  p.temperature = 1.0;
  const auto call = [&](int64_t n, int64_t V) {
    fd::cuda::sample_rows(nullptr, n, V, p, nullptr, nullptr, nullptr, nullptr);
  };
  EXPECT_THROW(call(1, 0), fd::Error);
  EXPECT_THROW(call(-1, 8), fd::Error);
  p.top_p = 0.0;
  EXPECT_THROW(call(1, 8), fd::Error);
  p.top_p = 1.0, p.temperature = -1.0;
  EXPECT_THROW(call(1, 8), fd::Error);
  p.temperature = 1.0, p.top_k = -2;
  EXPECT_THROW(call(1, 8), fd::Error);
  p.top_k = 0;
  EXPECT_NO_THROW(call(0, 8));  // no rows: nothing launched
}

// Per-row parameters (per-request sampling in the engines): one launch over rows that each carry their own
// parameters and seed gives every row exactly the token of the uniform launch with that row's parameters (the
// same block program; rows are independent), in graph replay too, and the host model's per-row tokens.
TEST(CudaSampling, PerRowParametersMatchUniformLaunches) {
  FD_SKIP_WITHOUT_GPU();
  std::vector<fd::SamplingParams> kinds(7);
  kinds[1].temperature = 0.7, kinds[1].seed = 1;
  kinds[2].temperature = 1.0, kinds[2].top_k = 8, kinds[2].seed = 2;
  kinds[3].temperature = 1.0, kinds[3].top_p = 0.8, kinds[3].seed = 3;
  kinds[4].temperature = 1.0, kinds[4].top_p = 0.8, kinds[4].seed = 4;
  kinds[5].temperature = 1.3, kinds[5].top_k = 20, kinds[5].top_p = 0.9, kinds[5].seed = 5;
  kinds[6].temperature = 0.5, kinds[6].top_k = 1, kinds[6].seed = 6;  // greedy through top_k 1
  std::mt19937_64 rng(12);
  for (int64_t V : {300, 32000}) {
    const int64_t n = 40;
    std::vector<float> h(size_t(n * V));
    std::vector<uint64_t> rid(static_cast<size_t>(n)), step(static_cast<size_t>(n));
    std::vector<fd::cuda::sampling::RowDraw> draws;
    std::vector<size_t> kind_of;
    for (int64_t r = 0; r < n; ++r) {
      fd::test::fill_row(h.data() + r * V, V, int(r % fd::test::kRowKinds), rng);
      rid[size_t(r)] = rng(), step[size_t(r)] = rng() % 512;
      kind_of.push_back(size_t((r * 5) % int64_t(kinds.size())));
      draws.push_back(fd::cuda::sampling::row_draw(V, kinds[kind_of.back()]));
    }
    const Dev<float> logits(h);
    const Dev<uint64_t> rids(rid), steps(step);
    const Dev<fd::cuda::sampling::RowDraw> d_draws(draws);
    const fd::cuda::sampling::RowDraw* dd = d_draws.get();
    Dev<int32_t> mixed(static_cast<size_t>(n)), replay(static_cast<size_t>(n)), uniform(static_cast<size_t>(n));
    fd::cuda::sample_rows(logits.get(), n, V, dd, rids.get(), steps.get(), mixed.get(), nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<int32_t> got = mixed.download();
    std::vector<std::vector<int32_t>> per_kind;
    for (const auto& p : kinds) {
      fd::cuda::sample_rows(logits.get(), n, V, p, rids.get(), steps.get(), uniform.get(), nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      per_kind.push_back(uniform.download());
    }
    const std::vector<int32_t> model = fd::cuda::sample_rows_model(h.data(), n, V, draws, rid, step);
    int64_t model_diff = 0;
    for (int64_t r = 0; r < n; ++r) {
      EXPECT_EQ(got[size_t(r)], per_kind[kind_of[size_t(r)]][size_t(r)]) << "V " << V << " row " << r;
      model_diff += got[size_t(r)] != model[size_t(r)];
    }
    std::printf("[cuda sampling per-row] V %lld: %lld rows, %lld differ from the host model\n", (long long)V,
                (long long)n, (long long)model_diff);
    // Graph-capturable: the per-row launch replayed gives the same tokens.
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    fd::cuda::sample_rows(logits.get(), n, V, dd, rids.get(), steps.get(), replay.get(), s);
    CUDA_CHECK(cudaStreamEndCapture(s, &g));
    CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    CUDA_CHECK(cudaGraphLaunch(ge, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    EXPECT_EQ(replay.download(), got) << "V " << V;
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);
  }
}

// Speed of sample_rows: fd-kernel-bench --only sampling, not a test.

#endif  // FD_HAVE_CUDA
