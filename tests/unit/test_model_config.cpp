#include "fastdecode/model/model_config.h"

#include <unistd.h>

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
  EXPECT_DOUBLE_EQ(l3.rope_theta, 500000.0);
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
  j["model_type"] = "mistral";
  EXPECT_THAT(bad(j), HasSubstr("model_type: 'mistral' is not one of"));
  j = tiny();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_THAT(bad(j), HasSubstr("rope_scaling"));
  j = tiny();
  j.erase("vocab_size");
  EXPECT_THAT(bad(j), HasSubstr("vocab_size: required key is missing"));
  json o = read_json_file(repo_path("experiments/models/tiny-opt.json"));
  o["word_embed_proj_dim"] = 32;
  EXPECT_THAT(bad(o), HasSubstr("word_embed_proj_dim"));
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
