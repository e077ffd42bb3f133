// Tensor- and pipeline-parallel weight shards (fastdecode/model/shard.h): for each tiny model and
// T, P in {1, 2} the shards put back together give load_model_weights' bytes (random source and a
// sharded safetensors checkpoint); a single rank reads only what it holds; the stage rules and every
// refusal; and numeric checks that the cut is the right one (partial o-proj / MLP sums over the ranks
// equal the whole layer's, each rank's q/k/v and attention are its heads' slice of the whole).
#include "fastdecode/model/shard.h"

#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "fastdecode/model/reference.h"
#include "test_helpers.h"

using namespace fd;
using fd::test::error_message;
using fd::test::repo_path;
using fd::test::TempDir;
using ::testing::HasSubstr;

namespace {

ModelConfig tiny(const std::string& name) { return load_model_config(repo_path("experiments/models/" + name + ".json")); }

std::string config_error(const std::function<void()>& f) { return error_message<ConfigError>(f); }

void expect_parts(const std::string& msg, std::initializer_list<std::string> parts) {
  for (const auto& p : parts) EXPECT_THAT(msg, HasSubstr(p));
}

void expect_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if (!got.empty()) EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << what;
}

// The test's own statement of the cut (independent of shard.cpp's table).
enum class Kind { Whole, Rows, Cols, Rank0 };
struct Field {
  const char* name;
  std::vector<float> LayerWeights::*m;
  Kind kind;
};
const std::vector<Field> kLayerFields = {
    {"attn_norm_w", &LayerWeights::attn_norm_w, Kind::Whole}, {"attn_norm_b", &LayerWeights::attn_norm_b, Kind::Whole},
    {"mlp_norm_w", &LayerWeights::mlp_norm_w, Kind::Whole},   {"mlp_norm_b", &LayerWeights::mlp_norm_b, Kind::Whole},
    {"wq", &LayerWeights::wq, Kind::Rows},                    {"wk", &LayerWeights::wk, Kind::Rows},
    {"wv", &LayerWeights::wv, Kind::Rows},                    {"bq", &LayerWeights::bq, Kind::Rows},
    {"bk", &LayerWeights::bk, Kind::Rows},                    {"bv", &LayerWeights::bv, Kind::Rows},
    {"w_gate", &LayerWeights::w_gate, Kind::Rows},            {"b_gate", &LayerWeights::b_gate, Kind::Rows},
    {"w_up", &LayerWeights::w_up, Kind::Rows},                {"b_up", &LayerWeights::b_up, Kind::Rows},
    {"wo", &LayerWeights::wo, Kind::Cols},                    {"w_down", &LayerWeights::w_down, Kind::Cols},
    {"bo", &LayerWeights::bo, Kind::Rank0},                   {"b_down", &LayerWeights::b_down, Kind::Rank0},
};
const std::vector<std::pair<const char*, std::vector<float> ModelWeights::*>> kModelFields = {
    {"embed", &ModelWeights::embed},           {"pos_embed", &ModelWeights::pos_embed},
    {"project_in", &ModelWeights::project_in}, {"project_out", &ModelWeights::project_out},
    {"final_norm_w", &ModelWeights::final_norm_w}, {"final_norm_b", &ModelWeights::final_norm_b},
    {"lm_head", &ModelWeights::lm_head},
};

void expect_same_model(const ModelWeights& got, const ModelWeights& want, const std::string& what) {
  for (const auto& [n, m] : kModelFields) expect_bits(got.*m, want.*m, what + " " + n);
  ASSERT_EQ(got.layers.size(), want.layers.size()) << what;
  for (size_t l = 0; l < want.layers.size(); ++l)
    for (const auto& f : kLayerFields)
      expect_bits(got.layers[l].*f.m, want.layers[l].*f.m, what + " layer " + std::to_string(l) + " " + f.name);
}

void append(std::vector<float>& dst, const std::vector<float>& src) { dst.insert(dst.end(), src.begin(), src.end()); }

// Puts the T*P shards back into one model: row blocks concatenated in rank order, column blocks side by
// side, rank 0's biases, replicated tensors checked equal on every rank that holds them and absent on
// the others. Also checks each shard's cfg and WeightShard.
ModelWeights reassemble(const ModelConfig& c, const std::vector<ModelWeights>& s, int64_t T, int64_t P,
                        const std::vector<std::pair<int64_t, int64_t>>& stages) {
  EXPECT_EQ(int64_t(s.size()), T * P);
  const int64_t V = c.vocab_size, Vp = (V + T - 1) / T, H = c.hidden_size;
  ModelWeights w;
  w.cfg = c;
  w.layers.resize(size_t(c.num_layers));
  for (int64_t p = 0; p < P; ++p) {
    for (int64_t t = 0; t < T; ++t) {
      const ModelWeights& r = s[size_t(p * T + t)];
      const std::string who = "rank t" + std::to_string(t) + " p" + std::to_string(p);
      EXPECT_EQ(r.cfg.num_heads, c.num_heads / T) << who;
      EXPECT_EQ(r.cfg.num_kv_heads, c.num_kv_heads / T) << who;
      EXPECT_EQ(r.cfg.intermediate_size, c.intermediate_size / T) << who;
      EXPECT_EQ(r.cfg.head_dim, c.head_dim) << who;
      EXPECT_EQ(r.cfg.vocab_size, V) << who;
      EXPECT_EQ(r.cfg.hidden_size, H) << who;
      EXPECT_EQ(r.cfg.full_num_layers, c.full_num_layers) << who;
      EXPECT_EQ(r.cfg.num_layers, stages[size_t(p)].second - stages[size_t(p)].first) << who;
      EXPECT_EQ(int64_t(r.layers.size()), r.cfg.num_layers) << who;
      const WeightShard& sh = r.shard;
      EXPECT_EQ(sh.tp_rank, t) << who;
      EXPECT_EQ(sh.tp_size, T) << who;
      EXPECT_EQ(sh.pp_rank, p) << who;
      EXPECT_EQ(sh.pp_size, P) << who;
      EXPECT_EQ(sh.layer_begin, stages[size_t(p)].first) << who;
      EXPECT_EQ(sh.layer_end, stages[size_t(p)].second) << who;
      EXPECT_EQ(sh.vocab_begin, t * Vp) << who;
      EXPECT_EQ(sh.vocab_end, std::min((t + 1) * Vp, V)) << who;
      EXPECT_EQ(sh.vocab_padded, Vp) << who;
      EXPECT_EQ(sh.first_stage, p == 0) << who;
      EXPECT_EQ(sh.last_stage, p == P - 1) << who;
      // Model-level tensors only where the stage uses them.
      if (p > 0) {
        EXPECT_TRUE(r.embed.empty() && r.pos_embed.empty() && r.project_in.empty()) << who;
      }
      if (p < P - 1) {
        EXPECT_TRUE(r.lm_head.empty() && r.final_norm_w.empty() && r.final_norm_b.empty() && r.project_out.empty())
            << who;
      }
    }
    const ModelWeights& r0 = s[size_t(p * T)];
    for (size_t i = 0; i < r0.layers.size(); ++i) {
      LayerWeights& L = w.layers[size_t(r0.shard.layer_begin) + i];
      for (const auto& f : kLayerFields) {
        std::vector<float>& dst = L.*f.m;
        const auto part = [&](int64_t t) -> const std::vector<float>& { return s[size_t(p * T + t)].layers[i].*f.m; };
        const std::string what = std::string(f.name) + " of layer " + std::to_string(r0.shard.layer_begin + int64_t(i));
        switch (f.kind) {
          case Kind::Rows:
            for (int64_t t = 0; t < T; ++t) append(dst, part(t));
            break;
          case Kind::Cols: {  // [H, in/T] blocks side by side
            const int64_t w_t = int64_t(part(0).size()) / H;
            dst.assign(size_t(H * w_t * T), 0.0f);
            for (int64_t t = 0; t < T; ++t) {
              EXPECT_EQ(int64_t(part(t).size()), H * w_t) << what;
              for (int64_t row = 0; row < H; ++row)
                std::memcpy(dst.data() + row * w_t * T + t * w_t, part(t).data() + row * w_t, size_t(w_t) * sizeof(float));
            }
            break;
          }
          case Kind::Rank0:
            dst = part(0);
            for (int64_t t = 1; t < T; ++t) EXPECT_TRUE(part(t).empty()) << what << " held by tensor rank " << t;
            break;
          case Kind::Whole:
            dst = part(0);
            for (int64_t t = 1; t < T; ++t) expect_bits(part(t), part(0), what + " replica on rank " + std::to_string(t));
            break;
        }
      }
    }
  }
  // The embedding side from stage 0, the head side from the last stage.
  const auto first = [&](int64_t t) -> const ModelWeights& { return s[size_t(t)]; };
  const auto last = [&](int64_t t) -> const ModelWeights& { return s[size_t((P - 1) * T + t)]; };
  std::vector<float> head;
  for (int64_t t = 0; t < T; ++t) {
    append(w.embed, first(t).embed);
    append(head, last(t).lm_head);
    expect_bits(first(t).pos_embed, first(0).pos_embed, "pos_embed replica");
    expect_bits(first(t).project_in, first(0).project_in, "project_in replica");
    expect_bits(last(t).final_norm_w, last(0).final_norm_w, "final_norm_w replica");
    expect_bits(last(t).final_norm_b, last(0).final_norm_b, "final_norm_b replica");
    expect_bits(last(t).project_out, last(0).project_out, "project_out replica");
  }
  w.pos_embed = first(0).pos_embed;
  w.project_in = first(0).project_in;
  w.final_norm_w = last(0).final_norm_w;
  w.final_norm_b = last(0).final_norm_b;
  w.project_out = last(0).project_out;
  if (c.tie_word_embeddings && P > 1) {
    expect_bits(head, w.embed, "tied LM head on the last stage");  // the same rows as the embedding
  } else {
    w.lm_head = head;
  }
  return w;
}

// Loads the shards and checks them against load_model_weights from an identical source.
void check_reassembles(const ModelConfig& c, TensorSource& src, TensorSource& whole_src, int64_t T, int64_t P,
                       const std::vector<int64_t>& counts = {}) {
  const std::string what = c.name + " T=" + std::to_string(T) + " P=" + std::to_string(P);
  SCOPED_TRACE(what);
  const auto stages = stage_layers(c.num_layers, P, counts);
  const std::vector<ModelWeights> s = load_model_shards(c, src, T, stages);
  const ModelWeights whole = load_model_weights(c, whole_src);
  expect_same_model(reassemble(c, s, T, P, stages), whole, what);
  if (T == 1 && P == 1) expect_same_model(s[0], whole, what + " (as is)");
}

// A TensorSource that counts reads per tensor name, passing everything to another source.
class CountingSource : public TensorSource {
 public:
  explicit CountingSource(std::unique_ptr<TensorSource> s) : s_(std::move(s)) {}
  std::vector<float> read(const TensorSpec& spec) override {
    ++reads[spec.name];
    return s_->read(spec);
  }
  std::string describe() const override { return s_->describe(); }
  void check(const std::vector<TensorSpec>& needed, const std::vector<TensorSpec>& skipped) const override {
    s_->check(needed, skipped);
  }
  std::map<std::string, int> reads;

 private:
  std::unique_ptr<TensorSource> s_;
};

// Variants of the tiny models with every optional tensor: Llama with all biases (q/k/v/o, MLP) and a
// tied embedding; OPT with projected embeddings (project_in/out) and an untied head; an uneven vocabulary.
std::vector<ModelConfig> variants() {
  ModelConfig bias = tiny("tiny-llama");
  bias.name = "tiny-llama+biases+tied";
  bias.attention_bias = bias.o_bias = bias.mlp_bias = true;
  bias.tie_word_embeddings = true;
  ModelConfig proj = tiny("tiny-opt");
  proj.name = "tiny-opt+proj+untied";
  proj.word_embed_proj_dim = 32;
  proj.tie_word_embeddings = false;
  ModelConfig odd = tiny("tiny-llama-gqa");
  odd.name = "tiny-llama-gqa+V317";
  odd.vocab_size = 317;  // Vp = 159: rank 1 holds 158 rows
  return {bias, proj, odd};
}

const std::vector<std::string> kModels = {"tiny-llama", "tiny-opt", "tiny-llama-gqa"};

}  // namespace

TEST(Shard, ReassemblesToTheWholeModelFromRandomWeights) {
  for (const auto& name : kModels) {
    const ModelConfig c = tiny(name);
    for (int64_t T : {1, 2})
      for (int64_t P : {1, 2}) {
        auto a = make_random_source(5, DType::F16), b = make_random_source(5, DType::F16);
        check_reassembles(c, *a, *b, T, P);
      }
  }
  for (const auto& c : variants())
    for (int64_t T : {1, 2})
      for (int64_t P : {1, 2}) {
        auto a = make_random_source(6, DType::BF16), b = make_random_source(6, DType::BF16);
        check_reassembles(c, *a, *b, T, P);
      }
  // Uneven stages, both ways round (tiny-llama-gqa has 3 layers).
  const ModelConfig g = tiny("tiny-llama-gqa");
  for (const std::vector<int64_t>& counts : {std::vector<int64_t>{1, 2}, std::vector<int64_t>{2, 1}}) {
    auto a = make_random_source(7, DType::F32), b = make_random_source(7, DType::F32);
    check_reassembles(g, *a, *b, 2, 2, counts);
  }
  auto a = make_random_source(8, DType::F16), b = make_random_source(8, DType::F16);
  check_reassembles(g, *a, *b, 2, 3);
}

TEST(Shard, ReassemblesToTheWholeModelFromACheckpoint) {
  for (const auto& name : kModels) {
    const ModelConfig c = tiny(name);
    TempDir d("shard_ckpt");
    write_random_weights(c, 11, DType::BF16, d.path.string(), nullptr, 40000);  // several safetensors shards
    for (int64_t T : {1, 2})
      for (int64_t P : {1, 2}) {
        auto a = open_safetensors_source(d.path.string()), b = open_safetensors_source(d.path.string());
        check_reassembles(c, *a, *b, T, P);
      }
  }
}

TEST(Shard, OnePassReadsEachTensorOnce) {
  for (const auto& name : kModels) {
    const ModelConfig c = tiny(name);
    CountingSource src(make_random_source(3, DType::F16));
    load_model_shards(c, src, 2, stage_layers(c.num_layers, 2, {}));
    EXPECT_EQ(src.reads.size(), model_tensor_specs(c).size()) << name;
    for (const auto& [n, k] : src.reads) EXPECT_EQ(k, 1) << name << " " << n;
  }
}

TEST(Shard, OneRankReadsOnlyWhatItHolds) {
  for (const auto& name : {"tiny-llama-gqa", "tiny-opt"}) {  // untied and tied head
    const ModelConfig c = tiny(name);
    const int64_t T = 2, P = 2;
    const auto stages = stage_layers(c.num_layers, P, {});
    auto all_src = make_random_source(4, DType::F16);
    const std::vector<ModelWeights> all = load_model_shards(c, *all_src, T, stages);
    for (int64_t g = 0; g < T * P; ++g) {
      const int64_t p = g / T;
      CountingSource src(make_random_source(4, DType::F16));
      const ModelWeights one = load_model_shard(c, src, T, stages, g);
      const std::string what = std::string(name) + " rank " + std::to_string(g);
      expect_same_model(one, all[size_t(g)], what);
      EXPECT_EQ(one.shard.tp_rank, g % T) << what;
      EXPECT_EQ(one.shard.pp_rank, p) << what;
      // What rank g needs: its stage's layers; the embedding side on stage 0; the head side on the last.
      std::set<std::string> want;
      const std::string lp = c.arch == Arch::Llama ? "model.layers." : "model.decoder.layers.";
      for (const auto& spec : model_tensor_specs(c)) {
        const std::string& n = spec.name;
        if (n.rfind(lp, 0) == 0) {
          const int64_t l = std::stoll(n.substr(lp.size()));
          if (l >= stages[size_t(p)].first && l < stages[size_t(p)].second) want.insert(n);
        } else if (n.find("embed_tokens") != std::string::npos) {
          if (p == 0 || (p == P - 1 && c.tie_word_embeddings)) want.insert(n);
        } else if (n.find("embed_positions") != std::string::npos || n.find("project_in") != std::string::npos) {
          if (p == 0) want.insert(n);
        } else if (p == P - 1) {
          want.insert(n);  // final norm, project_out, lm_head
        }
      }
      std::set<std::string> got;
      for (const auto& [n, k] : src.reads) {
        got.insert(n);
        EXPECT_EQ(k, 1) << what << " " << n;
      }
      EXPECT_EQ(got, want) << what;
    }
  }
  CountingSource src(make_random_source(4, DType::F16));
  const ModelConfig c = tiny("tiny-llama");
  expect_parts(config_error([&] { load_model_shard(c, src, 2, stage_layers(2, 2, {}), 4); }),
               {"tiny-llama", "rank 4 does not exist", "2 tensor x 2 pipeline"});
}

TEST(Shard, StageLayers) {
  using V = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(stage_layers(3, 1, {}), (V{{0, 3}}));
  EXPECT_EQ(stage_layers(3, 2, {}), (V{{0, 2}, {2, 3}}));
  EXPECT_EQ(stage_layers(7, 3, {}), (V{{0, 3}, {3, 5}, {5, 7}}));  // floor(7/3) = 2 each, the first 7 % 3 one more
  EXPECT_EQ(stage_layers(8, 4, {}), (V{{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
  EXPECT_EQ(stage_layers(3, 3, {}), (V{{0, 1}, {1, 2}, {2, 3}}));
  EXPECT_EQ(stage_layers(96, 2, {}), (V{{0, 48}, {48, 96}}));
  EXPECT_EQ(stage_layers(3, 2, {1, 2}), (V{{0, 1}, {1, 3}}));
  EXPECT_EQ(stage_layers(5, 3, {3, 1, 1}), (V{{0, 3}, {3, 4}, {4, 5}}));
}

TEST(Shard, StageLayersRefusals) {
  expect_parts(config_error([] { stage_layers(3, 0, {}); }), {"engine.parallel.pipeline must be >= 1, got 0"});
  expect_parts(config_error([] { stage_layers(3, -2, {}); }), {"engine.parallel.pipeline", "got -2"});
  expect_parts(config_error([] { stage_layers(2, 3, {}); }),
               {"engine.parallel.pipeline 3", "the model's 2 layers", "at least one"});
  expect_parts(config_error([] { stage_layers(3, 2, {1, 1, 1}); }),
               {"engine.parallel.layers has 3 entries", "engine.parallel.pipeline is 2"});
  expect_parts(config_error([] { stage_layers(3, 2, {3}); }),
               {"engine.parallel.layers has 1 entries", "engine.parallel.pipeline is 2"});
  expect_parts(config_error([] { stage_layers(3, 2, {3, 0}); }), {"engine.parallel.layers[1] is 0", "at least 1 layer"});
  expect_parts(config_error([] { stage_layers(3, 2, {-1, 4}); }), {"engine.parallel.layers[0] is -1"});
  expect_parts(config_error([] { stage_layers(3, 2, {2, 2}); }),
               {"engine.parallel.layers sums to 4", "the model runs 3 layers"});
  expect_parts(config_error([] { stage_layers(4, 2, {1, 2}); }),
               {"engine.parallel.layers sums to 3", "the model runs 4 layers"});
}

TEST(Shard, TensorParallelRefusals) {
  const ModelConfig llama = tiny("tiny-llama"), gqa = tiny("tiny-llama-gqa"), opt = tiny("tiny-opt");
  for (int64_t T : {1, 2}) {
    check_tensor_parallel(llama, T);
    check_tensor_parallel(gqa, T);
    check_tensor_parallel(opt, T);
  }
  expect_parts(config_error([&] { check_tensor_parallel(llama, 0); }),
               {"tiny-llama", "engine.parallel.tensor must be >= 1, got 0"});
  expect_parts(config_error([&] { check_tensor_parallel(llama, -1); }), {"engine.parallel.tensor", "got -1"});
  expect_parts(config_error([&] { check_tensor_parallel(llama, 3); }),
               {"tiny-llama has 2 attention heads", "engine.parallel.tensor 3 must divide them"});
  expect_parts(config_error([&] { check_tensor_parallel(gqa, 4); }),
               {"tiny-llama-gqa has 2 KV heads", "engine.parallel.tensor 4 must divide them",
                "GQA KV heads are not replicated across ranks"});
  ModelConfig odd_i = gqa;
  odd_i.intermediate_size = 351;
  expect_parts(config_error([&] { check_tensor_parallel(odd_i, 2); }),
               {"tiny-llama-gqa has intermediate_size 351", "engine.parallel.tensor 2 must divide it"});
  ModelConfig odd_f = opt;
  odd_f.intermediate_size = 255;
  expect_parts(config_error([&] { check_tensor_parallel(odd_f, 2); }),
               {"tiny-opt has ffn_dim 255", "engine.parallel.tensor 2 must divide it"});
  ModelConfig small_v = gqa;  // 4 heads, 4 KV heads, I = 352: only the vocabulary is in the way
  small_v.num_kv_heads = 4;
  small_v.vocab_size = 9;  // T = 4: Vp = 3, rank 3 would start at row 9
  expect_parts(config_error([&] { check_tensor_parallel(small_v, 4); }),
               {"tiny-llama-gqa has vocab_size 9", "engine.parallel.tensor 4", "rank 3 no vocabulary rows",
                "ceil(V/T) = 3"});
  small_v.vocab_size = 10;  // Vp = 3, rank 3 holds row 9
  check_tensor_parallel(small_v, 4);
  // The loaders and shard_config refuse the same way, before reading anything.
  CountingSource src(make_random_source(1, DType::F16));
  expect_parts(config_error([&] { load_model_shards(gqa, src, 4, stage_layers(3, 1, {})); }),
               {"tiny-llama-gqa has 2 KV heads", "engine.parallel.tensor 4"});
  expect_parts(config_error([&] { load_model_shard(gqa, src, 4, stage_layers(3, 1, {}), 0); }),
               {"tiny-llama-gqa has 2 KV heads"});
  expect_parts(config_error([&] { shard_config(llama, 3, 2); }), {"tiny-llama has 2 attention heads"});
  // Stages that do not cover the model's layers contiguously.
  using V = std::vector<std::pair<int64_t, int64_t>>;
  expect_parts(config_error([&] { load_model_shards(gqa, src, 2, V{{0, 1}, {2, 3}}); }),
               {"tiny-llama-gqa", "pipeline stage 1 holds layers [2, 3)", "engine.parallel.layers"});
  expect_parts(config_error([&] { load_model_shards(gqa, src, 2, V{{0, 2}}); }),
               {"the pipeline stages end at layer 2", "the model runs 3 layers"});
  expect_parts(config_error([&] { load_model_shards(gqa, src, 2, V{}); }), {"no pipeline stages"});
  EXPECT_TRUE(src.reads.empty());
}

TEST(Shard, ShardConfigKeepsHeadDimAndGlobalSizes) {
  const ModelConfig c = tiny("tiny-llama-gqa");  // 4 heads, 2 KV heads, D = 32, I = 352, 3 layers
  const ModelConfig s = shard_config(c, 2, 1);
  EXPECT_EQ(s.num_heads, 2);
  EXPECT_EQ(s.num_kv_heads, 1);
  EXPECT_EQ(s.head_dim, 32);
  EXPECT_EQ(s.q_dim(), 64);
  EXPECT_EQ(s.kv_dim(), 32);
  EXPECT_EQ(s.intermediate_size, 176);
  EXPECT_EQ(s.num_layers, 1);
  EXPECT_EQ(s.full_num_layers, 3);
  EXPECT_EQ(s.vocab_size, 320);
  EXPECT_EQ(s.hidden_size, 128);
  EXPECT_EQ(s.name, c.name);
}

namespace {

// Deterministic values in [-1, 1).
std::vector<float> test_values(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(splitmix64(seed + i) >> 40) * 0x1p-23f - 1.0f;
  return v;
}

// y[n, out] = x[n, in] · W[out, in]^T (+ b), fp32 plain loops.
std::vector<float> matmul_t(const std::vector<float>& x, int64_t n, int64_t in, const std::vector<float>& W, int64_t out,
                            const std::vector<float>& b) {
  std::vector<float> y(size_t(n * out));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t o = 0; o < out; ++o) {
      float s = b.empty() ? 0.0f : b[size_t(o)];
      for (int64_t k = 0; k < in; ++k) s += x[size_t(r * in + k)] * W[size_t(o * in + k)];
      y[size_t(r * out + o)] = s;
    }
  return y;
}

// Columns [c0, c0 + w) of [n, cols].
std::vector<float> cols_of(const std::vector<float>& a, int64_t n, int64_t cols, int64_t c0, int64_t w) {
  std::vector<float> out(size_t(n * w));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < w; ++j) out[size_t(r * w + j)] = a[size_t(r * cols + c0 + j)];
  return out;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

float max_abs(const std::vector<float>& a) {
  float m = 0;
  for (float x : a) m = std::max(m, std::fabs(x));
  return m;
}

}  // namespace

// The row-parallel half of the cut: the o-projection of each rank's heads (att_t · wo_t^T, plus the bias
// on rank 0 only) summed over the ranks is the whole o-projection; likewise the MLP with each rank's
// gate/up rows and down columns. T = 2, fp32, within 1e-5.
TEST(Shard, PartialSumsOverRanksGiveTheWholeLayer) {
  for (const auto& name : {"tiny-llama", "tiny-llama-gqa", "tiny-opt"}) {
    ModelConfig c = tiny(name);
    if (c.arch == Arch::Llama) c.o_bias = c.mlp_bias = c.attention_bias = true;  // biases in the cut too
    const int64_t T = 2, n = 3, H = c.hidden_size, qd = c.q_dim(), I = c.intermediate_size;
    auto a = make_random_source(21, DType::F32), b = make_random_source(21, DType::F32);
    const ModelWeights whole = load_model_weights(c, *a);
    const std::vector<ModelWeights> s = load_model_shards(c, *b, T, stage_layers(c.num_layers, 1, {}));
    const LayerWeights& L = whole.layers[1];
    ASSERT_FALSE(L.bo.empty());
    ASSERT_FALSE(L.b_down.empty());
    // o-projection
    const std::vector<float> att = test_values(size_t(n * qd), 99);
    const std::vector<float> want_o = matmul_t(att, n, qd, L.wo, H, L.bo);
    std::vector<float> sum_o(size_t(n * H), 0.0f);
    for (int64_t t = 0; t < T; ++t) {
      const LayerWeights& Lt = s[size_t(t)].layers[1];
      const std::vector<float> part =
          matmul_t(cols_of(att, n, qd, t * qd / T, qd / T), n, qd / T, Lt.wo, H, Lt.bo);
      for (size_t i = 0; i < part.size(); ++i) sum_o[i] += part[i];
    }
    EXPECT_GT(max_abs(want_o), 1e-2f) << name;
    EXPECT_LE(max_abs_diff(sum_o, want_o), 1e-5f) << name << " o-projection";
    // MLP: Llama down(silu(gate h) * up h), OPT fc2(relu(fc1 h))
    const std::vector<float> h = test_values(size_t(n * H), 7);
    const auto mlp = [&](const LayerWeights& W, int64_t width) {
      std::vector<float> up = matmul_t(h, n, H, W.w_up, width, W.b_up);
      if (c.arch == Arch::Llama) {
        const std::vector<float> gate = matmul_t(h, n, H, W.w_gate, width, W.b_gate);
        for (size_t i = 0; i < up.size(); ++i) up[i] *= gate[i] / (1.0f + std::exp(-gate[i]));
      } else {
        for (auto& u : up) u = std::max(u, 0.0f);
      }
      return matmul_t(up, n, width, W.w_down, H, W.b_down);
    };
    const std::vector<float> want_m = mlp(L, I);
    std::vector<float> sum_m(size_t(n * H), 0.0f);
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<float> part = mlp(s[size_t(t)].layers[1], I / T);
      for (size_t i = 0; i < part.size(); ++i) sum_m[i] += part[i];
    }
    EXPECT_GT(max_abs(want_m), 1e-2f) << name;
    EXPECT_LE(max_abs_diff(sum_m, want_m), 1e-5f) << name << " MLP";
  }
}

// The column-parallel half: with the shard config, each rank's q/k/v (norm, projections, biases, RoPE)
// and its decode attention (GQA groups included) are exactly its heads' slice of the whole layer's.
TEST(Shard, EachRankComputesItsHeadsOfTheWholeAttention) {
  for (const auto& name : {"tiny-llama-gqa", "tiny-opt"}) {
    ModelConfig c = tiny(name);
    if (c.arch == Arch::Llama) c.attention_bias = true;
    const int64_t T = 2, n = 4, H = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim();
    auto a = make_random_source(31, DType::F32), b = make_random_source(31, DType::F32);
    const ModelWeights whole = load_model_weights(c, *a);
    const std::vector<ModelWeights> s = load_model_shards(c, *b, T, stage_layers(c.num_layers, 2, {}));
    const std::vector<float> x = test_values(size_t(n * H), 5);
    const std::vector<int64_t> pos = {0, 1, 2, 3};
    std::vector<float> q(size_t(n * qd)), k(size_t(n * kvd)), v(size_t(n * kvd)), out(static_cast<size_t>(qd));
    ref_attention_input(c, whole.layers[0], x.data(), pos.data(), n, q.data(), k.data(), v.data());
    ref_decode_attention(q.data() + (n - 1) * qd, k.data(), v.data(), n, c, out.data());  // the last token
    for (int64_t t = 0; t < T; ++t) {
      const ModelWeights& r = s[size_t(t)];
      const int64_t qt = r.cfg.q_dim(), kvt = r.cfg.kv_dim();
      ASSERT_EQ(qt * T, qd);
      ASSERT_EQ(kvt * T, kvd);
      std::vector<float> qr(size_t(n * qt)), kr(size_t(n * kvt)), vr(size_t(n * kvt)), outr(static_cast<size_t>(qt));
      ref_attention_input(r.cfg, r.layers[0], x.data(), pos.data(), n, qr.data(), kr.data(), vr.data());
      ref_decode_attention(qr.data() + (n - 1) * qt, kr.data(), vr.data(), n, r.cfg, outr.data());
      const std::string what = std::string(name) + " rank " + std::to_string(t);
      expect_bits(qr, cols_of(q, n, qd, t * qt, qt), what + " q");
      expect_bits(kr, cols_of(k, n, kvd, t * kvt, kvt), what + " k");
      expect_bits(vr, cols_of(v, n, kvd, t * kvt, kvt), what + " v");
      expect_bits(outr, cols_of(out, 1, qd, t * qt, qt), what + " attention");
    }
  }
}

// The vocabulary cut: on the first stage the masked embedding (rank t's row when its slice holds the
// token, else zeros) summed over the ranks is the embedding row, exactly; on the last stage each rank's
// logits through lm_head_matrix() (tied or not) are the whole head's logits for its vocabulary rows.
TEST(Shard, VocabularySlicesGiveTheEmbeddingAndTheLogits) {
  ModelConfig odd = tiny("tiny-llama");
  odd.vocab_size = 255;  // uneven: rank 1 holds 127 rows
  for (const ModelConfig& c : {tiny("tiny-llama"), tiny("tiny-opt"), odd}) {
    for (int64_t P : {1, 2}) {
      const int64_t T = 2, V = c.vocab_size, E = c.embed_dim(), n = 2;
      auto a = make_random_source(41, DType::F32), b = make_random_source(41, DType::F32);
      const ModelWeights whole = load_model_weights(c, *a);
      const std::vector<ModelWeights> s = load_model_shards(c, *b, T, stage_layers(c.num_layers, P, {}));
      const std::string what = c.name + " P=" + std::to_string(P);
      for (int64_t tok : {int64_t(0), int64_t(1), V / 2 - 1, V / 2, (V + 1) / 2, V - 1}) {
        std::vector<float> sum(size_t(E), 0.0f);
        for (int64_t t = 0; t < T; ++t) {
          const ModelWeights& r = s[size_t(t)];
          if (tok < r.shard.vocab_begin || tok >= r.shard.vocab_end) continue;
          for (int64_t i = 0; i < E; ++i) sum[size_t(i)] += r.embed[size_t((tok - r.shard.vocab_begin) * E + i)];
        }
        expect_bits(sum, std::vector<float>(whole.embed.begin() + tok * E, whole.embed.begin() + (tok + 1) * E),
                    what + " embedding of token " + std::to_string(tok));
      }
      const std::vector<float> hn = test_values(size_t(n * E), 3);
      const std::vector<float> want = matmul_t(hn, n, E, whole.lm_head_matrix(), V, {});
      for (int64_t t = 0; t < T; ++t) {
        const ModelWeights& r = s[size_t((P - 1) * T + t)];
        const int64_t v0 = r.shard.vocab_begin, rows = r.shard.vocab_end - v0;
        ASSERT_EQ(int64_t(r.lm_head_matrix().size()), rows * E) << what;
        expect_bits(matmul_t(hn, n, E, r.lm_head_matrix(), rows, {}), cols_of(want, n, V, v0, rows),
                    what + " logits of rank " + std::to_string(t));
      }
    }
  }
}
