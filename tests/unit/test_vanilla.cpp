// The vanilla (LibTorch, HF-style static batching) engine on the CPU in fp32 against the reference model:
// greedy tokens on the tiny Llama, GQA and OPT models and variants (biases, tied head, yarn RoPE,
// post-LN OPT with projected embeddings), with prompts of mixed lengths (left padding) in batches
// of mixed generation lengths (finished rows keep computing), over more than one static batch; per-request
// sampling, teacher forcing and logits recording; the config section. The tests skip when the build has
// no LibTorch (the factory's error is checked instead).
#include "baselines/vanilla/vanilla_engine.h"

#include <cstdio>

#include "harness/engines.h"
#include "test_helpers.h"
#include "token_compare.h"

using namespace fd;
using fd::test::repo_path;

namespace {

// Two fp32 implementations of the same math differ by summation order only (~1e-7 relative per op):
// a token may differ from the reference's argmax only where its top-2 gap is that small.
constexpr double kNearTie = 1e-5;

#define SKIP_WITHOUT_LIBTORCH()                                                                          \
  do {                                                                                                   \
    if (!vanilla_build().libtorch) GTEST_SKIP() << "this build has no LibTorch (install libtorch-dev)"; \
  } while (0)

// The models: the tiny test models as shipped, and variants exercising the rest of each family.
ModelConfig model(const std::string& name) {
  if (name == "tiny-llama-biased-tied-yarn") {  // biases, head_dim != H / heads, tied head, yarn RoPE
    json j = read_json_file(repo_path("experiments/models/tiny-llama.json"));
    j["attention_bias"] = true;
    j["mlp_bias"] = true;
    j["head_dim"] = 48;
    j["tie_word_embeddings"] = true;
    j["rope_scaling"] = {{"type", "yarn"}, {"factor", 2.0}, {"original_max_position_embeddings", 256}};
    return model_config_from_json(j, name + ".json");
  }
  if (name == "tiny-opt-post-ln-proj") {  // opt-350m's shape: post-LN, no final LN, project_in/out
    json j = read_json_file(repo_path("experiments/models/tiny-opt.json"));
    j["do_layer_norm_before"] = false;
    j["word_embed_proj_dim"] = 32;
    return model_config_from_json(j, name + ".json");
  }
  return load_model_config(repo_path("experiments/models/" + name + ".json"));
}

std::unique_ptr<Engine> make(const ModelConfig& c, TensorSource& w, int64_t batch_size,
                             const SamplingParams& sampling = {}) {
  VanillaConfig vc;
  vc.batch_size = batch_size;
  vc.device = "cpu";
  return make_vanilla_engine(vc, EngineContext{c, w, sampling});
}

// 7 requests: prompts of 1..25 tokens and 3..17 new tokens, so each batch of 4 pads its prompts and runs
// finished rows along with the longest.
std::vector<Request> mixed_requests(const ModelConfig& c) {
  const int64_t prompt[7] = {5, 1, 17, 9, 25, 3, 12}, gen[7] = {12, 3, 17, 7, 5, 14, 9};
  std::vector<Request> r;
  for (uint64_t i = 0; i < 7; ++i) {
    Request q;
    q.id = 50 + i;
    for (int64_t t = 0; t < prompt[i]; ++t)
      q.prompt.push_back(int32_t(3 + (i * 37 + uint64_t(t) * 11) % uint64_t(c.vocab_size - 3)));
    q.max_new_tokens = gen[i];
    r.push_back(q);
  }
  return r;
}

class VanillaModels : public ::testing::TestWithParam<const char*> {};

}  // namespace

// Greedy tokens match the reference model (teacher-forced judging, fp32 near-ties only), and the batching
// is static: batch 1 (requests 50..53) runs max(12, 3, 17, 7) = 17 steps, batch 2 (54..56) max(5, 14, 9)
// = 14, never more than 4 requests at once.
TEST_P(VanillaModels, GreedyTokensMatchReferenceAcrossStaticBatches) {
  SKIP_WITHOUT_LIBTORCH();
  const ModelConfig c = model(GetParam());
  const auto reqs = mixed_requests(c);
  auto w0 = make_random_source(4, DType::F16);
  const ModelWeights weights = load_model_weights(c, *w0);
  auto w = make_random_source(4, DType::F16);
  auto e = make(c, *w, 4);
  const fd::test::EngineRun run = fd::test::run_engine(*e, reqs);
  ASSERT_TRUE(run.errors.empty()) << run.describe_errors();
  const auto k = fd::test::check_greedy_tokens(weights, {DType::F32}, reqs, run.tokens, kNearTie);
  std::printf("vanilla cpu fp32 %s vs reference: %s\n", GetParam(), k.describe().c_str());
  EXPECT_TRUE(k.ok()) << k.describe();
  EXPECT_EQ(run.steps, 17 + 14);
  EXPECT_EQ(run.max_running, 4);
}

INSTANTIATE_TEST_SUITE_P(Models, VanillaModels,
                         ::testing::Values("tiny-llama", "tiny-llama-gqa", "tiny-opt", "tiny-llama-biased-tied-yarn",
                                           "tiny-opt-post-ln-proj"));

// What a step reports: the first step of a batch prefills its real prompt tokens (pads not counted);
// every decode step computes every row of the batch, finished ones included, until the last finishes.
TEST(Vanilla, StepsAccountStaticBatches) {
  SKIP_WITHOUT_LIBTORCH();
  const ModelConfig c = model("tiny-llama");
  auto w = make_random_source(4, DType::F16);
  auto e = make(c, *w, 2);
  e->add({{1, {5, 6, 7}, 3, false}, {2, {8}, 1, false}, {3, {9, 10}, 2, false}});
  StepResult s = e->step();  // batch {1, 2}: prefill 3 + 1 tokens, request 2 finishes at once
  EXPECT_EQ(s.prefill_tokens, 4);
  ASSERT_EQ(s.tokens.size(), 2u);
  EXPECT_TRUE(s.tokens[1].finished);
  s = e->step();  // request 2's row keeps computing, its token is dropped
  EXPECT_EQ(s.decode_tokens, 2);
  ASSERT_EQ(s.tokens.size(), 1u);
  EXPECT_EQ(s.tokens[0].request_id, 1u);
  s = e->step();
  ASSERT_EQ(s.tokens.size(), 1u);
  EXPECT_TRUE(s.tokens[0].finished);
  s = e->step();  // only now the next batch: request 3
  EXPECT_EQ(s.prefill_tokens, 2);
  ASSERT_EQ(s.tokens.size(), 1u);
  EXPECT_EQ(s.tokens[0].request_id, 3u);
  EXPECT_FALSE(e->done());
  s = e->step();
  EXPECT_TRUE(e->done());
  EXPECT_EQ(e->capacity(1, 10).slots, 2);
  EXPECT_EQ(e->info().at("device"), "cpu");
  EXPECT_EQ(e->info().at("dtype"), "fp32");
  EXPECT_THROW(e->add({{4, {999}, 3, false}}), Error);  // outside the vocabulary
  EXPECT_TRUE(e->done());
  // A GPU budget of the run's hardware balance is not applied, and summary.json says so.
  HardwareBalance hw;
  hw.gpu_memory_gb = 24;
  VanillaConfig vc;
  vc.device = "cpu";
  auto w2 = make_random_source(4, DType::F16);
  EXPECT_EQ(make_vanilla_engine(vc, EngineContext{c, *w2, {}, hw})->notes().size(), 1u);
  EXPECT_TRUE(make_vanilla_engine(vc, EngineContext{c, *w2})->notes().empty());
}

// Per-request sampling (greedy, temperature, top-k, top-p, seeds), teacher-forced requests and logits
// recording, three static batches of 4: every token is the reference's pick along the stream the
// sequence continued with, every recorded row within 1e-4 of the reference's.
TEST(Vanilla, PerRequestSamplingForcedAndRecordedLogits) {
  SKIP_WITHOUT_LIBTORCH();
  for (const char* name : {"tiny-llama", "tiny-opt"}) {
    const ModelConfig c = model(name);
    SamplingParams run_sampling;
    run_sampling.temperature = 0.9, run_sampling.seed = 5;
    const auto reqs = fd::test::issue11_requests(c, /*record_all=*/true);
    auto w0 = make_random_source(2, DType::F16);
    const ModelWeights weights = load_model_weights(c, *w0);
    auto w = make_random_source(2, DType::F16);
    auto e = make(c, *w, 4, run_sampling);
    const fd::test::EngineRun got = fd::test::run_engine(*e, reqs);
    ASSERT_TRUE(got.errors.empty()) << got.describe_errors();
    const auto check = fd::test::check_scored_run(weights, {DType::F32}, reqs, run_sampling, got, 1e-4, kNearTie);
    std::printf("vanilla cpu fp32 %s issue-11 batch: %s\n", name, check.describe().c_str());
    EXPECT_TRUE(check.ok()) << name << ": " << check.describe();
    EXPECT_EQ(check.rows, check.tokens);
  }
}

// The config section: defaults, bounds, unknown keys and fp16 on the cpu refused by name.
TEST(Vanilla, ConfigParse) {
  auto parse = [](json j) { return parse_engine_spec(StrictObject(j, "x.json", "engine")); };
  auto vanilla = [&](json j) { return std::any_cast<VanillaConfig>(parse(j).config); };
  const VanillaConfig d = vanilla(json{{"type", "vanilla"}});
  EXPECT_EQ(d.batch_size, 16);
  EXPECT_EQ(d.device, "auto");
  EXPECT_EQ(d.dtype, "auto");
  const VanillaConfig v = vanilla(json{{"type", "vanilla"}, {"batch_size", 3}, {"device", "cuda"}, {"dtype", "fp32"}});
  EXPECT_EQ(v.batch_size, 3);
  EXPECT_EQ(v.device, "cuda");
  EXPECT_EQ(v.dtype, "fp32");
  EXPECT_EQ(v.to_json(), (json{{"batch_size", 3}, {"device", "cuda"}, {"dtype", "fp32"}}));
  using fd::test::error_message;
  EXPECT_THAT(error_message<ConfigError>([&] { parse(json{{"type", "vanilla"}, {"prefill_tokens", 8}}); }),
              ::testing::HasSubstr("prefill_tokens"));
  EXPECT_THAT(error_message<ConfigError>([&] { parse(json{{"type", "vanilla"}, {"batch_size", 0}}); }),
              ::testing::HasSubstr("batch_size"));
  EXPECT_THAT(error_message<ConfigError>([&] { parse(json{{"type", "vanilla"}, {"device", "tpu"}}); }),
              ::testing::HasSubstr("device"));
  EXPECT_THAT(error_message<ConfigError>([&] { parse(json{{"type", "vanilla"}, {"dtype", "bf16"}}); }),
              ::testing::HasSubstr("dtype"));
  EXPECT_THAT(error_message<ConfigError>([&] { parse(json{{"type", "vanilla"}, {"device", "cpu"}, {"dtype", "fp16"}}); }),
              ::testing::HasSubstr("dtype"));
  // Without LibTorch the factory says what to install; with a CPU-only LibTorch, device cuda is refused.
  const ModelConfig c = model("tiny-llama");
  auto w = make_random_source(4, DType::F16);
  VanillaConfig cuda;
  cuda.device = "cuda";
  if (!vanilla_build().libtorch) {
    EXPECT_THAT(error_message<Error>([&] { make_vanilla_engine(VanillaConfig{}, EngineContext{c, *w}); }),
                ::testing::HasSubstr("built without LibTorch (install libtorch-dev"));
  } else if (!vanilla_build().cuda) {
    EXPECT_THAT(error_message<ConfigError>([&] { make_vanilla_engine(cuda, EngineContext{c, *w}); }),
                ::testing::HasSubstr("sees no CUDA device"));
  }
}
