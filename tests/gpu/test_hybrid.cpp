// The hybrid engine (issue 17; docs/HYBRID.md) on the GPU with 2 spawned R-workers: every placement gives the
// fp16-KV reference's greedy tokens (teacher-forced, the near-tie rule of the fp16 S-Part), on tiny Llama, OPT and
// GQA — all on the GPU (then exactly GPU-only's tokens: the same kernels), all on the CPUs, half and half, and the
// controller's own choice, also with a GPU memory budget that holds only a few sequences (the rest overflow to the
// R-workers or wait). Skips without a device (label gpu).
#include <cstdio>

#include "baselines/gpu_only/gpu_only_engine.h"
#include "extensions/hybrid/hybrid_engine.h"
#include "tests/gpu/require_gpu.h"
#include "tests/unit/test_helpers.h"
#include "tests/unit/token_compare.h"

using namespace fd;
using fd::test::repo_path;

namespace {

constexpr double kNearTie = 5e-3;  // the fp16 S-Part's near-tie bound (docs/CORRECTNESS.md)

std::vector<Request> requests(const ModelConfig& c) {
  std::vector<Request> r;
  for (int i = 0; i < 6; ++i) {
    Request q;
    q.id = uint64_t(40 + i);
    for (int t = 0; t < 4 + 9 * i; ++t) q.prompt.push_back(int32_t(3 + (i * 29 + t * 17) % (c.vocab_size - 3)));
    q.max_new_tokens = 36 + 5 * i;  // contexts cross a 32-token block on the R-workers
    q.record_logits = i == 2;
    r.push_back(q);
  }
  return r;
}

HybridConfig hybrid(const std::string& mode, double fraction = 0) {
  HybridConfig h;
  h.max_context = 128;
  h.prefill_tokens = 40;
  h.rworkers.spawn = 2;
  h.rworkers.memory_gb = 0.1;
  h.rworkers.binary = std::string(FD_BIN_DIR) + "/fd-rworker";
  json j = {{"mode", mode}};
  if (mode == "fixed-fraction") j["cpu_fraction"] = fraction;
  StrictObject o(j, "test", "controller");
  h.controller = HybridControllerConfig::parse(o);
  return h;
}

class Hybrid : public ::testing::TestWithParam<const char*> {};

}  // namespace

TEST_P(Hybrid, EveryPlacementGivesTheReferenceTokens) {
  FD_SKIP_WITHOUT_GPU();
  const ModelConfig c = load_model_config(repo_path(std::string("experiments/models/") + GetParam() + ".json"));
  const auto reqs = requests(c);
  auto w0 = make_random_source(3, DType::F16);
  const ModelWeights weights = load_model_weights(c, *w0);
  // GPU-only, for the all-GPU placement's exact comparison.
  GpuOnlyConfig go;
  go.max_context = 128;
  go.prefill_tokens = 40;
  auto wg = make_random_source(3, DType::F16);
  auto g = make_gpu_only_engine(go, {c, *wg, SamplingParams{}});
  const auto gpu_only = fd::test::run_tokens(*g, reqs);
  g.reset();
  struct Case {
    std::string what;
    HybridConfig cfg;
    double gpu_memory_gb;
  };
  const double weights_gb = double(with_layers(c, c.full_num_layers).num_params()) * 2 / 1e9;
  std::vector<Case> cases = {{"all-gpu", hybrid("all-gpu"), 0},
                             {"all-cpu", hybrid("all-cpu"), 0},
                             {"half", hybrid("fixed-fraction", 0.5), 0},
                             {"auto", hybrid("auto"), 0},
                             // room for 2 sequences of 128 positions at full depth: the rest on the CPUs or waiting
                             {"auto, 2 GPU slots", hybrid("auto"),
                              weights_gb + double(1ull << 30) / 1e9 +
                                  2.2 * (double(c.kv_bytes_per_token(2, true)) * 128 + gpu_only_row_bytes(c)) / 1e9}};
  for (const auto& k : cases) {
    auto w = make_random_source(3, DType::F16);
    HardwareBalance hw;
    hw.gpu_memory_gb = k.gpu_memory_gb;
    auto e = make_hybrid_engine(k.cfg, {c, *w, SamplingParams{}, hw});
    fd::test::EngineRun stats;
    const auto got = fd::test::run_tokens(*e, reqs, &stats);
    const auto check = fd::test::check_greedy_tokens(weights, {DType::F16}, reqs, got, kNearTie);
    std::printf("%s hybrid %s (%s): %s\n", GetParam(), k.what.c_str(), e->info().at("controller").dump().c_str(),
                check.describe().c_str());
    EXPECT_TRUE(check.ok()) << k.what << ": " << check.describe();
    if (k.what == "all-gpu") EXPECT_EQ(got, gpu_only) << "all on the GPU runs GPU-only's kernels: the same tokens";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Hybrid, ::testing::Values("tiny-llama", "tiny-opt", "tiny-llama-gqa",
                                                                          "tiny-opt-350m", "tiny-llama-bias"));
