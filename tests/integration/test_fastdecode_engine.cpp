// The FastDecode engine on the CPU backend with R-worker processes over TCP loopback against the
// reference engine: same greedy tokens for the tiny Llama, OPT and GQA models over >= 64 steps.
#include <cstdio>
#include <map>

#include <signal.h>

#include "fastdecode/engine/reference_engine.h"
#include "fastdecode/sworker/rworker_spawn.h"
#include "tests/unit/test_helpers.h"
#include "tests/unit/token_compare.h"

using namespace fd;
using fd::test::repo_path;

namespace {

std::map<uint64_t, std::vector<int32_t>> run(Engine& e, const std::vector<Request>& reqs, int64_t* steps = nullptr) {
  e.add(reqs);
  std::map<uint64_t, std::vector<int32_t>> got;
  int64_t n = 0;
  while (!e.done()) {
    for (const auto& t : e.step().tokens) got[t.request_id].push_back(t.token);
    ++n;
  }
  if (steps) *steps = n;
  e.shutdown();
  return got;
}

std::vector<Request> requests(const ModelConfig& c) {
  std::vector<Request> r;
  for (uint64_t i = 0; i < 5; ++i) {
    Request q;
    q.id = 10 + i;
    for (uint64_t t = 0; t < 3 + 4 * i; ++t) q.prompt.push_back(int32_t(3 + (i * 37 + t * 11) % uint64_t(c.vocab_size - 3)));
    q.max_new_tokens = 64 + int64_t(i) * 3;  // unequal lengths: sequences finish at different steps
    r.push_back(q);
  }
  return r;
}

EngineConfig fastdecode_config(int64_t mini_batches) {
  EngineConfig ec;
  ec.type = "fastdecode";
  ec.mini_batches = mini_batches;
  ec.rworkers.spawn = 2;
  ec.rworkers.threads = 1;
  ec.rworkers.memory_gb = 0.2;
  ec.rworkers.timeout_ms = 60000;
  ec.rworkers.binary = std::string(FD_BIN_DIR) + "/fd-rworker";
  return ec;
}

// First (request, index) where two runs differ, for the failure message.
std::string first_divergence(const std::map<uint64_t, std::vector<int32_t>>& a, const std::map<uint64_t, std::vector<int32_t>>& b) {
  for (const auto& [id, toks] : a) {
    const auto& o = b.at(id);
    for (size_t i = 0; i < std::min(toks.size(), o.size()); ++i)
      if (toks[i] != o[i]) return "request " + std::to_string(id) + " token " + std::to_string(i);
    if (toks.size() != o.size()) return "request " + std::to_string(id) + " length";
  }
  return "none";
}

class FastDecodeVsReference : public ::testing::TestWithParam<const char*> {};

}  // namespace

TEST_P(FastDecodeVsReference, SameGreedyTokens) {
  const ModelConfig c = load_model_config(repo_path(std::string("experiments/models/") + GetParam() + ".json"));
  const auto reqs = requests(c);
  // The reference with its KV rounded to fp16 sees exactly the K/V values the R-workers store.
  auto w1 = make_random_source(3, DType::F16);
  ReferenceEngine ref16(c, *w1, SamplingParams{}, DType::F16);
  const auto expect = run(ref16, reqs);
  auto w0 = make_random_source(3, DType::F16);
  ReferenceEngine ref32(c, *w0, SamplingParams{});
  const auto exact = run(ref32, reqs);
  for (int64_t mb : {2, 1}) {
    SCOPED_TRACE("mini_batches " + std::to_string(mb));
    auto w = make_random_source(3, DType::F16);
    auto fd = make_engine(fastdecode_config(mb), c, *w, SamplingParams{});
    int64_t steps = 0;
    const auto got = run(*fd, reqs, &steps);
    EXPECT_GE(steps, 64);
    EXPECT_EQ(got, expect) << "first divergence from the fp16-KV reference: " << first_divergence(got, expect);
    // Against the exact fp32 reference the tokens agree too on these models (fp16 KV rounding moves
    // logits by ~1e-3, far below their top-2 gaps); a divergence here is reported, not hidden.
    EXPECT_EQ(got, exact) << "first divergence from the fp32 reference: " << first_divergence(got, exact);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, FastDecodeVsReference, ::testing::Values("tiny-llama", "tiny-opt", "tiny-llama-gqa"));

TEST(FastDecodeEngine, SamplingMatchesReferenceToo) {
  const ModelConfig c = load_model_config(repo_path("experiments/models/tiny-llama.json"));
  SamplingParams sp;
  sp.temperature = 0.8;
  sp.top_p = 0.95;
  sp.seed = 7;
  const auto reqs = requests(c);
  auto w1 = make_random_source(3, DType::F16);
  ReferenceEngine ref(c, *w1, sp, DType::F16);
  const auto expect = run(ref, reqs);
  auto w2 = make_random_source(3, DType::F16);
  auto fd = make_engine(fastdecode_config(2), c, *w2, sp);
  EXPECT_EQ(run(*fd, reqs), expect);
}

TEST(FastDecodeEngine, DeadRWorkerFailsTheStepNamingIt) {
  const ModelConfig c = load_model_config(repo_path("experiments/models/tiny-llama.json"));
  EngineConfig ec = fastdecode_config(2);
  ec.rworkers.endpoints = {"tcp://127.0.0.1:1"};  // nothing listens there
  ec.rworkers.timeout_ms = 300;
  auto w = make_random_source(3, DType::F16);
  const std::string msg = fd::test::error_message([&] { make_engine(ec, c, *w, SamplingParams{}); });
  EXPECT_THAT(msg, ::testing::HasSubstr("R-worker 0 (tcp://127.0.0.1:1) missed its deadline of 300 ms"));
}

TEST(FastDecodeEngine, WorkerKilledMidRunFailsTheStepNamingIt) {
  const ModelConfig c = load_model_config(repo_path("experiments/models/tiny-llama.json"));
  SpawnedRWorker a(std::string(FD_BIN_DIR) + "/fd-rworker", {"--threads", "1", "--memory-gb", "0.1", "--name", "a"});
  SpawnedRWorker b(std::string(FD_BIN_DIR) + "/fd-rworker", {"--threads", "1", "--memory-gb", "0.1", "--name", "b"});
  EngineConfig ec = fastdecode_config(2);
  ec.rworkers.endpoints = {a.endpoint(), b.endpoint()};
  ec.rworkers.timeout_ms = 500;
  auto w = make_random_source(3, DType::F16);
  auto e = make_engine(ec, c, *w, SamplingParams{});
  e->add(requests(c));
  e->step();  // prefill: sequences placed on both workers
  e->step();
  kill(b.pid(), SIGKILL);
  const std::string msg = fd::test::error_message([&] { e->step(); });
  EXPECT_THAT(msg, ::testing::HasSubstr("R-worker 1 (" + b.endpoint() + ") missed its deadline of 500 ms"));
}

// fp16 on the wire (the default with the CUDA S-Part) rounds q and the attention output: tokens may
// flip at a near-tie, so they must agree until the first divergence and there the reference's logits
// must be a near-tie (gap within 5e-3 of the largest |logit|).
TEST_P(FastDecodeVsReference, Fp16WireTokens) {
  const ModelConfig c = load_model_config(repo_path(std::string("experiments/models/") + GetParam() + ".json"));
  std::vector<Request> reqs;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> prompt;
    for (int t = 0; t < 3 + 5 * i; ++t) prompt.push_back(int32_t((i * 31 + t * 7 + 5) % 200));
    reqs.push_back({uint64_t(100 + i), prompt, 64, false});
  }
  auto w0 = make_random_source(3, DType::F16);
  const ModelWeights weights = load_model_weights(c, *w0);
  auto w1 = make_random_source(3, DType::F16);
  ReferenceEngine ref16(c, *w1, SamplingParams{}, DType::F16);
  const auto expect = run(ref16, reqs);
  EngineConfig ec = fastdecode_config(2);
  ec.wire_dtype = "fp16";
  auto w = make_random_source(3, DType::F16);
  auto e = make_engine(ec, c, *w, SamplingParams{});
  const auto got = run(*e, reqs);
  const auto d = fd::test::first_divergence_with_gap(weights, DType::F16, reqs, expect, got);
  std::printf("%s fp16 wire: first divergence %s\n", GetParam(), d.describe().c_str());
  if (d.any) EXPECT_LE(d.gap, 5e-3 * d.scale) << d.describe();
}

