#include "fastdecode/model/weights.h"

#include <cmath>
#include <filesystem>
#include <map>

#include "fastdecode/core/error.h"
#include "fastdecode/model/safetensors.h"

namespace fd {

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::vector<TensorSpec> model_tensor_specs(const ModelConfig& c) {
  const int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const auto lin = [](int64_t in) { return float(1.0 / std::sqrt(double(in))); };
  // Residual-branch outputs are scaled down by sqrt(2 * full depth) so the residual stream grows
  // like a random walk of total variance ~1 however many layers run (GPT-2 style).
  const float out_scale = float(1.0 / std::sqrt(2.0 * double(c.full_num_layers)));
  // Untied embeddings: unit scale. Tied (OPT): H^-1/4, so logits = norm(x)·E^T have std ~H^1/4.
  const float emb = c.tie_word_embeddings ? float(std::pow(double(H), -0.25)) : 1.0f;
  const float norm_sd = 0.05f, bias_sd = 0.02f;
  std::vector<TensorSpec> s;
  if (c.arch == Arch::Llama) {
    s.push_back({"model.embed_tokens.weight", {V, H}, 0, emb});
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      s.push_back({p + "input_layernorm.weight", {H}, 1, norm_sd});
      s.push_back({p + "self_attn.q_proj.weight", {c.q_dim(), H}, 0, lin(H)});
      if (c.attention_bias) s.push_back({p + "self_attn.q_proj.bias", {c.q_dim()}, 0, bias_sd});
      s.push_back({p + "self_attn.k_proj.weight", {c.kv_dim(), H}, 0, lin(H)});
      if (c.attention_bias) s.push_back({p + "self_attn.k_proj.bias", {c.kv_dim()}, 0, bias_sd});
      s.push_back({p + "self_attn.v_proj.weight", {c.kv_dim(), H}, 0, lin(H)});
      if (c.attention_bias) s.push_back({p + "self_attn.v_proj.bias", {c.kv_dim()}, 0, bias_sd});
      s.push_back({p + "self_attn.o_proj.weight", {H, c.q_dim()}, 0, lin(c.q_dim()) * out_scale});
      if (c.o_bias) s.push_back({p + "self_attn.o_proj.bias", {H}, 0, bias_sd * out_scale});
      s.push_back({p + "post_attention_layernorm.weight", {H}, 1, norm_sd});
      s.push_back({p + "mlp.gate_proj.weight", {I, H}, 0, lin(H)});
      if (c.mlp_bias) s.push_back({p + "mlp.gate_proj.bias", {I}, 0, bias_sd});
      s.push_back({p + "mlp.up_proj.weight", {I, H}, 0, lin(H)});
      if (c.mlp_bias) s.push_back({p + "mlp.up_proj.bias", {I}, 0, bias_sd});
      s.push_back({p + "mlp.down_proj.weight", {H, I}, 0, lin(I) * out_scale});
      if (c.mlp_bias) s.push_back({p + "mlp.down_proj.bias", {H}, 0, bias_sd * out_scale});
    }
    s.push_back({"model.norm.weight", {H}, 1, norm_sd});
  } else {
    const int64_t P = c.embed_dim();
    s.push_back({"model.decoder.embed_tokens.weight", {V, P}, 0, emb});
    s.push_back({"model.decoder.embed_positions.weight", {c.max_position_embeddings + 2, H}, 0, emb});
    // project_in: [H, P] maps embeddings of width P to the residual width H (1/sqrt(P): the
    // embedding's scale carries over)
    if (c.has_projections()) s.push_back({"model.decoder.project_in.weight", {H, P}, 0, lin(P)});
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const std::string p = "model.decoder.layers." + std::to_string(l) + ".";
      for (const char* proj : {"q_proj", "k_proj", "v_proj"}) {
        s.push_back({p + "self_attn." + proj + ".weight", {H, H}, 0, lin(H)});
        s.push_back({p + "self_attn." + proj + ".bias", {H}, 0, bias_sd});
      }
      s.push_back({p + "self_attn.out_proj.weight", {H, H}, 0, lin(H) * out_scale});
      s.push_back({p + "self_attn.out_proj.bias", {H}, 0, bias_sd});
      s.push_back({p + "self_attn_layer_norm.weight", {H}, 1, norm_sd});
      s.push_back({p + "self_attn_layer_norm.bias", {H}, 0, bias_sd});
      s.push_back({p + "fc1.weight", {I, H}, 0, lin(H)});
      s.push_back({p + "fc1.bias", {I}, 0, bias_sd});
      s.push_back({p + "fc2.weight", {H, I}, 0, lin(I) * out_scale});
      s.push_back({p + "fc2.bias", {H}, 0, bias_sd});
      s.push_back({p + "final_layer_norm.weight", {H}, 1, norm_sd});
      s.push_back({p + "final_layer_norm.bias", {H}, 0, bias_sd});
    }
    if (c.has_final_norm()) {
      s.push_back({"model.decoder.final_layer_norm.weight", {H}, 1, norm_sd});
      s.push_back({"model.decoder.final_layer_norm.bias", {H}, 0, bias_sd});
    }
    if (c.has_projections()) s.push_back({"model.decoder.project_out.weight", {P, H}, 0, lin(H)});
  }
  if (!c.tie_word_embeddings) s.push_back({"lm_head.weight", {V, c.embed_dim()}, 0, lin(c.embed_dim())});
  return s;
}

void random_tensor_bytes(const TensorSpec& spec, uint64_t seed, DType dtype, void* out) {
  const uint64_t base = splitmix64(seed ^ fnv1a64(spec.name));
  const float bound = float(std::sqrt(3.0) * spec.stddev);
  const int64_t n = spec.numel();
  const size_t es = dtype_size(dtype);
  constexpr int64_t kChunk = 4096;
#pragma omp parallel for schedule(static)
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    float buf[kChunk];
    const int64_t m = std::min(kChunk, n - c0);
    for (int64_t j = 0; j < m; ++j) {
      // Counter-based: element i uses the splitmix64 output for state base + i.
      const uint64_t z = splitmix64(base + uint64_t(c0 + j) * 0x9e3779b97f4a7c15ull);
      const float u = float(z >> 40) * 0x1p-24f;  // exact: 24 random bits in [0, 1)
      // Two separately rounded IEEE operations (no contraction across statements): same bits everywhere.
      const float centred = (2.0f * u - 1.0f) * bound;
      buf[j] = spec.mean + centred;
    }
    convert_from_f32(dtype, buf, static_cast<char*>(out) + size_t(c0) * es, size_t(m));
  }
}

// write_random_weights and open_safetensors_source: fastdecode/model/checkpoint.cpp.

namespace {

class RandomSource : public TensorSource {
 public:
  RandomSource(uint64_t seed, DType dtype) : seed_(seed), dtype_(dtype) {}
  std::vector<float> read(const TensorSpec& spec) override {
    std::vector<char> bytes(size_t(spec.numel()) * dtype_size(dtype_));
    random_tensor_bytes(spec, seed_, dtype_, bytes.data());
    std::vector<float> out(size_t(spec.numel()));
    convert_to_f32(dtype_, bytes.data(), out.data(), out.size());
    return out;
  }
  std::string describe() const override {
    return "random weights (seed " + std::to_string(seed_) + ", " + std::string(dtype_name(dtype_)) + ")";
  }

 private:
  uint64_t seed_;
  DType dtype_;
};

}  // namespace

std::unique_ptr<TensorSource> make_random_source(uint64_t seed, DType dtype) {
  return std::make_unique<RandomSource>(seed, dtype);
}

ModelWeights load_model_weights(const ModelConfig& cfg, TensorSource& src) {
  check_tensor_source(cfg, src);  // the whole tensor set before any tensor is read (no-op for random weights)
  ModelWeights w;
  w.cfg = cfg;
  w.layers.resize(size_t(cfg.num_layers));
  // Route each tensor by its HF name to its field; the spec list is the single source of names.
  for (const auto& spec : model_tensor_specs(cfg)) {
    std::vector<float> t = src.read(spec);
    const std::string& n = spec.name;
    const std::string lp = cfg.arch == Arch::Llama ? "model.layers." : "model.decoder.layers.";
    if (n.rfind(lp, 0) == 0) {
      const size_t dot = n.find('.', lp.size());
      const int64_t l = std::stoll(n.substr(lp.size(), dot - lp.size()));
      const std::string f = n.substr(dot + 1);
      LayerWeights& L = w.layers[size_t(l)];
      static const std::map<std::string, std::vector<float> LayerWeights::*> fields = {
          {"input_layernorm.weight", &LayerWeights::attn_norm_w},
          {"post_attention_layernorm.weight", &LayerWeights::mlp_norm_w},
          {"self_attn.q_proj.weight", &LayerWeights::wq},
          {"self_attn.k_proj.weight", &LayerWeights::wk},
          {"self_attn.v_proj.weight", &LayerWeights::wv},
          {"self_attn.o_proj.weight", &LayerWeights::wo},
          {"self_attn.out_proj.weight", &LayerWeights::wo},
          {"self_attn.q_proj.bias", &LayerWeights::bq},
          {"self_attn.k_proj.bias", &LayerWeights::bk},
          {"self_attn.v_proj.bias", &LayerWeights::bv},
          {"self_attn.out_proj.bias", &LayerWeights::bo},
          {"self_attn.o_proj.bias", &LayerWeights::bo},
          {"mlp.gate_proj.bias", &LayerWeights::b_gate},
          {"mlp.up_proj.bias", &LayerWeights::b_up},
          {"mlp.down_proj.bias", &LayerWeights::b_down},
          {"self_attn_layer_norm.weight", &LayerWeights::attn_norm_w},
          {"self_attn_layer_norm.bias", &LayerWeights::attn_norm_b},
          {"final_layer_norm.weight", &LayerWeights::mlp_norm_w},
          {"final_layer_norm.bias", &LayerWeights::mlp_norm_b},
          {"mlp.gate_proj.weight", &LayerWeights::w_gate},
          {"mlp.up_proj.weight", &LayerWeights::w_up},
          {"mlp.down_proj.weight", &LayerWeights::w_down},
          {"fc1.weight", &LayerWeights::w_up},
          {"fc1.bias", &LayerWeights::b_up},
          {"fc2.weight", &LayerWeights::w_down},
          {"fc2.bias", &LayerWeights::b_down},
      };
      auto it = fields.find(f);
      FD_CHECK(it != fields.end(), "no field for tensor " << n);
      L.*(it->second) = std::move(t);
    } else if (n == "model.embed_tokens.weight" || n == "model.decoder.embed_tokens.weight") {
      w.embed = std::move(t);
    } else if (n == "model.decoder.embed_positions.weight") {
      w.pos_embed = std::move(t);
    } else if (n == "model.decoder.project_in.weight") {
      w.project_in = std::move(t);
    } else if (n == "model.decoder.project_out.weight") {
      w.project_out = std::move(t);
    } else if (n == "model.norm.weight" || n == "model.decoder.final_layer_norm.weight") {
      w.final_norm_w = std::move(t);
    } else if (n == "model.decoder.final_layer_norm.bias") {
      w.final_norm_b = std::move(t);
    } else if (n == "lm_head.weight") {
      w.lm_head = std::move(t);
    } else {
      FD_CHECK(false, "no field for tensor " << n);
    }
  }
  return w;
}

}  // namespace fd
