#include "baselines/gpu_only/async_chain.h"
#include "baselines/gpu_only/gpu_only_engine.h"
#include "fastdecode/model/shard.h"
#include "extensions/hybrid/hybrid_engine.h"
#include "baselines/reference/reference_engine.h"
#include "fastdecode/sworker/fastdecode_engine.h"

#include <map>

#include "harness/engines.h"
#include "test_helpers.h"
#include "token_compare.h"

using namespace fd;
using fd::test::repo_path;

namespace {

ModelConfig cfg(const char* name) {
  return load_model_config(repo_path(std::string("experiments/models/") + name + ".json"));
}

// Greedy tokens of one request computed directly with the reference model, one sequence alone.
std::vector<int32_t> solo_greedy(const ModelConfig& c, const Request& r) {
  auto src = make_random_source(2, DType::F16);
  ReferenceModel m(load_model_weights(c, *src));
  const int64_t s = m.add_sequence();
  std::vector<RefToken> batch;
  for (size_t i = 0; i < r.prompt.size(); ++i) batch.push_back({s, r.prompt[i], i + 1 == r.prompt.size()});
  std::vector<int32_t> out;
  for (int64_t i = 0; i < r.max_new_tokens; ++i) {
    out.push_back(argmax(m.forward(batch).data(), c.vocab_size));
    batch = {{s, out.back(), true}};
  }
  return out;
}

std::map<uint64_t, std::vector<int32_t>> run_all(Engine& e, int64_t* steps = nullptr) {
  std::map<uint64_t, std::vector<int32_t>> got;
  int64_t n = 0;
  while (!e.done()) {
    const StepResult r = e.step();
    for (const auto& t : r.tokens) got[t.request_id].push_back(t.token);
    ++n;
  }
  if (steps) *steps = n;
  return got;
}

class EngineArch : public ::testing::TestWithParam<const char*> {};

}  // namespace

// Batched prefill + decode of requests of different lengths gives each request the tokens it gets alone.
TEST_P(EngineArch, BatchedGenerationMatchesSoloGreedy) {
  const ModelConfig c = cfg(GetParam());
  auto src = make_random_source(2, DType::F16);
  ReferenceEngine e(c, *src, SamplingParams{});
  std::vector<Request> reqs = {{0, {10, 11, 12, 13, 14}, 6, false}, {1, {20, 21}, 9, false}, {2, {30, 31, 32}, 1, false}};
  e.add(reqs);
  int64_t steps = 0;
  const auto got = run_all(e, &steps);
  EXPECT_EQ(steps, 9);
  for (const auto& r : reqs) EXPECT_EQ(got.at(r.id), solo_greedy(c, r)) << "request " << r.id;
  e.shutdown();
}

INSTANTIATE_TEST_SUITE_P(Models, EngineArch, ::testing::Values("tiny-llama", "tiny-llama-gqa", "tiny-opt"));

TEST(Engine, StepAccountsTokensAndContext) {
  const ModelConfig c = cfg("tiny-llama");
  auto src = make_random_source(2, DType::F16);
  ReferenceEngine e(c, *src, SamplingParams{});
  e.add({{0, {5, 6, 7}, 3, false}, {1, {8}, 3, false}});
  StepResult s = e.step();
  EXPECT_EQ(s.prefill_tokens, 4);
  EXPECT_EQ(s.decode_tokens, 0);
  EXPECT_EQ(s.total_context, 4);
  EXPECT_EQ(s.tokens.size(), 2u);
  s = e.step();
  EXPECT_EQ(s.decode_tokens, 2);
  EXPECT_EQ(s.total_context, 4 + 2);
  s = e.step();
  for (const auto& t : s.tokens) EXPECT_TRUE(t.finished);
  EXPECT_TRUE(e.done());
}

TEST(Engine, BadRequestQueuesNothing) {
  const ModelConfig c = cfg("tiny-llama");
  auto src = make_random_source(2, DType::F16);
  ReferenceEngine e(c, *src, SamplingParams{});
  EXPECT_THROW(e.add({{0, {5, 6}, 3, false}, {1, {999}, 3, false}}), Error);
  EXPECT_THROW(e.add({{2, {}, 3, false}}), Error);
  EXPECT_THROW(e.add({{3, {5}, 600, false}}), Error);  // past max_position_embeddings
  EXPECT_TRUE(e.done());
}

TEST(Engine, StopsAtEosWhenAsked) {
  const ModelConfig c = cfg("tiny-llama");
  // Find a request whose greedy continuation contains the eos id, by forcing eos = its 3rd token.
  Request r{0, {40, 41, 42}, 12, true};
  const auto solo = solo_greedy(c, Request{0, r.prompt, 12, false});
  json j = c.hf;
  j["eos_token_id"] = solo[2];
  const ModelConfig c2 = model_config_from_json(j, "eos.json");
  auto src = make_random_source(2, DType::F16);
  ReferenceEngine e(c2, *src, SamplingParams{});
  e.add({r});
  const auto got = run_all(e);
  const size_t first = size_t(std::find(solo.begin(), solo.end(), solo[2]) - solo.begin());
  EXPECT_EQ(got.at(0).size(), first + 1);
}

TEST(Engine, FactoryAndSamplingDeterminism) {
  const ModelConfig c = cfg("tiny-llama");
  const EngineSpec spec = parse_engine_spec(StrictObject(json{{"type", "reference"}}, "x.json", "engine"));
  SamplingParams sp;
  sp.temperature = 1.0;
  sp.top_p = 0.9;
  sp.seed = 4;
  std::vector<std::map<uint64_t, std::vector<int32_t>>> runs;
  for (int i = 0; i < 2; ++i) {
    auto src = make_random_source(2, DType::F16);
    auto e = make_engine(spec, {c, *src, sp});
    EXPECT_EQ(e->name(), "reference");
    // Different batch composition in the two runs: the draws depend only on (seed, request, step).
    if (i == 0) e->add({{0, {10, 11}, 8, false}, {1, {12, 13, 14}, 8, false}});
    else e->add({{1, {12, 13, 14}, 8, false}});
    runs.push_back(run_all(*e));
  }
  EXPECT_EQ(runs[0].at(1), runs[1].at(1));
}

// GPU-only capacity, by hand for Llama-2-7b: 6 738 415 616 parameters -> 13 476 831 232 bytes of fp16
// weights at full depth; 1 GiB reserved; KV 2 (K,V) x 32 layers x 4096 x 2 bytes = 524 288 bytes per
// token. At 24 GB and 1024 positions per sequence: (24e9 - 13 476 831 232 - 1 073 741 824) / 536 870 912
// = 17.6 -> 17 sequences; the same with the model reduced to 2 layers (full-depth accounting).
// gpu-only's asynchronous chain (async_chain.h): which rows of the step in flight continue into the step launched
// ahead. Rows are (running, eligible, generated, max_new_tokens).
TEST(GpuOnlyAsyncChain, RowsThatContinue) {
  using R = ChainRow;
  const R go{true, true, 3, 10}, last{true, true, 9, 10}, gone{false, false, 0, 0}, sampled{true, false, 3, 10};
  EXPECT_EQ(chain_rows({go, go, go}, false), (std::vector<int32_t>{0, 1, 2}));
  // A row ended before the step in flight, and one ending at it (max_new_tokens): left out, the rest go on.
  EXPECT_EQ(chain_rows({go, gone, last, go}, false), (std::vector<int32_t>{0, 3}));
  // Requests queued: still chained while no slot frees at the step in flight...
  EXPECT_EQ(chain_rows({go, gone, go}, true), (std::vector<int32_t>{0, 2}));
  // ... but not when one does (the queued start at the next step, synchronously).
  EXPECT_TRUE(chain_rows({go, last, go}, true).empty());
  // A row that may not run ahead (sampled, forced or recording): nothing is launched; unless it ends anyway.
  EXPECT_TRUE(chain_rows({go, sampled}, false).empty());
  EXPECT_EQ(chain_rows({go, R{true, false, 9, 10}}, false), (std::vector<int32_t>{0}));
  // Nothing continues: nothing launched.
  EXPECT_TRUE(chain_rows({last, gone}, false).empty());
  EXPECT_TRUE(chain_rows({}, false).empty());
}

TEST(GpuOnlySlots, MemoryBoundedAtFullDepth) {
  const ModelConfig c = cfg("llama-2-7b");
  EXPECT_EQ(c.num_params(), 6738415616);
  EXPECT_EQ(gpu_only_slots(c, 24e9, 1024), 17);
  EXPECT_EQ(gpu_only_slots(with_layers(c, 2), 24e9, 1024), 17);
  EXPECT_EQ(gpu_only_slots(c, 24e9, 2048), 8);
  EXPECT_EQ(gpu_only_slots(c, 14e9, 1024), 0);  // the weights alone do not leave room
  // The engine type parses, rejects R-worker keys, and says what the build lacks when it has no CUDA.
  auto parse = [](json j) { return parse_engine_spec(StrictObject(j, "x.json", "engine")); };
  auto gpu_only = [&](json j) { return std::any_cast<GpuOnlyConfig>(parse(j).config); };
  EXPECT_EQ(gpu_only(json{{"type", "gpu-only"}, {"max_context", 1100}}).max_context, 1100);
  EXPECT_THROW(parse(json{{"type", "gpu-only"}, {"rworkers", json::object()}}), ConfigError);
  // The GPU weight and activation type: fp16 (default) or bf16; with the fastdecode engine only on the
  // cuda (or auto) backend, since the cpu backend computes in fp32.
  EXPECT_EQ(gpu_only(json{{"type", "gpu-only"}}).dtype, "fp16");
  EXPECT_EQ(gpu_only(json{{"type", "gpu-only"}, {"dtype", "bf16"}}).dtype, "bf16");
  EXPECT_THROW(parse(json{{"type", "gpu-only"}, {"dtype", "fp32"}}), ConfigError);
  // Asynchronous stepping: on by default, off when asked, echoed in the config; not a bool: refused.
  EXPECT_TRUE(gpu_only(json{{"type", "gpu-only"}}).async_steps);
  EXPECT_FALSE(gpu_only(json{{"type", "gpu-only"}, {"async_steps", false}}).async_steps);
  EXPECT_EQ(gpu_only(json{{"type", "gpu-only"}, {"async_steps", false}}).to_json().at("async_steps"), false);
  EXPECT_THROW(parse(json{{"type", "gpu-only"}, {"async_steps", 1}}), ConfigError);
  EXPECT_EQ(std::any_cast<FastDecodeConfig>(parse(json{{"type", "fastdecode"}, {"backend", "cuda"}, {"dtype", "bf16"}}).config).dtype,
            "bf16");
  EXPECT_THROW(parse(json{{"type", "fastdecode"}, {"dtype", "bf16"}}), ConfigError);
  EXPECT_THROW(parse(json{{"type", "fastdecode"}, {"backend", "cpu"}, {"dtype", "bf16"}}), ConfigError);
  EXPECT_THROW(parse(json{{"type", "reference"}, {"dtype", "bf16"}}), ConfigError);
}

// The GPU-only engine's ranks (engine.parallel): rank g holds 1/T of its stage's share of the full model and of
// each sequence's KV. T = P = 1 through the parallel formula is gpu_only_slots exactly; T = 2 on two GPUs halves
// every rank's weights and KV, so each GPU holds more sequences; two ranks sharing one GPU hold what one rank does
// but pay a second 1 GiB reserve. By hand for Llama-2-7b at 24 GB and 1024 positions:
//   T = 2 on 2 GPUs: weights 6 738 415 616 bytes per rank; per sequence 262 144 x 1024 = 268 435 456 bytes plus a
//   row at half the widths: (24e9 - 6 738 415 616 - 1 073 741 824) / (268 435 456 + row) = 60.3 -> 60.
//   P = 2 on 2 GPUs: stage 0 holds the embedding (131 072 000 x 2 bytes) and half the layers, stage 1 half the
//   layers and the LM head: also 60 (each GPU the larger of its ranks' needs decides).
TEST(GpuOnlySlots, ParallelRanksShareTheModelAndTheKv) {
  const ModelConfig c = cfg("llama-2-7b");
  const std::vector<std::pair<int64_t, int64_t>> one = {{0, 32}}, two = {{0, 16}, {16, 32}};
  EXPECT_EQ(gpu_only_parallel_slots(c, 1, one, {0}, 24e9, 1024), gpu_only_slots(c, 24e9, 1024));
  const GpuOnlyRankMemory whole = gpu_only_rank_memory(c, 1, 1, 0, 32, 1024);
  const GpuOnlyRankMemory half = gpu_only_rank_memory(c, 2, 1, 0, 32, 1024);
  EXPECT_DOUBLE_EQ(half.weights * 2, whole.weights);
  EXPECT_EQ(gpu_only_parallel_slots(c, 2, one, {0, 1}, 24e9, 1024), 60);
  EXPECT_EQ(gpu_only_parallel_slots(c, 1, two, {0, 1}, 24e9, 1024), 60);
  // The two stages' weights add up to the whole model's (a tied or untied head: Llama-2 is untied).
  const GpuOnlyRankMemory s0 = gpu_only_rank_memory(c, 1, 2, 0, 16, 1024), s1 = gpu_only_rank_memory(c, 1, 2, 1, 16, 1024);
  EXPECT_NEAR(s0.weights + s1.weights, whole.weights, 1.0);
  EXPECT_NEAR(s0.per_seq - gpu_only_row_bytes(shard_config(c, 1, 16)) + s1.per_seq - gpu_only_row_bytes(shard_config(c, 1, 16)),
              whole.per_seq - gpu_only_row_bytes(c), 1.0);
  // Both ranks on one GPU: the same weights and KV per sequence as one rank, one more reserve.
  EXPECT_LE(gpu_only_parallel_slots(c, 2, one, {0, 0}, 24e9, 1024), gpu_only_slots(c, 24e9, 1024));
  EXPECT_EQ(gpu_only_parallel_slots(c, 2, one, {0, 0}, 24e9, 1024),
            int64_t((24e9 - whole.weights - 2.0 * double(1ull << 30)) / (2 * half.per_seq)));
  // Reduced layers keep the full-depth accounting, per stage.
  EXPECT_EQ(gpu_only_parallel_slots(with_layers(c, 2), 1, {{0, 1}, {1, 2}}, {0, 1}, 24e9, 1024), 60);
  // The section parses engine.parallel like the fastdecode engine's.
  auto parse = [](json j) { return parse_engine_spec(StrictObject(j, "x.json", "engine")); };
  const auto go = std::any_cast<GpuOnlyConfig>(
      parse(json{{"type", "gpu-only"}, {"parallel", {{"tensor", 2}, {"pipeline", 2}, {"waves", 3}}}}).config);
  EXPECT_EQ(go.parallel.ranks(), 4);
  EXPECT_EQ(go.parallel.wave_count(), 3);
  EXPECT_EQ(std::any_cast<GpuOnlyConfig>(parse(json{{"type", "gpu-only"}, {"parallel", {{"pipeline", 2}}}}).config)
                .parallel.wave_count(),
            2);  // waves default to the stages
  EXPECT_THROW(parse(json{{"type", "gpu-only"}, {"parallel", {{"waves", 16}}}}), ConfigError);
  EXPECT_THROW(parse(json{{"type", "gpu-only"}, {"parallel", {{"stages", 2}}}}), ConfigError);
}

TEST(WaveBounds, EvenCutsWithoutEmptyWaves) {
  EXPECT_EQ(wave_bounds(10, 3), (std::vector<size_t>{0, 4, 7, 10}));
  EXPECT_EQ(wave_bounds(2, 4), (std::vector<size_t>{0, 1, 2}));
  EXPECT_EQ(wave_bounds(5, 1), (std::vector<size_t>{0, 5}));
  EXPECT_EQ(wave_bounds(0, 2), (std::vector<size_t>{0, 0}));
}

// ---- Per-request sampling, teacher forcing and logits recording (issue 11) on the reference engine ----

namespace {

Request make_req(const ModelConfig& c, uint64_t id, int64_t prompt_len, int64_t gen) {
  Request q;
  q.id = id;
  for (int64_t t = 0; t < prompt_len; ++t) q.prompt.push_back(int32_t(3 + (id * 41 + uint64_t(t) * 17) % uint64_t(c.vocab_size - 3)));
  q.max_new_tokens = gen;
  return q;
}

SamplingParams params(double temperature, int64_t top_k, double top_p, uint64_t seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.seed = seed;
  return p;
}

// A batch mixing greedy, temperature, top-k, top-p and different seeds, one request each (the run's
// sampling for the request that sets none).
std::vector<Request> mixed_sampling_requests(const ModelConfig& c) {
  std::vector<Request> r;
  for (uint64_t i = 0; i < 6; ++i) r.push_back(make_req(c, 20 + i, 3 + int64_t(i) * 2, 12 + int64_t(i)));
  r[1].sampling = params(0, 0, 1, 0);         // greedy in a sampled run
  r[2].sampling = params(0.7, 8, 1, 11);      // top-k
  r[3].sampling = params(1.0, 0, 0.8, 11);    // top-p
  r[4].sampling = params(1.0, 0, 0.8, 12);    // the same, another seed
  r[5].sampling = params(1.3, 20, 0.9, 2);    // all three
  return r;                                   // r[0]: the run's
}

}  // namespace

// Each request's tokens in a mixed batch are those it gets alone with its params as the run's sampling.
TEST(ReferenceEngineIssue11, PerRequestSamplingMatchesSoloRuns) {
  const ModelConfig c = cfg("tiny-llama");
  const SamplingParams run = params(0.9, 0, 1, 5);
  const auto reqs = mixed_sampling_requests(c);
  auto src = make_random_source(2, DType::F16);
  ReferenceEngine e(c, *src, run);
  const fd::test::EngineRun got = fd::test::run_engine(e, reqs);
  ASSERT_TRUE(got.errors.empty()) << got.describe_errors();
  for (const Request& r : reqs) {
    Request alone = r;
    alone.sampling.reset();
    auto s2 = make_random_source(2, DType::F16);
    ReferenceEngine solo(c, *s2, r.sampling ? *r.sampling : run);
    EXPECT_EQ(got.tokens.at(r.id), fd::test::run_tokens(solo, {alone}).at(r.id)) << "request " << r.id;
  }
  EXPECT_EQ(got.tokens.at(21), solo_greedy(c, reqs[1]));
  // The params matter: the same top-p request with another seed draws other tokens.
  EXPECT_NE(got.tokens.at(23), got.tokens.at(24));
  auto w = make_random_source(2, DType::F16);
  const auto check = fd::test::check_scored_run(load_model_weights(c, *w), {DType::F32}, reqs, run, got, 0, 0);
  EXPECT_TRUE(check.ok()) << check.describe();
}

// Teacher forcing and logits recording: a forced request emits the model's pick at each forced prefix
// and its recorded rows are the reference model's logits after prompt + forced[:i]; free-running
// requests next to it keep their tokens; requests without the flag get no logits.
TEST(ReferenceEngineIssue11, ForcedAndRecordedLogits) {
  const ModelConfig c = cfg("tiny-llama");
  std::vector<Request> reqs = {make_req(c, 7, 5, 10), make_req(c, 8, 4, 10), make_req(c, 9, 6, 14), make_req(c, 10, 3, 9)};
  for (int64_t i = 0; i < 10; ++i) reqs[0].forced.push_back(int32_t(5 + (i * 53) % (c.vocab_size - 5)));
  reqs[0].record_logits = true;
  reqs[1].record_logits = true;
  for (int64_t i = 0; i < 9; ++i) reqs[3].forced.push_back(int32_t(7 + (i * 29) % (c.vocab_size - 7)));
  reqs[3].sampling = params(1.0, 0, 1, 3);  // a forced request that samples: its picks use (seed, id, step)
  auto src = make_random_source(2, DType::F16);
  ReferenceEngine e(c, *src, SamplingParams{});
  const fd::test::EngineRun got = fd::test::run_engine(e, reqs);
  ASSERT_TRUE(got.errors.empty()) << got.describe_errors();
  auto w = make_random_source(2, DType::F16);
  const ModelWeights weights = load_model_weights(c, *w);
  const auto check = fd::test::check_scored_run(weights, {DType::F32}, reqs, SamplingParams{}, got, 1e-6, 0);
  EXPECT_TRUE(check.ok()) << check.describe();
  EXPECT_EQ(check.rows, 20u);
  EXPECT_EQ(got.logits.at(7).size(), 10u);
  EXPECT_EQ(got.logits.at(7)[0].size(), size_t(c.vocab_size));
  EXPECT_EQ(got.logits.count(9) + got.logits.count(10), 0u);
  // Free-running neighbours are unchanged by the forced ones.
  EXPECT_EQ(got.tokens.at(8), solo_greedy(c, reqs[1]));
  EXPECT_EQ(got.tokens.at(9), solo_greedy(c, reqs[2]));
  // The forcing is real: the forced stream is not what the model would pick, and the picks differ
  // from the free-running continuation of the same prompt.
  size_t differ = 0;
  for (size_t i = 0; i < reqs[0].forced.size(); ++i) differ += reqs[0].forced[i] != got.tokens.at(7)[i];
  EXPECT_GE(differ, 5u);
  Request free7 = reqs[0];
  free7.forced.clear();
  EXPECT_NE(got.tokens.at(7), solo_greedy(c, free7));
}

// Under a GPU memory budget (hardware balance) FastDecode's CUDA S-Part must hold the full-depth fp16
// weights, as every GPU engine's accounting asks: Llama-2-13b (26 GB of weights) at an A10's 24 GB is
// refused before anything is made, at any reduced depth; its KV-cache (on the R-workers) does not count.
TEST(FastDecodeEngine, GpuBudgetMustHoldTheFullDepthWeights) {
  ModelConfig m = with_layers(load_model_config(repo_path("experiments/models/llama-2-13b.json")), 1);
  auto src = make_random_source(2, DType::F16);
  FastDecodeConfig f;
  f.backend = "cuda";
  HardwareBalance hw;
  hw.gpu_memory_gb = 24;
  EXPECT_THAT(fd::test::error_message<Error>([&] { make_fastdecode_engine(f, EngineContext{m, *src, {}, hw}); }),
              ::testing::HasSubstr("do not hold the full-depth fp16 weights of llama-2-13b"));
}

// The hybrid engine's section (extensions/hybrid): the controller's keys, R-workers as the fastdecode engine's,
// migration refused (not built), registration refused; without CUDA the engine says what the build lacks.
TEST(HybridConfig, ParsesAndRefuses) {
  auto parse = [](json j) { return parse_engine_spec(StrictObject(j, "x.json", "engine")); };
  const auto h = std::any_cast<HybridConfig>(
      parse(json{{"type", "hybrid"}, {"max_context", 300}, {"controller", {{"mode", "fixed-fraction"}, {"cpu_fraction", 0.25}}},
                 {"rworkers", {{"spawn", 3}, {"memory_gb", 2}}}})
          .config);
  EXPECT_EQ(h.max_context, 300);
  EXPECT_EQ(h.controller.mode, HybridMode::FixedFraction);
  EXPECT_DOUBLE_EQ(h.controller.cpu_fraction, 0.25);
  EXPECT_EQ(h.controller.max_moves_per_step, 0);
  EXPECT_EQ(h.rworkers.spawn, 3);
  EXPECT_THROW(parse(json{{"type", "hybrid"}, {"controller", {{"max_moves_per_step", 2}}}}), ConfigError);
  EXPECT_THROW(parse(json{{"type", "hybrid"}, {"controller", {{"mode", "sometimes"}}}}), ConfigError);
  EXPECT_THROW(parse(json{{"type", "hybrid"}, {"rworkers", {{"register", "tcp://0.0.0.0:5600"}, {"expect", 2}}}}), ConfigError);
  EXPECT_THROW(parse(json{{"type", "hybrid"}, {"parallel", {{"tensor", 2}}}}), ConfigError);  // not built for hybrid
  // Keys the hybrid engine has no mechanism for are refused, not ignored; its echo says what it does.
  for (const json& rw : {json{{"on_failure", "recover"}}, json{{"shm_in_place", false}}, json{{"append_chunk_kb", 64}}})
    EXPECT_THROW(parse(json{{"type", "hybrid"}, {"rworkers", rw}}), ConfigError) << rw.dump();
  EXPECT_NO_THROW(parse(json{{"type", "hybrid"}, {"rworkers", {{"on_failure", "fail"}}}}));
  const json echo = engine_spec_to_json(parse(json{{"type", "hybrid"}}));
  EXPECT_EQ(echo.at("controller").at("mode"), "auto");
  EXPECT_EQ(echo.at("rworkers").at("spawn"), 2);
  EXPECT_EQ(echo.at("rworkers").at("on_failure"), "fail");
  EXPECT_FALSE(echo.at("rworkers").contains("shm_in_place"));
}

// The flags of a spawned R-worker, from the one builder both launchers use (the hybrid engine's dropped --query).
TEST(RWorkersConfig, SpawnArgsCarryEveryWorkerKey) {
  RWorkersConfig r;
  r.threads = 3, r.kv_dtype = "int4", r.query = "fp32", r.memory_gb = 2, r.spin_us = 50, r.pin = true;
  EXPECT_EQ(r.spawn_args("rworker1", 3), (std::vector<std::string>{"--threads", "3", "--kv-dtype", "int4", "--memory-gb", "2.000000",
                                                                  "--name", "rworker1", "--query", "fp32", "--spin-us", "50",
                                                                  "--cpus", "3-5"}));
  r.query = "auto", r.spin_us = 0, r.pin = false;
  EXPECT_EQ(r.spawn_args("w", 0), (std::vector<std::string>{"--threads", "3", "--kv-dtype", "int4", "--memory-gb", "2.000000",
                                                           "--name", "w"}));
}
