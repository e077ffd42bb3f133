#include "fastdecode/model/weights.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include "fastdecode/model/reference.h"
#include "fastdecode/model/safetensors.h"
#include "test_helpers.h"

using namespace fd;
using fd::test::error_message;
using fd::test::repo_path;
using fd::test::TempDir;
using ::testing::HasSubstr;

namespace {
ModelConfig tiny(const char* name = "tiny-llama") {
  return load_model_config(repo_path(std::string("experiments/models/") + name + ".json"));
}
uint64_t hash_bytes(const std::vector<char>& b) { return fnv1a64(std::string_view(b.data(), b.size())); }
std::vector<char> bytes_of(const TensorSpec& s, uint64_t seed, DType t) {
  std::vector<char> b(size_t(s.numel()) * dtype_size(t));
  random_tensor_bytes(s, seed, t, b.data());
  return b;
}
}  // namespace

TEST(Weights, SpecsFollowHfNames) {
  const auto specs = model_tensor_specs(tiny());
  EXPECT_EQ(specs.size(), 1u + 2 * 9 + 1 + 1);
  EXPECT_EQ(specs.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(specs.back().name, "lm_head.weight");
  const auto gqa = model_tensor_specs(tiny("tiny-llama-gqa"));
  EXPECT_EQ(gqa[3].name, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(gqa[3].shape, (std::vector<int64_t>{2 * 32, 128}));  // 2 KV heads of head_dim 32
  const auto opt = model_tensor_specs(tiny("tiny-opt"));  // tied: no lm_head
  EXPECT_EQ(opt.back().name, "model.decoder.final_layer_norm.bias");
  EXPECT_EQ(opt[1].shape, (std::vector<int64_t>{514, 64}));
}

TEST(Weights, SameSeedSameBytesOnEveryMachine) {
  const TensorSpec s{"model.layers.0.mlp.up_proj.weight", {7, 33}, 0.0f, 0.125f};
  EXPECT_EQ(bytes_of(s, 42, DType::F16), bytes_of(s, 42, DType::F16));
  EXPECT_NE(bytes_of(s, 42, DType::F16), bytes_of(s, 43, DType::F16));
  TensorSpec other = s;
  other.name = "model.layers.1.mlp.up_proj.weight";
  EXPECT_NE(bytes_of(s, 42, DType::F16), bytes_of(other, 42, DType::F16));
  // Golden hashes: the generator is integer arithmetic plus two correctly rounded fp32 operations,
  // so these values hold on any IEEE machine. A change here changes every random model.
  EXPECT_EQ(hash_bytes(bytes_of(s, 42, DType::F32)), 0x3dd6a7a85b0d69dcull) << std::hex << hash_bytes(bytes_of(s, 42, DType::F32));
  EXPECT_EQ(hash_bytes(bytes_of(s, 42, DType::F16)), 0x7cf966ac735a30d5ull) << std::hex << hash_bytes(bytes_of(s, 42, DType::F16));
}

TEST(Weights, InitStatistics) {
  const TensorSpec s{"w", {512, 512}, 0.0f, 0.05f};
  const auto b = bytes_of(s, 1, DType::F32);
  const float* v = reinterpret_cast<const float*>(b.data());
  double sum = 0, sq = 0, mx = 0;
  for (int64_t i = 0; i < s.numel(); ++i) {
    sum += v[i];
    sq += double(v[i]) * v[i];
    mx = std::max(mx, std::fabs(double(v[i])));
  }
  const double n = double(s.numel()), mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.001);
  EXPECT_NEAR(sd, 0.05, 0.0005);
  EXPECT_LE(mx, std::sqrt(3.0) * 0.05 + 1e-6);
  const TensorSpec norm{"n", {4096}, 1.0f, 0.05f};
  const auto nb = bytes_of(norm, 1, DType::F32);
  EXPECT_NEAR(reinterpret_cast<const float*>(nb.data())[17], 1.0, 0.09);
}

TEST(Weights, FileAndGeneratorGiveTheSameModel) {
  TempDir d("w");
  const ModelConfig c = tiny("tiny-llama-gqa");
  write_random_weights(c, 9, DType::BF16, d.path.string());
  const json cfg = read_json_file(d.file("config.json"));
  EXPECT_EQ(cfg["torch_dtype"], "bfloat16");
  EXPECT_EQ(load_model_config(d.file("config.json")).num_kv_heads, 2);
  auto file = open_safetensors_source(d.file("model.safetensors"));
  auto gen = make_random_source(9, DType::BF16);
  const ModelWeights a = load_model_weights(c, *file), b = load_model_weights(c, *gen);
  EXPECT_EQ(a.embed, b.embed);
  EXPECT_EQ(a.layers[2].wk, b.layers[2].wk);
  EXPECT_EQ(a.layers[1].w_down, b.layers[1].w_down);
  EXPECT_EQ(a.lm_head, b.lm_head);
}

TEST(Weights, ReducedLayersArePrefixOfFullModel) {
  TempDir d("wl");
  const ModelConfig c = tiny();
  write_random_weights(c, 5, DType::F16, d.file("full"));
  write_random_weights(with_layers(c, 1), 5, DType::F16, d.file("one"));
  const auto full = SafetensorsFile::open(d.file("full/model.safetensors"));
  const auto one = SafetensorsFile::open(d.file("one/model.safetensors"));
  EXPECT_EQ(one.find("model.layers.1.mlp.up_proj.weight"), nullptr);
  for (const auto& t : one.tensors()) {
    const TensorInfo& u = full.get(t.name);
    ASSERT_EQ(t.nbytes, u.nbytes);
    EXPECT_EQ(0, std::memcmp(one.data(t), full.data(u), t.nbytes)) << t.name;
  }
}

TEST(Weights, MissingOrMisshapenTensorNamesFileAndTensor) {
  TempDir d("wb");
  const ModelConfig c = tiny();
  // A file with every tensor but one, and one with a wrong shape.
  std::vector<TensorInfo> infos;
  for (const auto& s : model_tensor_specs(c)) {
    if (s.name == "model.layers.1.mlp.gate_proj.weight") continue;
    TensorInfo t;
    t.name = s.name;
    t.dtype = DType::F16;
    t.shape = s.shape;
    if (s.name == "model.norm.weight") t.shape = {63};
    infos.push_back(t);
  }
  {
    SafetensorsWriter w(d.file("m.safetensors"), infos);
    for (const auto& t : w.tensors()) {
      std::vector<char> zeros(t.nbytes, 0);
      w.write(t.name, zeros.data(), zeros.size());
    }
    w.finish();
  }
  auto src = open_safetensors_source(d.file("m.safetensors"));
  const std::string msg = error_message([&] { load_model_weights(c, *src); });
  EXPECT_THAT(msg, HasSubstr("m.safetensors"));
  EXPECT_THAT(msg, HasSubstr("model.layers.1.mlp.gate_proj.weight"));
  std::vector<float> dummy;
  const std::string shape_msg = error_message([&] {
    dummy = SafetensorsFile::open(d.file("m.safetensors")).read_f32("model.norm.weight", {64});
  });
  EXPECT_THAT(shape_msg, HasSubstr("model.norm.weight"));
  EXPECT_THAT(shape_msg, HasSubstr("[63]"));
}

// The init keeps activations in a sane range through depth: the logits of a 2-layer and a 48-layer
// model of the same width have comparable scale (neither vanishing nor exploding).
TEST(Weights, ActivationsStaySaneThroughDepth) {
  json j = read_json_file(repo_path("experiments/models/tiny-llama.json"));
  std::vector<double> sds;
  for (int layers : {2, 48}) {
    j["num_hidden_layers"] = layers;
    const ModelConfig c = model_config_from_json(j, "deep.json");
    auto src = make_random_source(1, DType::F16);
    ReferenceModel m(load_model_weights(c, *src));
    const int64_t s = m.add_sequence();
    std::vector<RefToken> batch;
    for (int i = 0; i < 16; ++i) batch.push_back({s, 10 + 7 * i, i == 15});
    const auto logits = m.forward(batch);
    double sum = 0, sq = 0;
    for (float x : logits) {
      ASSERT_TRUE(std::isfinite(x));
      sum += x;
      sq += double(x) * x;
    }
    const double n = double(logits.size());
    sds.push_back(std::sqrt(sq / n - (sum / n) * (sum / n)));
  }
  for (double sd : sds) {
    EXPECT_GT(sd, 0.2);
    EXPECT_LT(sd, 5.0);
  }
  EXPECT_LT(std::max(sds[0], sds[1]) / std::min(sds[0], sds[1]), 3.0);
}
