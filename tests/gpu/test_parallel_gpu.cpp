// The FastDecode engine's parallel modes on the cuda backend (issue 14; docs/PARALLEL.md), on whatever GPUs
// answer (the GPU machine lent now has one):
//   * P = 2 with both stages on GPU 0 changes no arithmetic: the same tokens as P = 1 and bit-equal recorded
//     logits (the residual crosses through pinned host memory, bytes unchanged);
//   * T = 2 with both tensor ranks on GPU 0 (engine.parallel.devices [0, 0], comm gloo: host-staged
//     collectives) judged against the fp16-KV reference under the near-tie rule (5e-3 of max |logit|, the
//     fp16 S-Part's bound), the gap printed where it differs from T = 1;
//   * T = 2 with fewer GPUs than ranks and no devices list is refused, naming the GPUs needed;
//   * the NCCL communicator (when built): a group of one GPU sums and gathers device buffers in place, and a
//     GPU named twice is refused;
//   * the GPU-only baseline's modes the same way: P = 2 on GPU 0 bit-equal to P = 1 cut into the same waves, T = 2
//     and T = P = 2 sharing GPU 0 within the near-tie rule, T = 2 refused without a GPU per rank.
#ifdef FD_HAVE_CUDA  // (a CPU-only build compiles these tests too: they skip)
#include <cuda_runtime.h>
#endif

#include <cstdio>
#include <cstring>

#include "baselines/gpu_only/gpu_only_engine.h"
#include "fastdecode/parallel/comm.h"
#include "fastdecode/sworker/fastdecode_engine.h"
#include "kernels/cuda/device_info.h"
#include "tests/gpu/require_gpu.h"
#include "tests/unit/test_helpers.h"
#include "tests/integration/parallel_test_util.h"
#include "tests/unit/token_compare.h"

using namespace fd;
using fd::test::first_divergence;
using fd::test::repo_path;
using fd::test::parallel::requests;
using fd::test::parallel::run;
using fd::test::parallel::same_rows;

namespace {

constexpr double kNearTie = 5e-3;  // the fp16 S-Part's near-tie bound (docs/CORRECTNESS.md)

ModelConfig model(const char* name) {
  return load_model_config(repo_path(std::string("experiments/models/") + name + ".json"));
}

FastDecodeConfig config(int64_t T, int64_t P) {
  FastDecodeConfig ec;
  ec.backend = "cuda";
  ec.cuda_graphs = false;  // graphs are off under T > 1; off everywhere here so P compares like with like
  ec.parallel.tensor = T;
  ec.parallel.pipeline = P;
  ec.prefill_tokens = 24;
  ec.rworkers.spawn = 2;
  ec.rworkers.memory_gb = 0.1;
  ec.rworkers.binary = std::string(FD_BIN_DIR) + "/fd-rworker";
  return ec;
}

class CudaParallel : public ::testing::TestWithParam<const char*> {};

}  // namespace

TEST_P(CudaParallel, PipelineOnOneGpuIsExact) {
  FD_SKIP_WITHOUT_GPU();
  const ModelConfig c = model(GetParam());
  const auto one = run(c, config(1, 1));
  const auto pp = run(c, config(1, 2));
  EXPECT_EQ(pp.tokens, one.tokens) << GetParam() << " P = 2: first divergence " << first_divergence(pp.tokens, one.tokens);
  EXPECT_TRUE(same_rows(pp, one)) << GetParam() << " P = 2: recorded logits are not bit-equal to P = 1's";
}

TEST_P(CudaParallel, TensorRanksSharingOneGpuWithinTheNearTieRule) {
  FD_SKIP_WITHOUT_GPU();
  FD_REQUIRE_GLOO();
  const ModelConfig c = model(GetParam());
  const auto one = run(c, config(1, 1));
  auto w = make_random_source(3, DType::F16);
  const ModelWeights weights = load_model_weights(c, *w);
  for (auto [T, P] : {std::pair<int64_t, int64_t>{2, 1}, {2, 2}}) {
    FastDecodeConfig ec = config(T, P);
    ec.parallel.devices.assign(size_t(T * P), 0);
    ec.parallel.comm = "gloo";
    const auto r = run(c, ec);
    const auto k = fd::test::check_greedy_tokens(weights, {DType::F16}, requests(c), r.tokens, kNearTie);
    std::printf("%s cuda T = %lld, P = %lld (one GPU, gloo) vs the fp16-KV reference: %s\n", GetParam(), (long long)T,
                (long long)P, k.describe().c_str());
    EXPECT_TRUE(k.ok()) << "T = " << T << ", P = " << P << ": " << k.describe();
    if (r.tokens != one.tokens)
      std::printf("%s cuda T = %lld, P = %lld: tokens differ from T = P = 1 at %s (near-ties, judged above)\n", GetParam(),
                  (long long)T, (long long)P, first_divergence(r.tokens, one.tokens).c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaParallel, ::testing::Values("tiny-llama", "tiny-opt", "tiny-llama-gqa",
                                                                          "tiny-opt-350m", "tiny-llama-bias"));

TEST(CudaParallelConfig, TensorRanksNeedAGpuEach) {
  FD_SKIP_WITHOUT_GPU();
  const int64_t n = int64_t(cuda_devices().size());
  const ModelConfig c = model("tiny-llama");
  auto w = make_random_source(3, DType::F16);
  const int64_t T = 2, P = n;  // T x P = 2n ranks: always more than the GPUs that answer
  if (c.num_layers < P) GTEST_SKIP() << n << " GPUs: tiny-llama has too few layers for " << P << " stages";
  try {
    make_fastdecode_engine(config(T, P), {c, *w, SamplingParams{}});
    ADD_FAILURE() << "T = 2 x P = " << P << " on " << n << " GPU(s) was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("needs " + std::to_string(T * P) + " GPUs"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string(n) + " answer"), std::string::npos) << e.what();
  }
  FastDecodeConfig far = config(1, 2);
  far.parallel.devices = {0, n};  // GPU n does not exist
  EXPECT_THROW(make_fastdecode_engine(far, {c, *w, SamplingParams{}}), ConfigError);
}

TEST(NcclComm, OneGpuGroupSumsAndGathersDeviceBuffers) {
  FD_SKIP_WITHOUT_GPU();
  if (!have_nccl()) {
    if (std::getenv("FD_REQUIRE_NCCL")) FAIL() << "FD_REQUIRE_NCCL is set, but this build has no NCCL communicator";
    GTEST_SKIP() << "this build has no NCCL communicator (CMake found no nccl.h / libnccl.so.2)";
  }
#ifdef FD_HAVE_CUDA
  CommGroup g = make_nccl_group({0});
  ASSERT_EQ(g.size(), 1u);
  EXPECT_TRUE(g[0]->device_buffers());
  std::printf("NCCL %s: %s\n", nccl_version().c_str(), g[0]->describe().c_str());
  const std::vector<float> h = {1.5f, -2.0f, 3.25f, 0.0f};
  float *d = nullptr, *out = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 16), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, 16), cudaSuccess);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d, h.data(), 16, cudaMemcpyHostToDevice), cudaSuccess);
  g[0]->all_reduce_sum(d, 4, CommType::F32, s);
  g[0]->all_gather(d, out, 4, CommType::F32, s);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  std::vector<float> back(4), gathered(4);
  ASSERT_EQ(cudaMemcpy(back.data(), d, 16, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(gathered.data(), out, 16, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, h);
  EXPECT_EQ(gathered, h);
  cudaStreamDestroy(s);
  cudaFree(d);
  cudaFree(out);
  EXPECT_THROW(make_nccl_group({0, 0}), ConfigError);
#endif
}

// ---- The GPU-only baseline's parallel modes (engine.parallel of the gpu-only section) ----

namespace {

GpuOnlyConfig gpu_only(int64_t T, int64_t P) {
  GpuOnlyConfig g;
  g.max_context = 128;
  g.cuda_graphs = false;  // graphs are off under engine.parallel; off here so P compares like with like
  g.prefill_tokens = 24;
  g.parallel.tensor = T;
  g.parallel.pipeline = P;
  return g;
}

fd::test::EngineRun run_gpu_only(const ModelConfig& c, const GpuOnlyConfig& g) {
  auto w = make_random_source(3, DType::F16);
  auto e = make_gpu_only_engine(g, {c, *w, SamplingParams{}});
  const auto r = fd::test::run_engine(*e, requests(c));
  EXPECT_TRUE(r.errors.empty()) << r.describe_errors();
  return r;
}

class GpuOnlyParallel : public ::testing::TestWithParam<const char*> {};

}  // namespace

// P = 2 with both stages on GPU 0 against P = 1 cut into the same 2 waves: the residual crosses unchanged, the
// same GEMMs run on the same rows, so the tokens and recorded logits are bit-equal.
TEST_P(GpuOnlyParallel, PipelineOnOneGpuIsExact) {
  FD_SKIP_WITHOUT_GPU();
  const ModelConfig c = model(GetParam());
  GpuOnlyConfig one_cfg = gpu_only(1, 1);
  one_cfg.parallel.waves = 2;
  const auto one = run_gpu_only(c, one_cfg);
  const auto pp = run_gpu_only(c, gpu_only(1, 2));
  EXPECT_EQ(pp.tokens, one.tokens) << GetParam() << " gpu-only P = 2: first divergence " << first_divergence(pp.tokens, one.tokens);
  EXPECT_TRUE(same_rows(pp, one)) << GetParam() << " gpu-only P = 2: recorded logits are not bit-equal to P = 1's";
}

// T = 2 and T = P = 2 with every rank on GPU 0 (comm gloo: host-staged collectives), judged against the fp16-KV
// reference under the near-tie rule.
TEST_P(GpuOnlyParallel, TensorRanksSharingOneGpuWithinTheNearTieRule) {
  FD_SKIP_WITHOUT_GPU();
  FD_REQUIRE_GLOO();
  const ModelConfig c = model(GetParam());
  auto w = make_random_source(3, DType::F16);
  const ModelWeights weights = load_model_weights(c, *w);
  for (auto [T, P] : {std::pair<int64_t, int64_t>{2, 1}, {2, 2}}) {
    GpuOnlyConfig g = gpu_only(T, P);
    g.parallel.devices.assign(size_t(T * P), 0);
    g.parallel.comm = "gloo";
    const auto r = run_gpu_only(c, g);
    const auto k = fd::test::check_greedy_tokens(weights, {DType::F16}, requests(c), r.tokens, kNearTie);
    std::printf("%s gpu-only T = %lld, P = %lld (one GPU, gloo) vs the fp16-KV reference: %s\n", GetParam(), (long long)T,
                (long long)P, k.describe().c_str());
    EXPECT_TRUE(k.ok()) << "gpu-only T = " << T << ", P = " << P << ": " << k.describe();
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GpuOnlyParallel, ::testing::Values("tiny-llama", "tiny-opt", "tiny-llama-gqa",
                                                                          "tiny-opt-350m", "tiny-llama-bias"));

TEST(GpuOnlyParallelConfig, TensorRanksNeedAGpuEach) {
  FD_SKIP_WITHOUT_GPU();
  const int64_t n = int64_t(cuda_devices().size());
  const ModelConfig c = model("tiny-llama");
  auto w = make_random_source(3, DType::F16);
  if (c.num_layers < n) GTEST_SKIP() << n << " GPUs: tiny-llama has too few layers for " << n << " stages";
  try {
    make_gpu_only_engine(gpu_only(2, n), {c, *w, SamplingParams{}});
    ADD_FAILURE() << "gpu-only T = 2 x P = " << n << " on " << n << " GPU(s) was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("needs " + std::to_string(2 * n) + " GPUs"), std::string::npos) << e.what();
  }
}
