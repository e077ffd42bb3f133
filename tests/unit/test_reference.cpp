#include "fastdecode/model/reference.h"

#include "fastdecode/engine/engine.h"

#include <cmath>
#include <cstring>

#include "test_helpers.h"

using namespace fd;
using fd::test::repo_path;

namespace {

ReferenceModel make_model(const char* name, uint64_t seed = 7) {
  const ModelConfig c = load_model_config(repo_path(std::string("experiments/models/") + name + ".json"));
  auto src = make_random_source(seed, DType::F16);
  return ReferenceModel(load_model_weights(c, *src));
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, float atol, float rtol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_LE(std::fabs(a[i] - b[i]), atol + rtol * std::fabs(b[i])) << "first bad index " << i;
}

class ReferenceArch : public ::testing::TestWithParam<const char*> {};

}  // namespace

TEST(ReferenceBlocks, RopeIsIdentityAtZeroAndPreservesNorm) {
  std::vector<float> v = {1, 2, 3, 4, 5, 6, 7, 8};
  const auto orig = v;
  ref_rope(v.data(), 8, 0, 10000.0);
  EXPECT_EQ(v, orig);
  ref_rope(v.data(), 8, 37, 10000.0);
  double n0 = 0, n1 = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    n0 += orig[i] * orig[i];
    n1 += v[i] * v[i];
  }
  EXPECT_NEAR(n0, n1, 1e-3);
  // Pair (0, 4) rotates by angle pos * theta^0 = 37 rad.
  EXPECT_NEAR(v[0], 1 * std::cos(37.0) - 5 * std::sin(37.0), 1e-4);
  EXPECT_NEAR(v[4], 5 * std::cos(37.0) + 1 * std::sin(37.0), 1e-4);
}

TEST(ReferenceBlocks, NormsAndLinear) {
  const std::vector<float> x = {1, -2, 3, -4}, w = {1, 1, 2, 2}, b = {0, 0, 1, 1};
  std::vector<float> y(4);
  ref_rmsnorm(x.data(), 1, 4, w.data(), 0.0, y.data());
  const double r = 1.0 / std::sqrt(30.0 / 4);  // mean of squares (1 + 4 + 9 + 16) / 4
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[i], w[i] * x[i] * r, 1e-6) << i;
  // LayerNorm of x: mean -0.5, deviations {1.5, -1.5, 3.5, -3.5}, biased variance 29 / 4 = 7.25. The
  // normalized row has mean 0, and here sum_i w_i * dev_i = 1.5 - 1.5 + 7 - 7 = 0 too, so the output's
  // mean is mean(b) = 0.5.
  ref_layernorm(x.data(), 1, 4, w.data(), b.data(), 0.0, y.data());
  const double s = std::sqrt(7.25);
  const double ln[4] = {1.5 / s, -1.5 / s, 2 * 3.5 / s + 1, -2 * 3.5 / s + 1};
  double mean = 0;
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(y[i], ln[i], 1e-6) << i;
    mean += y[i] / 4;
  }
  EXPECT_NEAR(mean, 0.5, 1e-6);
  // Two rows, each normalized on its own, and eps inside the square root. Row 1 is 2 x + 10: mean 9,
  // deviations {3, -3, 7, -7}, variance 29. With eps 0.75: var + eps = 8 for row 0 and 29.75 for row 1.
  const std::vector<float> x2 = {1, -2, 3, -4, 12, 6, 16, 2};
  std::vector<float> y2(8);
  ref_layernorm(x2.data(), 2, 4, w.data(), b.data(), 0.75, y2.data());
  const double dev[8] = {1.5, -1.5, 3.5, -3.5, 3, -3, 7, -7};
  for (int i = 0; i < 8; ++i)
    EXPECT_NEAR(y2[i], w[i % 4] * dev[i] / std::sqrt(i < 4 ? 8.0 : 29.75) + b[i % 4], 1e-6) << i;
  ref_rmsnorm(x2.data(), 2, 4, w.data(), 0.5, y2.data());  // mean squares 7.5 and 110
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(y2[i], w[i % 4] * x2[i] / std::sqrt(i < 4 ? 8.0 : 110.5), 1e-6) << i;
  const std::vector<float> W = {1, 0, 0, 0, 0, 1, 1, 0, 1, 1, 1, 1};  // [3, 4]
  std::vector<float> out(6);
  const std::vector<float> xx = {1, -2, 3, -4, 1, 1, 1, 1};          // [2, 4]
  const std::vector<float> bias = {0.5f, 0, 0};
  ref_linear(xx.data(), 2, 4, W.data(), bias.data(), 3, out.data());
  EXPECT_EQ(out, (std::vector<float>{1.5f, 1, -2, 1.5f, 2, 4}));
}

// Decoding token by token must give the logits of one causal prefill over the same tokens.
TEST_P(ReferenceArch, IncrementalDecodeMatchesPrefill) {
  ReferenceModel a = make_model(GetParam()), b = make_model(GetParam());
  const std::vector<int32_t> toks = {5, 9, 33, 70, 12, 4, 88, 101, 3, 17, 64, 31};
  const int64_t sa = a.add_sequence(), sb = b.add_sequence();
  std::vector<RefToken> all;
  for (int32_t t : toks) all.push_back({sa, t, true});
  const std::vector<float> full = a.forward(all);
  std::vector<float> inc;
  for (int32_t t : toks) {
    const auto l = b.forward({{sb, t, true}});
    inc.insert(inc.end(), l.begin(), l.end());
  }
  EXPECT_EQ(a.sequence_length(sa), int64_t(toks.size()));
  expect_close(inc, full, 1e-5f, 1e-4f);
}

// A sequence's logits do not depend on what else is in the batch.
TEST_P(ReferenceArch, BatchIndependence) {
  ReferenceModel m = make_model(GetParam()), solo = make_model(GetParam());
  const int64_t s1 = m.add_sequence(), s2 = m.add_sequence(), s = solo.add_sequence();
  m.forward({{s1, 7, false}, {s1, 8, false}, {s2, 40, false}, {s1, 9, true}, {s2, 41, true}});
  const auto l = m.forward({{s2, 42, true}, {s1, 10, true}});
  const auto ref = solo.forward({{s, 7, false}, {s, 8, false}, {s, 9, false}, {s, 10, true}});
  const int64_t V = m.config().vocab_size;
  expect_close(std::vector<float>(l.begin() + V, l.end()), ref, 1e-5f, 1e-4f);
  EXPECT_EQ(m.total_context(), 4 + 3);
  m.free_sequence(s1);
  EXPECT_EQ(m.num_sequences(), 1);
  EXPECT_EQ(m.total_context(), 3);
}

// The residual hook (tensor parallelism sums the ranks' shares through it): called once per branch (the o
// projection, the MLP), and x += y through it gives the same bits as the default; a hook that drops a branch
// changes the result (the hook is what joins the branch). ref_lm_head = ref_final_hidden, then the head GEMM.
TEST_P(ReferenceArch, ResidualHookAndFinalHidden) {
  ReferenceModel m = make_model(GetParam());
  const ModelConfig& c = m.config();
  const LayerWeights& L = m.weights().layers[0];
  const int64_t T = 3, H = c.hidden_size;
  std::vector<float> x0(size_t(T * H)), att(size_t(T * c.q_dim()));
  for (size_t i = 0; i < x0.size(); ++i) x0[i] = std::sin(0.37f * float(i));
  for (size_t i = 0; i < att.size(); ++i) att[i] = std::cos(0.11f * float(i));
  std::vector<float> a = x0, b = x0, d = x0;
  ref_attention_output_and_mlp(c, L, att.data(), T, a.data());
  int calls = 0;
  const ResidualAdd plus = [&](float* x, const float* y, int64_t n) {
    ++calls;
    EXPECT_EQ(n, T * H);
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
  };
  ref_attention_output_and_mlp(c, L, att.data(), T, b.data(), ref_linear, &plus);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  int seen = 0;
  const ResidualAdd drop_mlp = [&](float* x, const float* y, int64_t n) {
    if (seen++ == 0)
      for (int64_t i = 0; i < n; ++i) x[i] += y[i];
  };
  ref_attention_output_and_mlp(c, L, att.data(), T, d.data(), ref_linear, &drop_mlp);
  EXPECT_NE(0, std::memcmp(a.data(), d.data(), a.size() * sizeof(float)));

  std::vector<float> logits(size_t(T * c.vocab_size)), hn(size_t(T * c.embed_dim())), direct(logits.size());
  ref_lm_head(m.weights(), a.data(), T, logits.data());
  ref_final_hidden(m.weights(), a.data(), T, hn.data());
  ref_linear(hn.data(), T, c.embed_dim(), m.weights().lm_head_matrix().data(), nullptr, c.vocab_size, direct.data());
  EXPECT_EQ(0, std::memcmp(logits.data(), direct.data(), logits.size() * sizeof(float)));
}

INSTANTIATE_TEST_SUITE_P(Models, ReferenceArch, ::testing::Values("tiny-llama", "tiny-llama-gqa", "tiny-opt"));

TEST(Reference, BadInputChangesNothing) {
  ReferenceModel m = make_model("tiny-llama");
  const int64_t s = m.add_sequence();
  m.forward({{s, 1, false}});
  EXPECT_THROW(m.forward({{s, 2, false}, {s, 256, true}}), Error);  // token outside vocab
  EXPECT_THROW(m.forward({{s + 1, 2, true}}), Error);               // unknown sequence
  EXPECT_EQ(m.sequence_length(s), 1);
  m.free_sequence(s);
  EXPECT_THROW(m.forward({{s, 2, true}}), Error);  // freed
}

TEST(Reference, PositionLimit) {
  json j = read_json_file(repo_path("experiments/models/tiny-llama.json"));
  j["max_position_embeddings"] = 4;
  auto src = make_random_source(1, DType::F16);
  ReferenceModel m(load_model_weights(model_config_from_json(j, "short.json"), *src));
  const int64_t s = m.add_sequence();
  m.forward({{s, 1, false}, {s, 2, false}, {s, 3, false}, {s, 4, true}});
  EXPECT_THROW(m.forward({{s, 5, true}}), Error);
  EXPECT_EQ(m.sequence_length(s), 4);
}

// A sliding window (mistral) or dynamic RoPE lowers the usable positions: the reference refuses to go
// past them, and validate_request refuses requests that would, naming why.
TEST(Reference, PositionLimitFromSlidingWindowAndDynamicRope) {
  json j = read_json_file(repo_path("experiments/models/tiny-llama.json"));
  j["model_type"] = "mistral";
  j["sliding_window"] = 3;
  const ModelConfig mc = model_config_from_json(j, "mistral.json");
  EXPECT_EQ(mc.position_limit(), 3);
  auto src = make_random_source(1, DType::F16);
  ReferenceModel m(load_model_weights(mc, *src));
  const int64_t s = m.add_sequence();
  m.forward({{s, 1, false}, {s, 2, false}, {s, 3, true}});
  EXPECT_THAT(fd::test::error_message<Error>([&] { m.forward({{s, 4, true}}); }),
              ::testing::HasSubstr("sliding_window"));
  Request r;
  r.prompt = {1, 2};
  r.max_new_tokens = 2;  // 3 positions: fits
  EXPECT_NO_THROW(validate_request(r, mc));
  r.max_new_tokens = 3;
  EXPECT_THAT(fd::test::error_message<Error>([&] { validate_request(r, mc); }),
              ::testing::HasSubstr("has 3 (mistral sliding_window 3"));
  json d = read_json_file(repo_path("experiments/models/tiny-llama.json"));
  d["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}, {"original_max_position_embeddings", 2}};
  EXPECT_THAT(fd::test::error_message<Error>([&] { validate_request(r, model_config_from_json(d, "dyn.json")); }),
              ::testing::HasSubstr("dynamic (NTK) RoPE"));
}

// Llama attention and MLP biases, a q_dim != hidden_size head_dim, and a tied head all flow through
// the reference stages: the forward changes when a bias changes, and runs with head_dim 48 of hidden 64.
TEST(Reference, LlamaBiasesAndExplicitHeadDim) {
  json j = read_json_file(repo_path("experiments/models/tiny-llama.json"));
  j["attention_bias"] = true;
  j["mlp_bias"] = true;
  j["head_dim"] = 48;
  j["tie_word_embeddings"] = true;
  const ModelConfig c = model_config_from_json(j, "biased.json");
  auto src = make_random_source(3, DType::F32);
  ModelWeights w = load_model_weights(c, *src);
  ASSERT_EQ(w.layers[0].bo.size(), 64u);
  ASSERT_EQ(w.layers[0].bq.size(), 96u);
  ASSERT_EQ(w.layers[0].b_gate.size(), size_t(c.intermediate_size));
  EXPECT_TRUE(w.lm_head.empty());
  const auto run = [](ModelWeights ww) {
    ReferenceModel m(std::move(ww));
    const int64_t s = m.add_sequence();
    return m.forward({{s, 5, false}, {s, 7, true}});
  };
  const auto base = run(w);
  for (auto field : {&LayerWeights::bq, &LayerWeights::bo, &LayerWeights::b_gate, &LayerWeights::b_down}) {
    ModelWeights w2 = w;
    for (float& b : w2.layers[0].*field) b += 0.5f;
    const auto other = run(std::move(w2));
    double diff = 0;
    for (size_t i = 0; i < base.size(); ++i) diff = std::max(diff, double(std::fabs(base[i] - other[i])));
    EXPECT_GT(diff, 1e-4);
  }
}
