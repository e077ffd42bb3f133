#include "fastdecode/model/model_config.h"

#include <filesystem>

namespace fd {

std::string arch_name(Arch a) { return a == Arch::Llama ? "llama" : "opt"; }

// Keys found in real HF config.json files that describe training, tokenisation or bookkeeping and
// leave inference arithmetic unchanged.
static const std::set<std::string> kHfIgnoredKeys = {
    "_name_or_path", "architectures", "transformers_version", "torch_dtype", "dtype", "use_cache",
    "initializer_range", "init_std", "pretraining_tp", "pad_token_id", "attention_dropout", "dropout",
    "activation_dropout", "layerdrop", "prefix", "_remove_final_layer_norm", "bos_token_id",
    "eos_token_id", "model_type", "output_attentions", "output_hidden_states", "return_dict",
    "is_decoder", "id2label", "label2id", "tokenizer_class", "task_specific_params",
};

static int64_t first_token_id(const json& v) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<int64_t>();
  return -1;
}

ModelConfig model_config_from_json(const json& j, const std::string& source) {
  StrictObject o(j, source, "");
  ModelConfig c;
  c.hf = j;
  c.name = std::filesystem::path(source).stem().string();
  if (c.name == "config") c.name = std::filesystem::path(source).parent_path().filename().string();
  const std::string type = o.get_enum("model_type", {"llama", "opt"});
  c.arch = type == "llama" ? Arch::Llama : Arch::OPT;
  c.vocab_size = o.get_int("vocab_size", 2, int64_t(1) << 24);
  c.hidden_size = o.get_int("hidden_size", 2, 1 << 18);
  c.num_heads = o.get_int("num_attention_heads", 1, 4096);
  c.full_num_layers = c.num_layers = o.get_int("num_hidden_layers", 1, 4096);
  c.bos_token_id = first_token_id(o.get_raw("bos_token_id"));
  c.eos_token_id = first_token_id(o.get_raw("eos_token_id"));
  o.accept(kHfIgnoredKeys);
  if (c.hidden_size % c.num_heads != 0) o.fail("num_attention_heads", "must divide hidden_size");

  if (c.arch == Arch::Llama) {
    c.intermediate_size = o.get_int("intermediate_size", 1, 1 << 20);
    c.num_kv_heads = o.get_int("num_key_value_heads", 1, c.num_heads, c.num_heads);
    if (c.num_heads % c.num_kv_heads != 0)
      o.fail("num_key_value_heads", "must divide num_attention_heads");
    c.head_dim = o.get_int("head_dim", 1, 1024, c.hidden_size / c.num_heads);
    c.max_position_embeddings = o.get_int("max_position_embeddings", 1, 1 << 24, 2048);
    c.norm_eps = o.get_number("rms_norm_eps", 0.0, 1.0, 1e-6);
    c.rope_theta = o.get_number("rope_theta", 1.0, 1e12, 10000.0);
    c.tie_word_embeddings = o.get_bool("tie_word_embeddings", false);
    o.get_enum("hidden_act", {"silu"}, std::string("silu"));
    if (!o.get_raw("rope_scaling").is_null()) o.fail("rope_scaling", "RoPE scaling is not supported (must be null)");
    if (o.get_bool("attention_bias", false)) o.fail("attention_bias", "attention biases are not supported for Llama");
    if (o.get_bool("mlp_bias", false)) o.fail("mlp_bias", "MLP biases are not supported for Llama");
  } else {
    c.intermediate_size = o.get_int("ffn_dim", 1, 1 << 20);
    c.num_kv_heads = c.num_heads;
    c.head_dim = c.hidden_size / c.num_heads;
    c.max_position_embeddings = o.get_int("max_position_embeddings", 1, 1 << 24);
    c.norm_eps = 1e-5;  // OPT's LayerNorm eps is fixed in HF's implementation
    c.tie_word_embeddings = o.get_bool("tie_word_embeddings", true);
    o.get_enum("activation_function", {"relu"}, std::string("relu"));
    if (!o.get_bool("do_layer_norm_before", true))
      o.fail("do_layer_norm_before", "post-LayerNorm OPT (opt-350m) is not supported");
    if (!o.get_bool("enable_bias", true)) o.fail("enable_bias", "OPT without biases is not supported");
    if (!o.get_bool("layer_norm_elementwise_affine", true))
      o.fail("layer_norm_elementwise_affine", "LayerNorm without affine weights is not supported");
    if (o.get_int("word_embed_proj_dim", 1, 1 << 18, c.hidden_size) != c.hidden_size)
      o.fail("word_embed_proj_dim", "must equal hidden_size (projected embeddings are not supported)");
  }
  o.finish();
  return c;
}

ModelConfig load_model_config(const std::string& path) { return model_config_from_json(read_json_file(path), path); }

ModelConfig with_layers(ModelConfig cfg, int64_t layers) {
  if (layers < 1 || layers > cfg.full_num_layers)
    throw ConfigError("layers override " + std::to_string(layers) + " out of range [1, " +
                      std::to_string(cfg.full_num_layers) + "] for model " + cfg.name);
  cfg.num_layers = layers;
  return cfg;
}

json model_config_to_hf_json(const ModelConfig& cfg, const std::string& torch_dtype) {
  json j = cfg.hf;
  j["num_hidden_layers"] = cfg.num_layers;
  j["torch_dtype"] = torch_dtype;
  if (j.contains("dtype")) j["dtype"] = torch_dtype;
  if (!j.contains("architectures"))
    j["architectures"] = {cfg.arch == Arch::Llama ? "LlamaForCausalLM" : "OPTForCausalLM"};
  return j;
}

int64_t ModelConfig::num_params() const {
  const int64_t H = hidden_size, I = intermediate_size;
  int64_t per_layer = 0, rest = vocab_size * H * (tie_word_embeddings ? 1 : 2);
  if (arch == Arch::Llama) {
    per_layer = H * q_dim() * 2 + H * kv_dim() * 2 + 3 * H * I + 2 * H;
    rest += H;
  } else {
    per_layer = 4 * H * H + 4 * H + 2 * H * I + I + H + 4 * H;
    rest += (max_position_embeddings + 2) * H + 2 * H;
  }
  return per_layer * num_layers + rest;
}

int64_t ModelConfig::kv_bytes_per_token(int64_t bytes_per_elem, bool full_depth) const {
  return 2 * kv_dim() * bytes_per_elem * (full_depth ? full_num_layers : num_layers);
}

}  // namespace fd
