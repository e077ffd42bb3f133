// Model shapes read from a HuggingFace config.json (field names unchanged), for Llama (model_type llama,
// mistral, qwen2) and OPT. Keys that change the arithmetic are understood or refused by name; see
// docs/WEIGHTS.md for the full list.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "fastdecode/core/json_util.h"

namespace fd {

enum class Arch { Llama, OPT };

// RoPE as transformers computes it (modeling_rope_utils.py), from `rope_theta` + `rope_scaling` (4.x) or
// `rope_parameters` (5.x). The inverse frequencies come from rope_inv_freq, the cos/sin factor from
// rope_attention_scaling: every implementation (reference, CPU and CUDA S-Parts) uses those two.
enum class RopeType { Default, Linear, Dynamic, Llama3, Yarn };
struct RopeConfig {
  RopeType type = RopeType::Default;
  double theta = 10000.0;
  double factor = 1.0;                       // linear, dynamic, llama3, yarn
  double low_freq_factor = 1.0;              // llama3
  double high_freq_factor = 4.0;             // llama3
  int64_t original_max_position_embeddings = 0;  // llama3, yarn (yarn: defaults to max_position_embeddings)
  double beta_fast = 32.0, beta_slow = 1.0;  // yarn
  bool truncate = true;                      // yarn: floor/ceil the correction range
  double attention_factor = 1.0;             // yarn: the cos/sin scale (given, or from factor / mscale)
};
std::string rope_type_name(RopeType t);

struct ModelConfig {
  std::string name;             // file stem, e.g. "llama-2-7b"
  Arch arch = Arch::Llama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;        // H
  int64_t intermediate_size = 0;  // I: Llama MLP width, OPT ffn_dim
  int64_t num_layers = 0;         // layers actually run (after a `layers` override)
  int64_t full_num_layers = 0;    // depth of the real model (num_hidden_layers in the file)
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;       // == num_heads for MHA (and always for OPT)
  int64_t head_dim = 0;           // D
  int64_t max_position_embeddings = 0;
  double norm_eps = 1e-5;         // rms_norm_eps (Llama) / 1e-5 LayerNorm (OPT)
  RopeConfig rope;                // Llama only
  bool tie_word_embeddings = false;
  bool attention_bias = false;    // Llama: q/k/v/o biases (qwen2: q/k/v only, see o_bias)
  bool o_bias = false;            // Llama: o_proj has a bias
  bool mlp_bias = false;          // Llama: gate/up/down biases
  bool do_layer_norm_before = true;  // OPT: false = post-LayerNorm (opt-350m): LN after each residual add, no final LN
  int64_t word_embed_proj_dim = 0;   // OPT: P, the embedding width; != hidden_size: project_in [H,P], project_out [P,H]
  // Positions a sequence may use: max_position_embeddings, lowered by a sliding window (mistral: exact
  // up to the window) or dynamic NTK RoPE (default RoPE up to the original length). position_limit_why
  // names the key that lowered it (empty when it is max_position_embeddings).
  int64_t position_limit_ = 0;
  std::string position_limit_why;
  int64_t bos_token_id = -1, eos_token_id = -1;
  json hf;                        // the config.json as read, written back by fd-weights

  int64_t q_dim() const { return num_heads * head_dim; }
  // Width of the token embeddings and of the LM head's input (OPT's word_embed_proj_dim, else H).
  int64_t embed_dim() const { return word_embed_proj_dim > 0 ? word_embed_proj_dim : hidden_size; }
  bool has_projections() const { return embed_dim() != hidden_size; }
  // Norm before attention / MLP (Llama, pre-LN OPT); post-LN OPT normalizes after each residual add.
  bool pre_norm() const { return arch == Arch::Llama || do_layer_norm_before; }
  // Post-LN OPT has no final LayerNorm (HF: final_layer_norm only when do_layer_norm_before).
  bool has_final_norm() const { return pre_norm(); }
  int64_t position_limit() const { return position_limit_ > 0 ? position_limit_ : max_position_embeddings; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  // Number of weights (parameters) of the model as run.
  int64_t num_params() const;
  // KV-cache bytes per token for all layers of the *full-depth* model at `bytes_per_elem`.
  int64_t kv_bytes_per_token(int64_t bytes_per_elem, bool full_depth) const;
};

// Parses an HF config object. `source` names the file in error messages. Keys that HF writes but that
// do not change the arithmetic are accepted; an unknown key or a feature the reference does not
// implement (rope_scaling, attention biases on Llama, OPT's projected embeddings, ...) is an error.
ModelConfig model_config_from_json(const json& j, const std::string& source);
ModelConfig load_model_config(const std::string& path);
// Runs only the first `layers` layers (the paper's reduced-layer method); 1 <= layers <= full depth.
ModelConfig with_layers(ModelConfig cfg, int64_t layers);
// config.json for the model as run: num_hidden_layers = num_layers, torch_dtype = dtype name.
json model_config_to_hf_json(const ModelConfig& cfg, const std::string& torch_dtype);
std::string arch_name(Arch a);
// RoPE inverse frequencies [head_dim / 2] for cfg.rope (computed in double, rounded to fp32 once, as HF
// computes them in float32), and the factor HF multiplies cos and sin by (1 except for yarn).
std::vector<float> rope_inv_freq(const ModelConfig& cfg);
float rope_attention_scaling(const ModelConfig& cfg);

}  // namespace fd
