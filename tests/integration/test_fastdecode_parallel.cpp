// The FastDecode engine's tensor- and pipeline-parallel modes on the CPU backend (issue 14; docs/PARALLEL.md):
// S-ranks as threads of the test's process, each with its own group of 2 spawned R-worker processes.
//   * pipeline P = 2 changes no arithmetic: the same tokens as T = P = 1, and bit-equal recorded logits;
//   * tensor T = 2 and T = P = 2 reorder two fp32 sums per layer (the all-reduces): judged token by token
//     against the fp16-KV reference under the near-tie rule (docs/CORRECTNESS.md), the worst gap printed;
//   * refusals: a T that does not divide the heads, more stages than layers, endpoints with ranks.
#include <cstdio>
#include <cstring>

#include "fastdecode/core/dtype.h"
#include "fastdecode/sworker/fastdecode_engine.h"
#include "fastdecode/sworker/rworker_spawn.h"
#include "fastdecode/wire/rworker_client.h"
#include "fastdecode/parallel/comm.h"
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

constexpr double kNearTie = 1e-5;  // fp32 on the CPU: CORRECTNESS.md's bound for a reordered fp32 sum

ModelConfig model(const char* name) {
  return load_model_config(repo_path(std::string("experiments/models/") + name + ".json"));
}

FastDecodeConfig config(int64_t T, int64_t P) {
  FastDecodeConfig ec;
  ec.parallel.tensor = T;
  ec.parallel.pipeline = P;
  ec.parallel.timeout_ms = 60000;
  ec.prefill_tokens = 24;  // the prompts start over several steps: prefill and decode in one step
  ec.rworkers.spawn = 2;
  ec.rworkers.threads = 1;
  ec.rworkers.memory_gb = 0.1;
  ec.rworkers.timeout_ms = 60000;
  ec.rworkers.binary = std::string(FD_BIN_DIR) + "/fd-rworker";
  return ec;
}

class Parallel : public ::testing::TestWithParam<const char*> {};

}  // namespace

TEST_P(Parallel, PipelineIsExactAndTensorWithinTheNearTieRule) {
  FD_REQUIRE_GLOO();
  const ModelConfig c = model(GetParam());
  // P = 2 runs 2 waves (its default): T = P = 1 with 2 waves cuts the batches the same way, so no arithmetic differs.
  FastDecodeConfig one_cfg = config(1, 1);
  one_cfg.parallel.waves = 2;
  const auto one = run(c, one_cfg);
  const auto pp = run(c, config(1, 2));
  EXPECT_EQ(pp.tokens, one.tokens) << GetParam() << " P = 2: first divergence " << first_divergence(pp.tokens, one.tokens);
  EXPECT_TRUE(same_rows(pp, one)) << GetParam() << " P = 2: recorded logits are not bit-equal to T = P = 1's";
  auto w = make_random_source(3, DType::F16);
  const ModelWeights weights = load_model_weights(c, *w);
  for (auto [T, P] : {std::pair<int64_t, int64_t>{2, 1}, {2, 2}}) {
    const auto r = run(c, config(T, P));
    const auto k = fd::test::check_greedy_tokens(weights, {DType::F16}, requests(c), r.tokens, kNearTie);
    std::printf("%s T = %lld, P = %lld vs the fp16-KV reference: %s\n", GetParam(), (long long)T, (long long)P,
                k.describe().c_str());
    EXPECT_TRUE(k.ok()) << "T = " << T << ", P = " << P << ": " << k.describe();
    if (r.tokens != one.tokens)
      std::printf("%s T = %lld, P = %lld: tokens differ from T = P = 1 at %s (near-ties, judged above)\n", GetParam(),
                  (long long)T, (long long)P, first_divergence(r.tokens, one.tokens).c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(Models, Parallel, ::testing::Values("tiny-llama", "tiny-opt", "tiny-llama-gqa"));

TEST(ParallelConfig, Refusals) {
  const ModelConfig c = model("tiny-llama-gqa");  // 4 heads, 2 KV heads, 2 layers
  auto w = make_random_source(3, DType::F16);
  const auto refuses = [&](FastDecodeConfig ec, const std::string& what) {
    try {
      make_fastdecode_engine(ec, {c, *w, SamplingParams{}});
      ADD_FAILURE() << "accepted; expected: " << what;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refuses(config(4, 1), "engine.parallel.tensor");  // 2 KV heads cannot be split 4 ways
  refuses(config(1, c.num_layers + 1), "engine.parallel.pipeline");  // more stages than layers
  FastDecodeConfig eps = config(1, 2);
  eps.rworkers.endpoints = {"tcp://127.0.0.1:1"};
  refuses(eps, "groups[g].endpoints");
  FastDecodeConfig uneven = config(1, 2);  // group 1 lists 3 workers, group 0 spawns 2
  uneven.rworkers.groups.resize(2);
  uneven.rworkers.groups[1].endpoints = {"tcp://127.0.0.1:1", "tcp://127.0.0.1:2", "tcp://127.0.0.1:3"};
  refuses(uneven, "the same number");
  FastDecodeConfig short_list = config(1, 2);
  short_list.rworkers.groups.resize(1);
  refuses(short_list, "engine.rworkers.groups has 1 entries for 2 S-ranks");
}

// Per-group R-worker settings (engine.rworkers.groups): group 0 spawned with its own threads and memory, group 1
// made of workers the user started (listed endpoints). The tokens and recorded logits are those of the same run
// with both groups spawned alike; the listed workers are left running, their sequences freed.
TEST(ParallelGroups, ListedAndOverriddenGroupsRunTheSameSteps) {
  const ModelConfig c = model("tiny-llama");
  const auto plain = run(c, config(1, 2));
  const std::string bin = std::string(FD_BIN_DIR) + "/fd-rworker";
  SpawnedRWorker u0(bin, {"--memory-gb", "0.1", "--name", "user0"}), u1(bin, {"--memory-gb", "0.1", "--name", "user1"});
  FastDecodeConfig ec = config(1, 2);
  ec.rworkers.groups.resize(2);
  ec.rworkers.groups[0].threads = 2;
  ec.rworkers.groups[0].memory_gb = 0.05;
  ec.rworkers.groups[1].endpoints = {u0.endpoint(), u1.endpoint()};
  const auto grouped = run(c, ec);
  EXPECT_EQ(grouped.tokens, plain.tokens) << first_divergence(grouped.tokens, plain.tokens);
  EXPECT_TRUE(same_rows(grouped, plain));
  for (const SpawnedRWorker* u : {&u0, &u1}) {  // they served stage 1's attention, are still up, holding nothing
    RWorkerClient client({u->endpoint()}, 10000);
    const json st = client.stats(0);
    EXPECT_GT(st.at("attend_requests").get<int64_t>(), 0) << st.dump();
    EXPECT_EQ(st.at("sequences").get<int64_t>(), 0) << st.dump();
    client.shutdown(0, u->token());
  }
}
