// Model shapes read from a HuggingFace config.json (field names unchanged), for Llama and OPT.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "fastdecode/core/json_util.h"

namespace fd {

enum class Arch { Llama, OPT };

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
  double rope_theta = 10000.0;    // Llama only
  bool tie_word_embeddings = false;
  int64_t bos_token_id = -1, eos_token_id = -1;
  json hf;                        // the config.json as read, written back by fd-weights

  int64_t q_dim() const { return num_heads * head_dim; }
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

}  // namespace fd
