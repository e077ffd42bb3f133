#include "fastdecode/model/shard.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "fastdecode/core/error.h"

namespace fd {

namespace {

// How a layer tensor is cut over the T tensor ranks (see the table in shard.h). Rows and Cols cut the
// tensor's own dimension 0 / 1 into T equal blocks: rows of q/k/v and gate/up/fc1 are whole heads and
// MLP columns, columns of o/down/fc2 the matching inputs, so the block is always dim / T.
enum class Cut { Whole, Rows, Cols, Rank0 };
struct LayerField {
  std::vector<float> LayerWeights::*member;
  Cut cut;
};

// Tensor name within a layer -> field and cut: the names load_model_weights routes (weights.cpp), for
// Llama and OPT. A name missing here fails the load by name, so a new tensor cannot be dropped silently.
const std::map<std::string, LayerField>& layer_fields() {
  using L = LayerWeights;
  static const std::map<std::string, LayerField> fields = {
      {"input_layernorm.weight", {&L::attn_norm_w, Cut::Whole}},
      {"post_attention_layernorm.weight", {&L::mlp_norm_w, Cut::Whole}},
      {"self_attn_layer_norm.weight", {&L::attn_norm_w, Cut::Whole}},
      {"self_attn_layer_norm.bias", {&L::attn_norm_b, Cut::Whole}},
      {"final_layer_norm.weight", {&L::mlp_norm_w, Cut::Whole}},
      {"final_layer_norm.bias", {&L::mlp_norm_b, Cut::Whole}},
      {"self_attn.q_proj.weight", {&L::wq, Cut::Rows}},
      {"self_attn.k_proj.weight", {&L::wk, Cut::Rows}},
      {"self_attn.v_proj.weight", {&L::wv, Cut::Rows}},
      {"self_attn.q_proj.bias", {&L::bq, Cut::Rows}},
      {"self_attn.k_proj.bias", {&L::bk, Cut::Rows}},
      {"self_attn.v_proj.bias", {&L::bv, Cut::Rows}},
      {"self_attn.o_proj.weight", {&L::wo, Cut::Cols}},
      {"self_attn.out_proj.weight", {&L::wo, Cut::Cols}},
      {"self_attn.o_proj.bias", {&L::bo, Cut::Rank0}},
      {"self_attn.out_proj.bias", {&L::bo, Cut::Rank0}},
      {"mlp.gate_proj.weight", {&L::w_gate, Cut::Rows}},
      {"mlp.gate_proj.bias", {&L::b_gate, Cut::Rows}},
      {"mlp.up_proj.weight", {&L::w_up, Cut::Rows}},
      {"mlp.up_proj.bias", {&L::b_up, Cut::Rows}},
      {"fc1.weight", {&L::w_up, Cut::Rows}},
      {"fc1.bias", {&L::b_up, Cut::Rows}},
      {"mlp.down_proj.weight", {&L::w_down, Cut::Cols}},
      {"fc2.weight", {&L::w_down, Cut::Cols}},
      {"mlp.down_proj.bias", {&L::b_down, Cut::Rank0}},
      {"fc2.bias", {&L::b_down, Cut::Rank0}},
  };
  return fields;
}

// Rows [r0, r1) of a row-major matrix with `cols` columns (a vector: cols = 1).
std::vector<float> slice_rows(const std::vector<float>& t, int64_t cols, int64_t r0, int64_t r1) {
  return std::vector<float>(t.begin() + r0 * cols, t.begin() + r1 * cols);
}

// Columns [c0, c1) of a row-major [rows, cols] matrix.
std::vector<float> slice_cols(const std::vector<float>& t, int64_t rows, int64_t cols, int64_t c0, int64_t c1) {
  const int64_t w = c1 - c0;
  std::vector<float> out(size_t(rows * w));
  for (int64_t r = 0; r < rows; ++r) std::memcpy(out.data() + r * w, t.data() + r * cols + c0, size_t(w) * sizeof(float));
  return out;
}

int64_t vocab_padded(int64_t V, int64_t T) { return (V + T - 1) / T; }

// Checks that `stages` are non-empty contiguous runs covering [0, L).
void check_stages(const ModelConfig& c, const std::vector<std::pair<int64_t, int64_t>>& stages) {
  if (stages.empty()) FD_THROW_BAD_INPUT(c.name << ": no pipeline stages given (engine.parallel.pipeline >= 1)");
  int64_t next = 0;
  for (size_t p = 0; p < stages.size(); ++p) {
    const auto [b, e] = stages[p];
    if (b != next || e <= b)
      FD_THROW_BAD_INPUT(c.name << ": pipeline stage " << p << " holds layers [" << b << ", " << e << "); stages must be "
                                << "non-empty, in order and contiguous from layer 0 (engine.parallel.layers)");
    next = e;
  }
  if (next != c.num_layers)
    FD_THROW_BAD_INPUT(c.name << ": the pipeline stages end at layer " << next << "; the model runs " << c.num_layers
                              << " layers (engine.parallel.layers)");
}

// Every rank's part (rank g = p*T + t), reading only tensors that some rank with want[g] needs. Ranks
// not wanted come back with their cfg and shard set and no tensors.
std::vector<ModelWeights> load_ranks(const ModelConfig& c, TensorSource& src, int64_t T,
                                     const std::vector<std::pair<int64_t, int64_t>>& stages,
                                     const std::vector<bool>& want) {
  check_tensor_parallel(c, T);
  check_stages(c, stages);
  check_tensor_source(c, src);  // the whole tensor set before any tensor is read (no-op for random weights)
  const int64_t P = int64_t(stages.size()), V = c.vocab_size, Vp = vocab_padded(V, T);
  std::vector<ModelWeights> w(size_t(T * P));
  std::vector<int64_t> stage_of(size_t(c.num_layers));
  for (int64_t p = 0; p < P; ++p) {
    const auto [b, e] = stages[size_t(p)];
    for (int64_t l = b; l < e; ++l) stage_of[size_t(l)] = p;
    for (int64_t t = 0; t < T; ++t) {
      ModelWeights& r = w[size_t(p * T + t)];
      r.cfg = shard_config(c, T, e - b);
      r.layers.resize(size_t(e - b));
      r.shard = WeightShard{t, T, p, P, b, e, std::min(t * Vp, V), std::min((t + 1) * Vp, V), Vp, p == 0, p == P - 1};
    }
  }
  // The wanted ranks of stage p.
  const auto ranks_of = [&](int64_t p) {
    std::vector<int64_t> g;
    for (int64_t t = 0; t < T; ++t)
      if (want[size_t(p * T + t)]) g.push_back(p * T + t);
    return g;
  };
  const std::string lp = c.arch == Arch::Llama ? "model.layers." : "model.decoder.layers.";
  for (const auto& spec : model_tensor_specs(c)) {
    const std::string& n = spec.name;
    if (n.rfind(lp, 0) == 0) {  // a layer tensor: the ranks of the stage that runs the layer
      const size_t dot = n.find('.', lp.size());
      const int64_t l = std::stoll(n.substr(lp.size(), dot - lp.size()));
      const auto it = layer_fields().find(n.substr(dot + 1));
      FD_CHECK(it != layer_fields().end(), "no field for tensor " << n);
      const int64_t p = stage_of[size_t(l)];
      const std::vector<int64_t> ranks = ranks_of(p);
      if (ranks.empty()) continue;  // not read at all
      std::vector<float> x = src.read(spec);
      const Cut cut = T == 1 && it->second.cut != Cut::Whole ? Cut::Whole : it->second.cut;  // T = 1: no cut
      for (size_t i = 0; i < ranks.size(); ++i) {
        ModelWeights& r = w[size_t(ranks[i])];
        std::vector<float>& dst = r.layers[size_t(l - r.shard.layer_begin)].*(it->second.member);
        const int64_t t = r.shard.tp_rank;
        const bool last = i + 1 == ranks.size();
        switch (cut) {
          case Cut::Whole: dst = last ? std::move(x) : x; break;
          case Cut::Rank0: if (t == 0) dst = x; break;  // empty elsewhere: the bias is added once
          case Cut::Rows: {
            const int64_t rows = spec.shape[0] / T, cols = spec.shape.size() > 1 ? spec.shape[1] : 1;
            dst = slice_rows(x, cols, t * rows, (t + 1) * rows);
            break;
          }
          case Cut::Cols: {
            const int64_t cols = spec.shape[1] / T;
            dst = slice_cols(x, spec.shape[0], spec.shape[1], t * cols, (t + 1) * cols);
            break;
          }
        }
      }
      continue;
    }
    // Model-level tensors: the embedding side on the first stage, the head side on the last.
    const bool embed = n == "model.embed_tokens.weight" || n == "model.decoder.embed_tokens.weight";
    const bool head_side = n == "lm_head.weight" || n == "model.norm.weight" ||
                           n == "model.decoder.final_layer_norm.weight" || n == "model.decoder.final_layer_norm.bias" ||
                           n == "model.decoder.project_out.weight";
    const bool embed_side = embed || n == "model.decoder.embed_positions.weight" || n == "model.decoder.project_in.weight";
    FD_CHECK(head_side || embed_side, "no field for tensor " << n);
    // (rank, field) pairs; a tied embedding also goes to the last stage's lm_head (unless that stage is
    // the first, whose embed already holds the same rows).
    std::vector<std::pair<int64_t, std::vector<float> ModelWeights::*>> to;
    const auto add = [&](int64_t p, std::vector<float> ModelWeights::*f) {
      for (int64_t g : ranks_of(p)) to.push_back({g, f});
    };
    if (embed) {
      add(0, &ModelWeights::embed);
      if (c.tie_word_embeddings && P > 1) add(P - 1, &ModelWeights::lm_head);
    } else if (n == "model.decoder.embed_positions.weight") add(0, &ModelWeights::pos_embed);
    else if (n == "model.decoder.project_in.weight") add(0, &ModelWeights::project_in);
    else if (n == "model.decoder.project_out.weight") add(P - 1, &ModelWeights::project_out);
    else if (n == "model.norm.weight" || n == "model.decoder.final_layer_norm.weight") add(P - 1, &ModelWeights::final_norm_w);
    else if (n == "model.decoder.final_layer_norm.bias") add(P - 1, &ModelWeights::final_norm_b);
    else add(P - 1, &ModelWeights::lm_head);
    if (to.empty()) continue;  // not read at all
    std::vector<float> x = src.read(spec);
    const bool by_vocab = embed || n == "lm_head.weight";
    for (size_t i = 0; i < to.size(); ++i) {
      ModelWeights& r = w[size_t(to[i].first)];
      std::vector<float>& dst = r.*(to[i].second);
      const bool last = i + 1 == to.size();
      if (by_vocab && T > 1) dst = slice_rows(x, spec.shape[1], r.shard.vocab_begin, r.shard.vocab_end);
      else dst = last ? std::move(x) : x;
    }
  }
  return w;
}

}  // namespace

void check_tensor_parallel(const ModelConfig& c, int64_t T) {
  if (T < 1) FD_THROW_BAD_INPUT(c.name << ": engine.parallel.tensor must be >= 1, got " << T);
  if (c.num_heads % T != 0)
    FD_THROW_BAD_INPUT(c.name << " has " << c.num_heads << " attention heads; engine.parallel.tensor " << T
                              << " must divide them (each rank holds whole heads)");
  if (c.num_kv_heads % T != 0)
    FD_THROW_BAD_INPUT(c.name << " has " << c.num_kv_heads << " KV heads; engine.parallel.tensor " << T
                              << " must divide them (GQA KV heads are not replicated across ranks)");
  const char* ffn = c.arch == Arch::OPT ? "ffn_dim" : "intermediate_size";
  if (c.intermediate_size % T != 0)
    FD_THROW_BAD_INPUT(c.name << " has " << ffn << " " << c.intermediate_size << "; engine.parallel.tensor " << T
                              << " must divide it (each rank holds an equal block of MLP columns)");
  const int64_t Vp = vocab_padded(c.vocab_size, T);
  if ((T - 1) * Vp >= c.vocab_size)
    FD_THROW_BAD_INPUT(c.name << " has vocab_size " << c.vocab_size << "; engine.parallel.tensor " << T
                              << " leaves tensor rank " << T - 1 << " no vocabulary rows (each rank holds ceil(V/T) = "
                              << Vp << ")");
}

std::vector<std::pair<int64_t, int64_t>> stage_layers(int64_t L, int64_t P, const std::vector<int64_t>& counts) {
  if (P < 1) FD_THROW_BAD_INPUT("engine.parallel.pipeline must be >= 1, got " << P);
  if (L < P)
    FD_THROW_BAD_INPUT("engine.parallel.pipeline " << P << " is more than the model's " << L
                                                   << " layers (each stage runs at least one)");
  std::vector<int64_t> n = counts;
  if (n.empty()) {
    for (int64_t p = 0; p < P; ++p) n.push_back(L / P + (p < L % P ? 1 : 0));
  } else {
    if (int64_t(n.size()) != P)
      FD_THROW_BAD_INPUT("engine.parallel.layers has " << n.size() << " entries; engine.parallel.pipeline is " << P
                                                       << " (one layer count per stage)");
    int64_t sum = 0;
    for (size_t p = 0; p < n.size(); ++p) {
      if (n[p] < 1)
        FD_THROW_BAD_INPUT("engine.parallel.layers[" << p << "] is " << n[p] << "; each stage runs at least 1 layer");
      sum += n[p];
    }
    if (sum != L) FD_THROW_BAD_INPUT("engine.parallel.layers sums to " << sum << "; the model runs " << L << " layers");
  }
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t b = 0;
  for (int64_t k : n) {
    out.push_back({b, b + k});
    b += k;
  }
  return out;
}

ModelConfig shard_config(const ModelConfig& c, int64_t T, int64_t n_layers) {
  check_tensor_parallel(c, T);
  FD_CHECK(n_layers >= 1 && n_layers <= c.num_layers, c.name << ": a stage of " << n_layers << " layers (model runs "
                                                             << c.num_layers << ")");
  ModelConfig s = c;
  s.num_heads = c.num_heads / T;
  s.num_kv_heads = c.num_kv_heads / T;
  s.intermediate_size = c.intermediate_size / T;
  s.num_layers = n_layers;
  return s;
}

std::vector<ModelWeights> load_model_shards(const ModelConfig& c, TensorSource& src, int64_t T,
                                            const std::vector<std::pair<int64_t, int64_t>>& stages) {
  return load_ranks(c, src, T, stages, std::vector<bool>(size_t(std::max<int64_t>(T, 0)) * stages.size(), true));
}

ModelWeights load_model_shard(const ModelConfig& c, TensorSource& src, int64_t T,
                              const std::vector<std::pair<int64_t, int64_t>>& stages, int64_t rank) {
  check_tensor_parallel(c, T);
  const int64_t n = T * int64_t(stages.size());
  if (rank < 0 || rank >= n)
    FD_THROW_BAD_INPUT(c.name << ": rank " << rank << " does not exist (" << T << " tensor x " << stages.size()
                              << " pipeline ranks)");
  std::vector<bool> want(size_t(n), false);
  want[size_t(rank)] = true;
  return std::move(load_ranks(c, src, T, stages, want)[size_t(rank)]);
}

}  // namespace fd
