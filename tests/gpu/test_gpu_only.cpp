// The GPU-only engine and FastDecode with the CUDA S-Part (fp16 wire) vs the reference engine with an
// fp16 KV-cache: greedy tokens compared over 64 steps. fp16 GEMM inputs (and fp16 on the wire) may flip a
// near-tie, so tokens must agree until the first divergence and there the reference's own logits must be
// a near-tie: the gap between its token and the engine's within 5e-3 of the largest |logit| (the stages
// are within ~3e-4 of fp32, artifacts/sworker). The GPU-only engine's memory bound: with fewer slots than requests, the rest wait and finish.
// Skips when no CUDA device answers (label gpu).
#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "baselines/gpu_only/gpu_only_engine.h"
#include "baselines/reference/reference_engine.h"
#ifdef FD_HAVE_CUDA
#include <cublasLt.h>

#include "fastdecode/spart/cuda_model.h"
#endif
#include "kernels/cuda/device_info.h"
#include "tests/gpu/require_gpu.h"
#include "fastdecode/sworker/fastdecode_engine.h"
#include "tests/unit/test_helpers.h"
#include "tests/unit/token_compare.h"

using namespace fd;
using fd::test::repo_path;

namespace {

using fd::test::Tokens;

using fd::test::run_tokens;

// FastDecode with the CUDA S-Part and 2 local R-workers.
FastDecodeConfig cuda_fastdecode() {
  FastDecodeConfig f;
  f.backend = "cuda";
  f.rworkers.spawn = 2;
  f.rworkers.memory_gb = 0.2;
  f.rworkers.binary = std::string(FD_BIN_DIR) + "/fd-rworker";
  return f;
}

constexpr double kNearTie = 5e-3;
// bf16 rounds each activation to 2^-8 relative (8x fp16's step): the bf16 S-Part's logits are within
// 2.8e-3 of max |logit| of the fp32 stages (test_cuda_spart, H200), so a token may flip where the
// reference's gap is below twice that. Measured on the H200 with teacher forcing: worst flip 2.34e-3.
constexpr double kNearTieBf16 = 6e-3;

std::vector<Request> requests(int n, int64_t gen) {
  std::vector<Request> reqs;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> prompt;
    for (int t = 0; t < 3 + 5 * i; ++t) prompt.push_back(int32_t((i * 31 + t * 7 + 5) % 200));
    reqs.push_back({uint64_t(100 + i), prompt, gen, false});
  }
  return reqs;
}

class GpuEngines : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    FD_SKIP_WITHOUT_GPU();
  }
};

}  // namespace

TEST_P(GpuEngines, GreedyTokensVsReference) {
  const ModelConfig c = load_model_config(repo_path(std::string("experiments/models/") + GetParam() + ".json"));
  const auto reqs = requests(6, 64);
  auto w0 = make_random_source(3, DType::F16);
  const ModelWeights weights = load_model_weights(c, *w0);
  auto check = [&](auto make, const char* what) {
    auto w = make_random_source(3, DType::F16);
    auto e = make(EngineContext{c, *w});
    const auto k = fd::test::check_greedy_tokens(weights, {DType::F16}, reqs, run_tokens(*e, reqs), kNearTie);
    std::printf("%s %s vs reference: %s\n", GetParam(), what, k.describe().c_str());
    EXPECT_TRUE(k.ok()) << what << ": " << k.describe();
  };
  GpuOnlyConfig go;
  go.max_context = 128;
  go.cuda_graphs = false;
  check([&](const EngineContext& x) { return make_gpu_only_engine(go, x); }, "gpu-only");
  go.cuda_graphs = true;  // the same kernels replayed from graphs (batch padded): the same tokens
  check([&](const EngineContext& x) { return make_gpu_only_engine(go, x); }, "gpu-only (CUDA graphs)");
  FastDecodeConfig fdc = cuda_fastdecode();
  for (const char* wire : {"fp16", "fp32"}) {
    fdc.wire_dtype = wire;
    check([&](const EngineContext& x) { return make_fastdecode_engine(fdc, x); },
          wire[2] == '1' ? "fastdecode (cuda, fp16 wire)" : "fastdecode (cuda, fp32 wire)");
  }
}

#ifdef FD_HAVE_CUDA
// With a GEMM table (fastdecode/spart/gemm_table.h) that names a cuBLASLt algorithm other than the heuristic's first
// for every weight GEMM problem the run can meet (its shapes at 1-512 rows: decode batches, graph buckets, prefills),
// the engines take it (engine_info / the S-Part's description say so) and give the reference's greedy tokens under
// the same near-tie rule: the algorithm changes the order of the sums, nothing else.
TEST_P(GpuEngines, GreedyTokensWithAGemmTable) {
  const ModelConfig c = load_model_config(repo_path(std::string("experiments/models/") + GetParam() + ".json"));
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  GemmTable t;
  t.device = prop.name;
  t.cublaslt_version = int64_t(cublasLtGetVersion());
  const int64_t H = c.hidden_size, I = c.intermediate_size, qd = c.q_dim(), kvd = c.kv_dim();
  for (int64_t rows = 1; rows <= 512; ++rows)
    for (const GemmProblem& p : {GemmProblem{qd + 2 * kvd, H, rows, DType::F16, false, false},
                                 GemmProblem{H, qd, rows, DType::F16, true, true},
                                 GemmProblem{c.arch == Arch::Llama ? 2 * I : I, H, rows, DType::F16, false, false},
                                 GemmProblem{H, I, rows, DType::F16, true, true},
                                 GemmProblem{c.vocab_size, H, rows, DType::F16, true, false}})
      t.set(p, 1);  // the heuristic's second algorithm (its first where it offers one only: cuBLAS's default then)
  fd::test::TempDir dir("gemm-table");
  const std::string file = dir.file("table.json");
  write_json_file(file, t.to_json());
  const auto reqs = requests(6, 64);
  auto w0 = make_random_source(3, DType::F16);
  const ModelWeights weights = load_model_weights(c, *w0);
  auto check = [&](auto make, const char* what) {
    auto w = make_random_source(3, DType::F16);
    EngineContext ctx{c, *w};
    ctx.hardware.gpu_gemm_table = file;
    auto e = make(ctx);
    const std::string info = e->info().dump();
    EXPECT_TRUE(info.find("\"used\":true") != std::string::npos || info.find("GEMM algorithms from " + file) != std::string::npos)
        << what << ": the table is not in use: " << info;
    const auto k = fd::test::check_greedy_tokens(weights, {DType::F16}, reqs, run_tokens(*e, reqs), kNearTie);
    std::printf("%s %s with a GEMM table vs reference: %s\n", GetParam(), what, k.describe().c_str());
    EXPECT_TRUE(k.ok()) << what << ": " << k.describe();
  };
  GpuOnlyConfig go;
  go.max_context = 128;
  for (bool graphs : {false, true}) {
    go.cuda_graphs = graphs;
    check([&](const EngineContext& x) { return make_gpu_only_engine(go, x); }, graphs ? "gpu-only (CUDA graphs)" : "gpu-only");
  }
  FastDecodeConfig fdc = cuda_fastdecode();
  fdc.wire_dtype = "fp16";
  check([&](const EngineContext& x) { return make_fastdecode_engine(fdc, x); }, "fastdecode (cuda)");
}
#endif

// bf16 weights and activations (weights drawn as bf16, so the reference holds the same values): the
// reference's own logits must be a near-tie at bf16 resolution wherever the tokens diverge (bf16 rounds
// each activation to 2^-8 relative, 8x fp16's step).
TEST_P(GpuEngines, Bf16GreedyTokensVsReference) {
  const ModelConfig c = load_model_config(repo_path(std::string("experiments/models/") + GetParam() + ".json"));
  const auto reqs = requests(6, 64);
  auto w0 = make_random_source(8, DType::BF16);
  const ModelWeights weights = load_model_weights(c, *w0);
  auto check = [&](auto make, const char* what) {
    auto w = make_random_source(8, DType::BF16);
    auto e = make(EngineContext{c, *w});
    const auto k = fd::test::check_greedy_tokens(weights, {DType::F16}, reqs, run_tokens(*e, reqs), kNearTieBf16);
    std::printf("%s %s (bf16) vs reference: %s\n", GetParam(), what, k.describe().c_str());
    EXPECT_TRUE(k.ok()) << what << ": " << k.describe();
  };
  GpuOnlyConfig go;
  go.max_context = 128;
  go.dtype = "bf16";
  check([&](const EngineContext& x) { return make_gpu_only_engine(go, x); }, "gpu-only");
  FastDecodeConfig fdc = cuda_fastdecode();
  fdc.dtype = "bf16";
  fdc.wire_dtype = "fp16";
  check([&](const EngineContext& x) { return make_fastdecode_engine(fdc, x); }, "fastdecode (cuda, fp16 wire)");
}

// CUDA graphs replay the eager step's kernels on a batch padded to a power of two: the real rows'
// tokens must be identical to the eager engine's (same kernels and shapes per row... except the
// padded batch size, which may change cuBLAS's kernel choice: logits may differ in the last bits, so
// tokens are compared, with any difference printed).
TEST_P(GpuEngines, CudaGraphsSameTokensAsEager) {
  const ModelConfig c = load_model_config(repo_path(std::string("experiments/models/") + GetParam() + ".json"));
  const auto reqs = requests(5, 40);  // 5 running: padded to 8, then 4 and 2 as requests finish
  auto w0 = make_random_source(3, DType::F16);
  const ModelWeights weights = load_model_weights(c, *w0);
  for (const char* type : {"gpu-only", "fastdecode"}) {
    auto run_with = [&](bool graphs) {
      auto w = make_random_source(3, DType::F16);
      std::unique_ptr<Engine> e;
      if (std::string(type) == "fastdecode") {  // each mini-batch's S-Part stages from graphs (rows padded)
        FastDecodeConfig fc = cuda_fastdecode();
        fc.wire_dtype = "fp16";
        fc.cuda_graphs = graphs;
        e = make_fastdecode_engine(fc, {c, *w});
      } else {
        GpuOnlyConfig go;
        go.max_context = 128;
        go.cuda_graphs = graphs;
        e = make_gpu_only_engine(go, {c, *w});
      }
      return run_tokens(*e, reqs);
    };
    const Tokens eager = run_with(false), graphs = run_with(true);
    size_t same = 0, total = 0;
    for (const auto& [id, t] : eager)
      for (size_t i = 0; i < t.size(); ++i, ++total) same += i < graphs.at(id).size() && graphs.at(id)[i] == t[i];
    std::printf("%s %s: CUDA graphs vs eager: %zu of %zu tokens equal\n", GetParam(), type, same, total);
    EXPECT_EQ(graphs.size(), eager.size());
    // Each run judged against the reference on its own, every token teacher-forced.
    for (const Tokens* t : {&eager, &graphs}) {
      const auto k = fd::test::check_greedy_tokens(weights, {DType::F16}, reqs, *t, kNearTie);
      EXPECT_TRUE(k.ok()) << type << (t == &eager ? " eager: " : " graphs: ") << k.describe();
    }
  }
}

// Per-request sampling, teacher forcing and logits recording (issue 11) on the GPU engines: the batch of
// fd::test::issue11_requests (every request recording, plus one greedy request that does not), some
// joining later, judged by check_scored_run against the fp16-KV reference along the stream each sequence
// really has (its forced tokens when forced): each recorded row within kRowTol of the reference's logits
// (the stage tolerance of test_cuda_spart), each pick the reference's (greedy: or a near-tie within
// kNearTie; sampled: or, when it differs, the pick of the engine's own row, fd::sample_token with the
// request's params and (id, step)). Each free-running request run alone on the GPU-only engine with its
// params as the run's sampling is judged the same way (equal tokens counted and printed: batch shape may
// move the logits' last bits).
constexpr double kRowTol = 2e-3;

TEST_P(GpuEngines, PerRequestSamplingForcingAndLogits) {
  const ModelConfig c = load_model_config(repo_path(std::string("experiments/models/") + GetParam() + ".json"));
  SamplingParams run;
  run.temperature = 0.9, run.seed = 5;
  std::vector<Request> all = fd::test::issue11_requests(c, true);
  Request plain = all[0];  // greedy, records nothing: gets no logits
  plain.id = 39;
  plain.sampling = SamplingParams{};
  plain.record_logits = false;
  all.push_back(plain);
  const std::vector<Request> first(all.begin(), all.begin() + 5);
  const std::map<int64_t, std::vector<Request>> arrivals = {{3, {all[5], all[6], all[9]}}, {5, {all[7], all[8]}}};
  auto w0 = make_random_source(3, DType::F16);
  const ModelWeights weights = load_model_weights(c, *w0);
  auto judge = [&](const std::vector<Request>& reqs, const SamplingParams& sp, const fd::test::EngineRun& got,
                   const std::string& what) {
    EXPECT_TRUE(got.errors.empty()) << what << ": " << got.describe_errors();
    const auto k = fd::test::check_scored_run(weights, {DType::F16}, reqs, sp, got, kRowTol, kNearTie);
    std::printf("%s %s issue 11: %s\n", GetParam(), what.c_str(), k.describe().c_str());
    EXPECT_TRUE(k.ok()) << what << ": " << k.describe();
  };
  fd::test::EngineRun solo_ref;
  for (int kind = 0; kind < 3; ++kind) {
    auto w = make_random_source(3, DType::F16);
    std::unique_ptr<Engine> e;
    GpuOnlyConfig go;
    go.max_context = 128;
    go.cuda_graphs = kind == 1;
    if (kind < 2) {
      e = make_gpu_only_engine(go, {c, *w, run});
    } else {
      FastDecodeConfig fdc = cuda_fastdecode();
      fdc.wire_dtype = "fp16";
      e = make_fastdecode_engine(fdc, {c, *w, run});
    }
    const char* what = kind == 0 ? "gpu-only" : kind == 1 ? "gpu-only (CUDA graphs)" : "fastdecode (cuda, fp16 wire)";
    const fd::test::EngineRun got = fd::test::run_engine(*e, first, arrivals);
    judge(all, run, got, what);
    EXPECT_EQ(got.logits.size(), all.size() - 1) << what;
    EXPECT_EQ(got.logits.count(39), 0u) << what;
    if (kind == 0) solo_ref = got;
  }
  size_t same = 0, total = 0;
  for (const Request& r : all) {
    if (!r.forced.empty()) continue;
    Request alone = r;
    alone.sampling.reset();
    const SamplingParams sp = r.sampling ? *r.sampling : run;
    auto w = make_random_source(3, DType::F16);
    GpuOnlyConfig go;
    go.max_context = 128;
    go.cuda_graphs = false;
    auto e = make_gpu_only_engine(go, {c, *w, sp});
    const fd::test::EngineRun got = fd::test::run_engine(*e, {alone});
    judge({alone}, sp, got, "gpu-only alone, request " + std::to_string(r.id));
    const auto& a = got.tokens.at(r.id);
    const auto& b = solo_ref.tokens.at(r.id);
    for (size_t i = 0; i < a.size() && i < b.size(); ++i, ++total) same += a[i] == b[i];
  }
  std::printf("%s gpu-only: %zu of %zu tokens of the free-running requests equal alone and in the batch\n", GetParam(),
              same, total);
}

// The GPU-only engine's CUDA-graph step (all rows greedy) records logits too: rows copied after the replay,
// forced and free greedy requests, judged as above.
TEST_P(GpuEngines, GraphStepRecordsLogitsAndForces) {
  const ModelConfig c = load_model_config(repo_path(std::string("experiments/models/") + GetParam() + ".json"));
  std::vector<Request> reqs = requests(5, 24);
  reqs[1].record_logits = true;
  reqs[3].record_logits = true;
  for (int64_t i = 0; i < reqs[3].max_new_tokens; ++i) reqs[3].forced.push_back(int32_t(7 + (i * 41) % (c.vocab_size - 7)));
  auto w0 = make_random_source(3, DType::F16);
  const ModelWeights weights = load_model_weights(c, *w0);
  auto w = make_random_source(3, DType::F16);
  GpuOnlyConfig go;
  go.max_context = 128;
  go.cuda_graphs = true;
  auto e = make_gpu_only_engine(go, {c, *w});
  const fd::test::EngineRun got = fd::test::run_engine(*e, reqs);
  EXPECT_TRUE(got.errors.empty()) << got.describe_errors();
  const auto k = fd::test::check_scored_run(weights, {DType::F16}, reqs, SamplingParams{}, got, kRowTol, kNearTie);
  std::printf("%s gpu-only (CUDA graphs) greedy recording: %s\n", GetParam(), k.describe().c_str());
  EXPECT_TRUE(k.ok()) << k.describe();
  EXPECT_EQ(got.logits.size(), 2u);
}

// Past the largest power-of-two bucket: 150 running rows replay the graph of 192 (then 128, 64, ... as requests
// finish at different lengths), the tokens equal to the eager engine's and each run teacher-forced against the
// reference.
TEST_P(GpuEngines, CudaGraphsPastThePowerOfTwoBuckets) {
  const ModelConfig c = load_model_config(repo_path(std::string("experiments/models/") + GetParam() + ".json"));
  std::vector<Request> reqs;
  for (int i = 0; i < 150; ++i) {
    std::vector<int32_t> prompt;
    for (int t = 0; t < 4 + i % 7; ++t) prompt.push_back(int32_t((i * 37 + t * 11 + 3) % 200));
    reqs.push_back({uint64_t(1000 + i), prompt, int64_t(3 + i % 4), false});
  }
  auto w0 = make_random_source(5, DType::F16);
  const ModelWeights weights = load_model_weights(c, *w0);
  auto run_with = [&](bool graphs) {
    auto w = make_random_source(5, DType::F16);
    GpuOnlyConfig go;
    go.max_context = 32;
    go.cuda_graphs = graphs;
    auto e = make_gpu_only_engine(go, {c, *w});
    return run_tokens(*e, reqs);
  };
  const Tokens eager = run_with(false), graphs = run_with(true);
  size_t same = 0, total = 0;
  for (const auto& [id, t] : eager)
    for (size_t i = 0; i < t.size(); ++i, ++total) same += i < graphs.at(id).size() && graphs.at(id)[i] == t[i];
  std::printf("%s gpu-only, 150 rows: CUDA graphs vs eager: %zu of %zu tokens equal\n", GetParam(), same, total);
  EXPECT_EQ(graphs.size(), eager.size());
  for (const Tokens* t : {&eager, &graphs}) {
    const auto k = fd::test::check_greedy_tokens(weights, {DType::F16}, reqs, *t, kNearTie);
    EXPECT_TRUE(k.ok()) << (t == &eager ? "eager: " : "graphs: ") << k.describe();
  }
}

// Asynchronous stepping (engine.async_steps, on by default with graphs): each greedy decode step is launched before
// the host reads the step before's tokens, which feed it on the device. Requests end at 9..39 tokens, so rows leave
// the batch ahead of time. (1) Without eos the batches are the synchronous engine's: the same tokens, bit for bit.
// (2) With eos (its id set to the 4th token request 102 emits; every request stopping at it) a row ended by eos is
// computed once more and dropped (counted): same lengths, each run judged against the reference. (3) Requests
// arriving mid-run (before steps 3 and 9) take the synchronous path until they are in: judged the same way. (4)
// below: fewer slots than requests.
TEST_P(GpuEngines, AsyncStepsSameTokensAsSync) {
  const ModelConfig c = load_model_config(repo_path(std::string("experiments/models/") + GetParam() + ".json"));
  std::vector<Request> reqs = requests(6, 40);
  for (size_t i = 0; i < reqs.size(); ++i) reqs[i].max_new_tokens = 9 + 6 * int64_t(i);
  auto run = [&](const ModelConfig& cfg, bool async, const std::vector<Request>& rs,
                 const std::map<int64_t, std::vector<Request>>& arrivals) {
    auto w = make_random_source(3, DType::F16);
    GpuOnlyConfig go;
    go.max_context = 128;
    go.cuda_graphs = true;
    go.async_steps = async;
    auto e = make_gpu_only_engine(go, {cfg, *w});
    fd::test::EngineRun r = fd::test::run_engine(*e, rs, arrivals);
    EXPECT_TRUE(r.errors.empty()) << r.describe_errors();
    return r;
  };
  auto judge = [&](const ModelConfig& cfg, const std::vector<Request>& rs, const Tokens& t, const char* what) {
    auto w = make_random_source(3, DType::F16);
    const auto k = fd::test::check_greedy_tokens(load_model_weights(cfg, *w), {DType::F16}, rs, t, kNearTie);
    std::printf("%s gpu-only %s vs reference: %s\n", GetParam(), what, k.describe().c_str());
    EXPECT_TRUE(k.ok()) << what << ": " << k.describe();
  };
  const auto sync = run(c, false, reqs, {}), async = run(c, true, reqs, {});
  EXPECT_EQ(sync.counts.count("async_steps"), 0u);
  EXPECT_GT(async.counts.count("async_steps") ? async.counts.at("async_steps") : 0, 20);
  EXPECT_EQ(async.tokens, sync.tokens);
  judge(c, reqs, async.tokens, "async");

  ModelConfig ce = c;
  const std::vector<int32_t>& t102 = sync.tokens.at(102);
  ce.eos_token_id = t102.at(3);
  const size_t stop_len = size_t(std::find(t102.begin(), t102.end(), ce.eos_token_id) - t102.begin()) + 1;
  std::vector<Request> stop = reqs;
  for (Request& r : stop) r.stop_at_eos = true;
  const auto se = run(ce, false, stop, {}), ae = run(ce, true, stop, {});
  EXPECT_EQ(ae.tokens.at(102).size(), stop_len);
  EXPECT_GT(ae.counts.count("async_dropped_rows") ? ae.counts.at("async_dropped_rows") : 0, 0);
  size_t same = 0, total = 0;
  for (const auto& [id, t] : se.tokens) {
    EXPECT_EQ(ae.tokens.at(id).size(), t.size()) << "request " << id;
    for (size_t i = 0; i < t.size() && i < ae.tokens.at(id).size(); ++i, ++total) same += ae.tokens.at(id)[i] == t[i];
  }
  std::printf("%s gpu-only with eos: async vs sync %zu of %zu tokens equal\n", GetParam(), same, total);
  judge(ce, stop, ae.tokens, "async with eos");

  const std::vector<Request> first(reqs.begin(), reqs.begin() + 4);
  const std::map<int64_t, std::vector<Request>> arrivals = {{3, {reqs[4]}}, {9, {reqs[5]}}};
  const auto aa = run(c, true, first, arrivals);
  EXPECT_GT(aa.counts.count("async_steps") ? aa.counts.at("async_steps") : 0, 0);
  judge(c, reqs, aa.tokens, "async with arrivals");

  // (4) Three slots for the six: the queued wait with no slot free (steps still launched ahead) and start when one
  // frees, at the same step as the synchronous engine: the same tokens, bit for bit.
  const int64_t max_ctx = 128;
  const GpuOnlyRankMemory m = gpu_only_rank_memory(c, 1, 1, 0, c.num_layers, max_ctx);
  HardwareBalance hw;
  hw.gpu_memory_gb = (m.weights + double(1ull << 30) + 3.5 * m.per_seq) / 1e9;
  ASSERT_EQ(gpu_only_slots(c, hw.gpu_memory_gb * 1e9, max_ctx), 3);
  auto run_slots = [&](bool async) {
    auto w = make_random_source(3, DType::F16);
    GpuOnlyConfig go;
    go.max_context = max_ctx;
    go.async_steps = async;
    auto e = make_gpu_only_engine(go, {c, *w, SamplingParams{}, hw});
    fd::test::EngineRun r = fd::test::run_engine(*e, reqs);
    EXPECT_TRUE(r.errors.empty()) << r.describe_errors();
    EXPECT_LE(r.max_running, 3);
    return r;
  };
  const auto s3 = run_slots(false), a3 = run_slots(true);
  EXPECT_GT(a3.counts.count("async_steps") ? a3.counts.at("async_steps") : 0, 20);
  EXPECT_EQ(a3.tokens, s3.tokens);
  EXPECT_EQ(a3.steps, s3.steps);
}

INSTANTIATE_TEST_SUITE_P(Models, GpuEngines, ::testing::Values("tiny-llama", "tiny-opt", "tiny-llama-gqa",
                                                                          "tiny-opt-350m", "tiny-llama-bias"));

// A memory budget that leaves room for 3 sequences of Llama-2-7b-shaped (1 layer) runs: 8 requests
// run at most 3 at a time and all finish with their full length.
TEST(GpuOnly, BatchBoundedByMemoryBudget) {
  FD_SKIP_WITHOUT_GPU();
  const ModelConfig c = with_layers(load_model_config(repo_path("experiments/models/llama-2-7b.json")), 1);
  const int64_t max_ctx = 64;
  // Budget for exactly 3 slots (plus half a slot of slack).
  const double slot = double(c.kv_bytes_per_token(2, true)) * double(max_ctx);
  const double weights = double(with_layers(c, c.full_num_layers).num_params()) * 2;
  GpuOnlyConfig ec;
  ec.max_context = max_ctx;
  HardwareBalance hw;
  hw.gpu_memory_gb = (weights + double(1ull << 30) + 3.5 * slot) / 1e9;
  ASSERT_EQ(gpu_only_slots(c, hw.gpu_memory_gb * 1e9, max_ctx), 3);
  auto w = make_random_source(4, DType::F16);
  auto e = make_gpu_only_engine(ec, {c, *w, SamplingParams{}, hw});
  EXPECT_EQ(e->info().at("slots"), 3);
  EXPECT_EQ(e->capacity(1, 64).slots, 3);
  EXPECT_THROW(e->add({{1, std::vector<int32_t>(60, 1), 10, false}}), Error);  // 69 positions > max_context 64
  fd::test::EngineRun stats;
  const Tokens got = run_tokens(*e, requests(8, 10), &stats);
  const int64_t max_running = stats.max_running;
  EXPECT_EQ(got.size(), 8u);
  for (const auto& [id, t] : got) EXPECT_EQ(t.size(), 10u) << id;
  EXPECT_LE(max_running, 3);
  EXPECT_GE(max_running, 2);
}

// The trace of FastDecode on the CUDA S-Part (issue 18): a track per CUDA stream, one stream per mini-batch of the
// two mini-batch pipeline (slot m on stream m), each span a stage of that mini-batch's device work, beside a
// track per R-worker.
TEST(FastDecodeCuda, TraceHasATrackPerStreamAndPerWorker) {
  FD_SKIP_WITHOUT_GPU();
  const ModelConfig c = load_model_config(repo_path("experiments/models/tiny-llama.json"));
  auto w = make_random_source(3, DType::F16);
  auto e = make_fastdecode_engine(cuda_fastdecode(), EngineContext{c, *w});
  e->add(requests(6, 4));
  std::map<std::string, std::set<std::string>> tracks;  // track -> its span names
  int64_t steps = 0;
  while (!e->done() && steps++ < 100)
    for (const Span& s : e->step().spans) tracks[s.track].insert(s.name);
  // The workers' shared-memory regions, where ATTEND's replies land, are registered with the device (DMA copies up).
  ASSERT_FALSE(e->info()["rworkers"].empty()) << "no worker listed: the checks below would pass on nothing";
  for (const json& w : e->info()["rworkers"]) {
    EXPECT_EQ(w["shm"]["state"], "active") << w.dump();
    EXPECT_EQ(w["shm"]["device_registered"], true) << w.dump();
  }
  e->shutdown();
  for (int m = 0; m < 2; ++m) {
    const std::string track = "gpu stream " + std::to_string(m), mb = " mb" + std::to_string(m) + " ";
    ASSERT_TRUE(tracks.count(track)) << "no track " << track;
    for (const char* stage : {"q/k/v", "d2h", "h2d", "output+MLP"})
      EXPECT_TRUE(tracks[track].count("L0" + mb + stage) && tracks[track].count("L1" + mb + stage))
          << track << " lacks mini-batch " << m << "'s " << stage;
    for (const std::string& name : tracks[track])
      EXPECT_NE(name.find("mb" + std::to_string(m)), std::string::npos) << track << " holds another slot's " << name;
  }
  for (const char* worker : {"rworker 0", "rworker 1"}) EXPECT_TRUE(tracks.count(worker)) << "no track " << worker;
}

#ifdef FD_HAVE_CUDA
// Graph buckets (no device needed): powers of two up to 128 rows, then multiples of 64.
TEST(GraphCacheBuckets, PowersOfTwoThenStepsOf64) {
  using fd::GraphCache;
  EXPECT_EQ(GraphCache::bucket(1), 1);
  EXPECT_EQ(GraphCache::bucket(3), 4);
  EXPECT_EQ(GraphCache::bucket(65), 128);
  EXPECT_EQ(GraphCache::bucket(128), 128);
  EXPECT_EQ(GraphCache::bucket(129), 192);
  EXPECT_EQ(GraphCache::bucket(252), 256);
  EXPECT_EQ(GraphCache::bucket(1000), 1024);
  for (int64_t r = 1; r <= GraphCache::kMaxRows; ++r) {
    const int64_t b = GraphCache::bucket(r);
    ASSERT_GE(b, r);
    ASSERT_LE(b, GraphCache::kMaxRows);
    ASSERT_EQ(GraphCache::bucket(b), b) << r;  // a bucket is its own bucket: one graph per size
  }
  // The warm-up's sizes: for every bound, each batch of at most that many rows finds its bucket among them, and they
  // are buckets, each once, largest first.
  EXPECT_TRUE(GraphCache::buckets_down(0).empty());
  EXPECT_EQ(GraphCache::buckets_down(5), (std::vector<int64_t>{8, 4, 2, 1}));
  EXPECT_EQ(GraphCache::buckets_down(200).front(), 256);
  EXPECT_EQ(GraphCache::buckets_down(5000).front(), GraphCache::kMaxRows);
  for (int64_t n = 1; n <= GraphCache::kMaxRows; ++n) {
    const std::vector<int64_t> sizes = GraphCache::buckets_down(n);
    ASSERT_EQ(sizes.front(), GraphCache::bucket(n)) << n;
    for (size_t i = 0; i < sizes.size(); ++i) {
      ASSERT_EQ(GraphCache::bucket(sizes[i]), sizes[i]) << n;
      if (i > 0) ASSERT_LT(sizes[i], sizes[i - 1]) << n;
    }
    for (int64_t r = 1; r <= n; ++r)
      ASSERT_TRUE(std::find(sizes.begin(), sizes.end(), GraphCache::bucket(r)) != sizes.end()) << n << " rows " << r;
  }
}
#endif
