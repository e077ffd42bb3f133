#include "fastdecode/model/model_config.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "test_helpers.h"

using namespace fd;
using fd::test::error_message;
using fd::test::repo_path;
using ::testing::HasSubstr;

TEST(ModelConfig, LoadsEveryShippedConfig) {
  for (const char* name : {"llama-2-7b", "llama-2-13b", "llama-3-8b", "opt-175b", "tiny-llama", "tiny-llama-gqa",
                           "tiny-opt", "small-llama"}) {
    SCOPED_TRACE(name);
    const ModelConfig c = load_model_config(repo_path(std::string("experiments/models/") + name + ".json"));
    EXPECT_EQ(c.name, name);
    EXPECT_EQ(c.hidden_size % c.num_heads, 0);
    EXPECT_EQ(c.num_layers, c.full_num_layers);
  }
}

TEST(ModelConfig, RealShapes) {
  const ModelConfig l7 = load_model_config(repo_path("experiments/models/llama-2-7b.json"));
  EXPECT_EQ(l7.arch, Arch::Llama);
  EXPECT_EQ(l7.head_dim, 128);
  EXPECT_EQ(l7.num_kv_heads, 32);
  EXPECT_EQ(l7.num_params(), 6738415616LL);  // the published parameter count of Llama-2-7b
  EXPECT_EQ(l7.kv_bytes_per_token(2, true), 2LL * 4096 * 2 * 32);  // 512 KiB per token in fp16
  const ModelConfig l3 = load_model_config(repo_path("experiments/models/llama-3-8b.json"));
  EXPECT_EQ(l3.num_kv_heads, 8);
  EXPECT_EQ(l3.kv_dim(), 1024);
  EXPECT_DOUBLE_EQ(l3.rope.theta, 500000.0);
  EXPECT_EQ(l3.num_params(), 8030261248LL);  // Meta-Llama-3-8B
  const ModelConfig opt = load_model_config(repo_path("experiments/models/opt-175b.json"));
  EXPECT_EQ(opt.arch, Arch::OPT);
  EXPECT_TRUE(opt.tie_word_embeddings);
  EXPECT_EQ(opt.intermediate_size, 49152);
  EXPECT_EQ(opt.num_kv_heads, 96);
}

TEST(ModelConfig, LayersOverride) {
  const ModelConfig c = load_model_config(repo_path("experiments/models/llama-2-7b.json"));
  const ModelConfig r = with_layers(c, 2);
  EXPECT_EQ(r.num_layers, 2);
  EXPECT_EQ(r.full_num_layers, 32);
  EXPECT_EQ(r.kv_bytes_per_token(2, true), c.kv_bytes_per_token(2, true));  // memory wall of full depth
  EXPECT_EQ(r.kv_bytes_per_token(2, false) * 16, c.kv_bytes_per_token(2, false));
  EXPECT_THROW(with_layers(c, 0), ConfigError);
  EXPECT_THROW(with_layers(c, 33), ConfigError);
  EXPECT_EQ(model_config_to_hf_json(r, "float16")["num_hidden_layers"], 2);
}

namespace {
json tiny() { return read_json_file(repo_path("experiments/models/tiny-llama.json")); }
std::string bad(const json& j) {
  return error_message<ConfigError>([&] { model_config_from_json(j, "cfg/bad.json"); });
}
}  // namespace

TEST(ModelConfig, BadConfigsNameFileAndKey) {
  json j = tiny();
  j["hidden_sise"] = 64;
  EXPECT_THAT(bad(j), HasSubstr("cfg/bad.json: hidden_sise: unknown key"));
  j = tiny();
  j["hidden_size"] = "64";
  EXPECT_THAT(bad(j), HasSubstr("cfg/bad.json: hidden_size: expected an integer"));
  j = tiny();
  j["num_attention_heads"] = 0;
  EXPECT_THAT(bad(j), HasSubstr("num_attention_heads: value 0 out of range"));
  j = tiny();
  j["num_key_value_heads"] = 3;
  EXPECT_THAT(bad(j), HasSubstr("num_key_value_heads"));
  j = tiny();
  j["model_type"] = "gpt2";
  EXPECT_THAT(bad(j), HasSubstr("model_type: 'gpt2' is not one of"));
  j = tiny();
  j.erase("vocab_size");
  EXPECT_THAT(bad(j), HasSubstr("vocab_size: required key is missing"));
  json o = read_json_file(repo_path("experiments/models/tiny-opt.json"));
  o["_remove_final_layer_norm"] = true;
  EXPECT_THAT(bad(o), HasSubstr("cfg/bad.json: _remove_final_layer_norm: OPT without the final LayerNorm"));
}

TEST(ModelConfig, MissingAndInvalidFiles) {
  EXPECT_THAT(error_message<ConfigError>([] { load_model_config("/nonexistent/config.json"); }),
              HasSubstr("/nonexistent/config.json: cannot open"));
  fd::test::TempDir d("mc");
  {
    FILE* f = fopen(d.file("broken.json").c_str(), "w");
    fputs("{\"model_type\": \"llama\",", f);
    fclose(f);
  }
  EXPECT_THAT(error_message<ConfigError>([&] { load_model_config(d.file("broken.json")); }),
              HasSubstr("broken.json: invalid JSON"));
}

// ---- RoPE: rope_theta / rope_scaling (transformers 4.x) and rope_parameters (5.x) ----

namespace {
ModelConfig parse(const json& j) { return model_config_from_json(j, "cfg/rope.json"); }
json with_scaling(json scaling) {
  json j = tiny();
  j["rope_scaling"] = std::move(scaling);
  return j;
}
std::vector<float> default_inv(double theta, int64_t d) {
  std::vector<float> v;
  for (int64_t i = 0; i < d / 2; ++i) v.push_back(float(std::pow(theta, -double(2 * i) / double(d))));
  return v;
}
}  // namespace

TEST(ModelConfigRope, DefaultAndLinear) {
  const ModelConfig c = parse(tiny());
  EXPECT_EQ(c.rope.type, RopeType::Default);
  EXPECT_EQ(rope_inv_freq(c), default_inv(10000.0, c.head_dim));
  EXPECT_EQ(rope_attention_scaling(c), 1.0f);
  const ModelConfig lin = parse(with_scaling({{"type", "linear"}, {"factor", 4.0}}));
  EXPECT_EQ(lin.rope.type, RopeType::Linear);
  const auto inv = rope_inv_freq(lin), base = default_inv(10000.0, lin.head_dim);
  for (size_t i = 0; i < inv.size(); ++i) EXPECT_FLOAT_EQ(inv[i], base[i] / 4.0f) << i;
  EXPECT_EQ(lin.position_limit(), lin.max_position_embeddings);
  // `rope_type` is the newer spelling of `type`
  EXPECT_EQ(rope_inv_freq(parse(with_scaling({{"rope_type", "linear"}, {"factor", 4.0}}))), inv);
}

TEST(ModelConfigRope, Llama3LeavesHighFrequenciesAndDividesLowOnes) {
  json j = tiny();  // head_dim 32, theta 10000: wavelengths 2*pi .. 2*pi*10000^(15/16)
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 256}};
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.rope.type, RopeType::Llama3);
  const auto inv = rope_inv_freq(c), base = default_inv(10000.0, c.head_dim);
  int kept = 0, divided = 0, smoothed = 0;
  for (size_t i = 0; i < inv.size(); ++i) {
    const double wavelen = 2 * 3.14159265358979 / base[i];
    if (wavelen < 256.0 / 4) {
      EXPECT_FLOAT_EQ(inv[i], base[i]) << i;
      ++kept;
    } else if (wavelen > 256.0) {
      EXPECT_FLOAT_EQ(inv[i], base[i] / 8) << i;
      ++divided;
    } else {
      EXPECT_TRUE(inv[i] < base[i] && inv[i] > base[i] / 8) << i;
      ++smoothed;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(smoothed, 0);
}

TEST(ModelConfigRope, YarnRampAndAttentionFactor) {
  json j = tiny();
  j["max_position_embeddings"] = 2048;
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 8.0}, {"original_max_position_embeddings", 256}};
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.rope.type, RopeType::Yarn);
  EXPECT_NEAR(rope_attention_scaling(c), 0.1 * std::log(8.0) + 1.0, 1e-6);
  const auto inv = rope_inv_freq(c), base = default_inv(10000.0, c.head_dim);
  EXPECT_FLOAT_EQ(inv.front(), base.front());        // fastest rotation: extrapolated (unchanged)
  EXPECT_FLOAT_EQ(inv.back(), base.back() / 8.0f);   // slowest: interpolated (divided by factor)
  // attention_factor given, or from mscale / mscale_all_dim as transformers computes it
  j["rope_scaling"]["attention_factor"] = 1.5;
  EXPECT_FLOAT_EQ(rope_attention_scaling(parse(j)), 1.5f);
  j["rope_scaling"].erase("attention_factor");
  j["rope_scaling"]["mscale"] = 0.707;
  j["rope_scaling"]["mscale_all_dim"] = 1.0;
  EXPECT_NEAR(rope_attention_scaling(parse(j)), (0.0707 * std::log(8.0) + 1) / (0.1 * std::log(8.0) + 1), 1e-6);
  // factor inconsistent with max_position_embeddings / original_max_position_embeddings: refused
  j["rope_scaling"]["factor"] = 4.0;
  EXPECT_THAT(bad(j), HasSubstr("rope_scaling.factor: yarn factor"));
}

TEST(ModelConfigRope, DynamicIsDefaultRopeUpToTheOriginalLength) {
  const ModelConfig c = parse(with_scaling({{"type", "dynamic"}, {"factor", 2.0}}));
  EXPECT_EQ(c.rope.type, RopeType::Dynamic);
  EXPECT_EQ(rope_inv_freq(c), default_inv(10000.0, c.head_dim));
  EXPECT_EQ(c.position_limit(), c.max_position_embeddings);
  const ModelConfig d = parse(
      with_scaling({{"type", "dynamic"}, {"factor", 2.0}, {"original_max_position_embeddings", 128}}));
  EXPECT_EQ(d.position_limit(), 128);
  EXPECT_THAT(d.position_limit_why, HasSubstr("dynamic"));
}

TEST(ModelConfigRope, V4AndV5FormsGiveTheSameConfig) {
  json v4 = tiny();
  v4["rope_theta"] = 500000.0;
  v4["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                        {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 256}};
  json v5 = v4;
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = v4["rope_scaling"];
  v5["rope_parameters"]["rope_theta"] = 500000.0;
  const ModelConfig a = parse(v4), b = parse(v5);
  EXPECT_EQ(a.rope.type, b.rope.type);
  EXPECT_EQ(a.rope.theta, b.rope.theta);
  EXPECT_EQ(rope_inv_freq(a), rope_inv_freq(b));
  // 5.x default rope
  json d5 = tiny();
  d5.erase("rope_theta");
  d5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  EXPECT_EQ(rope_inv_freq(parse(d5)), rope_inv_freq(parse(tiny())));
}

TEST(ModelConfigRope, RefusedByName) {
  EXPECT_THAT(bad(with_scaling({{"type", "longrope"}, {"factor", 2.0}})),
              HasSubstr("rope_scaling.type: rope type 'longrope' is not implemented (implemented: default, linear, "
                        "dynamic, llama3, yarn)"));
  EXPECT_THAT(bad(with_scaling({{"factor", 2.0}})), HasSubstr("rope_scaling.type"));
  EXPECT_THAT(bad(with_scaling({{"type", "linear"}})), HasSubstr("rope_scaling.factor: required key is missing"));
  EXPECT_THAT(bad(with_scaling({{"type", "linear"}, {"factor", 2.0}, {"low_freq_factor", 1.0}})),
              HasSubstr("rope_scaling.low_freq_factor: unknown key"));
  json j = tiny();
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}},
                          {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  EXPECT_THAT(bad(j), HasSubstr("rope_parameters: per-layer-type RoPE parameters"));
  j = tiny();
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 20000.0}};
  EXPECT_THAT(bad(j), HasSubstr("rope_parameters.rope_theta: disagrees with the top-level rope_theta"));
}

// ---- Llama family: biases, mistral, qwen2 ----

TEST(ModelConfigFamily, BiasesMistralQwen2) {
  json j = tiny();
  j["attention_bias"] = true;
  j["mlp_bias"] = true;
  ModelConfig c = parse(j);
  EXPECT_TRUE(c.attention_bias && c.o_bias && c.mlp_bias);
  j = tiny();
  j["model_type"] = "qwen2";
  j["use_sliding_window"] = false;
  j["sliding_window"] = 32;
  j["max_window_layers"] = 2;
  c = parse(j);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.o_bias || c.mlp_bias);
  EXPECT_EQ(c.position_limit(), c.max_position_embeddings);
  j["use_sliding_window"] = true;
  EXPECT_THAT(bad(j),
              HasSubstr("cfg/bad.json: use_sliding_window: sliding-window attention (qwen2) is not implemented"));
  j["use_sliding_window"] = false;
  j["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_THAT(bad(j), HasSubstr("layer_types: layer type \"sliding_attention\" is not implemented"));
  j = tiny();
  j["model_type"] = "mistral";
  j["sliding_window"] = nullptr;
  c = parse(j);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.position_limit(), 512);
  j["sliding_window"] = 100;
  c = parse(j);
  EXPECT_EQ(c.position_limit(), 100);
  EXPECT_THAT(c.position_limit_why, HasSubstr("sliding_window"));
  j["attention_bias"] = true;  // not a Mistral key
  EXPECT_THAT(bad(j), HasSubstr("attention_bias: unknown key"));
}

TEST(ModelConfigFamily, ExplicitHeadDim) {
  json j = tiny();  // hidden 64, 2 heads: head_dim 32 unless given
  j["head_dim"] = 48;
  const ModelConfig c = parse(j);
  EXPECT_EQ(c.head_dim, 48);
  EXPECT_EQ(c.q_dim(), 96);
  EXPECT_EQ(rope_inv_freq(c).size(), 24u);
  j["head_dim"] = 7;
  EXPECT_THAT(bad(j), HasSubstr("head_dim: must be even"));
}

// Every config in experiments/models/ loads (the zoo and the test models).
TEST(ModelConfig, EveryFileInTheModelsFolderLoads) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(repo_path("experiments/models"))) {
    if (e.path().extension() != ".json") continue;
    SCOPED_TRACE(e.path().string());
    const ModelConfig c = load_model_config(e.path().string());
    EXPECT_EQ(c.name, e.path().stem().string());
    EXPECT_GT(c.position_limit(), 0);
    EXPECT_EQ(rope_inv_freq(c).size(), size_t(c.head_dim / 2));
    ++n;
  }
  EXPECT_GE(n, 8);
}

// The zoo's published models: parameter counts as published (checks biases, tying, head_dim, GQA), the
// 4.x and 5.x forms of Llama-3.1-8B agree, and the position limits.
TEST(ModelConfig, ZooShapes) {
  const auto load = [](const char* n) { return load_model_config(repo_path(std::string("experiments/models/") + n)); };
  const ModelConfig l31 = load("llama-3.1-8b.json"), l31v5 = load("llama-3.1-8b-v5.json");
  EXPECT_EQ(l31.rope.type, RopeType::Llama3);
  EXPECT_EQ(rope_inv_freq(l31), rope_inv_freq(l31v5));
  EXPECT_EQ(l31.num_params(), 8030261248LL);
  const ModelConfig l32 = load("llama-3.2-1b.json");
  EXPECT_TRUE(l32.tie_word_embeddings);
  EXPECT_EQ(l32.head_dim, 64);
  EXPECT_EQ(l32.num_params(), 1235814400LL);  // Llama-3.2-1B
  const ModelConfig q = load("qwen2.5-0.5b.json");
  EXPECT_TRUE(q.attention_bias && !q.o_bias && q.tie_word_embeddings);
  EXPECT_EQ(q.num_params(), 494032768LL);  // Qwen2.5-0.5B
  const ModelConfig m = load("mistral-7b-v0.1.json");
  EXPECT_EQ(m.num_params(), 7241732096LL);  // Mistral-7B-v0.1
  EXPECT_EQ(m.position_limit(), 4096);      // the sliding window
  EXPECT_EQ(load("opt-125m.json").num_params(), 125239296LL);
  const ModelConfig o350 = load("opt-350m.json");  // post-LN, projections 512 <-> 1024
  EXPECT_FALSE(o350.do_layer_norm_before || o350.has_final_norm());
  EXPECT_EQ(o350.embed_dim(), 512);
  EXPECT_EQ(o350.num_params(), 331196416LL);  // facebook/opt-350m
  EXPECT_EQ(load("vicuna-7b-v1.5-16k.json").rope.type, RopeType::Linear);
}
