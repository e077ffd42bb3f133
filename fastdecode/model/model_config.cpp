#include "fastdecode/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

namespace fd {

std::string arch_name(Arch a) { return a == Arch::Llama ? "llama" : "opt"; }

std::string rope_type_name(RopeType t) {
  switch (t) {
    case RopeType::Default: return "default";
    case RopeType::Linear: return "linear";
    case RopeType::Dynamic: return "dynamic";
    case RopeType::Llama3: return "llama3";
    case RopeType::Yarn: return "yarn";
  }
  return "?";
}

// Keys found in real HF config.json files that describe training, tokenisation or bookkeeping and
// leave inference arithmetic unchanged.
static const std::set<std::string> kHfIgnoredKeys = {
    "_name_or_path", "architectures", "transformers_version", "torch_dtype", "dtype", "use_cache",
    "initializer_range", "init_std", "pretraining_tp", "pad_token_id", "attention_dropout", "dropout",
    "activation_dropout", "layerdrop", "prefix", "bos_token_id", "eos_token_id", "model_type",
    "output_attentions", "output_hidden_states", "return_dict", "is_decoder", "id2label", "label2id",
    "tokenizer_class", "task_specific_params", "use_bfloat16", "torchscript", "pruned_heads",
    "chunk_size_feed_forward", "finetuning_task", "problem_type", "max_sequence_length",
    "keys_to_ignore_at_inference", "unk_token_id", "sep_token_id", "decoder_start_token_id",
};

static int64_t first_token_id(const json& v) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<int64_t>();
  return -1;
}

// transformers' rope types this project implements; any other is refused by name.
static const char* kRopeImplemented = "default, linear, dynamic, llama3, yarn";

// Reads one RoPE parameter object: 4.x `rope_scaling` (type under `type` or `rope_type`) or 5.x
// `rope_parameters` (also holds rope_theta). `max_pos` is max_position_embeddings.
static void parse_rope_object(StrictObject r, RopeConfig& rope, int64_t max_pos, bool v5, double theta_4x,
                              bool has_theta_4x) {
  std::string type;
  if (r.has("rope_type")) type = r.get_string("rope_type");
  if (r.has("type")) {
    const std::string t2 = r.get_string("type");
    if (!type.empty() && t2 != type) r.fail("type", "'" + t2 + "' disagrees with rope_type '" + type + "'");
    type = t2;
  }
  r.accept({"rope_type", "type"});
  if (type.empty()) {
    if (v5) type = "default";
    else r.fail("type", "rope_scaling needs a `type` or `rope_type`");
  }
  if (v5 || r.has("rope_theta")) {
    const double t = r.get_number("rope_theta", 1.0, 1e12, has_theta_4x ? theta_4x : 10000.0);
    if (has_theta_4x && t != theta_4x) r.fail("rope_theta", "disagrees with the top-level rope_theta");
    rope.theta = t;
  }
  r.accept({"finetuned"});  // written by some yarn checkpoints; transformers ignores it
  const auto need_factor = [&](double lo) { rope.factor = r.get_number("factor", lo, 1e6); };
  if (type == "default") {
    rope.type = RopeType::Default;
  } else if (type == "linear") {
    rope.type = RopeType::Linear;
    need_factor(1e-6);
  } else if (type == "dynamic") {
    rope.type = RopeType::Dynamic;
    need_factor(1.0);
    rope.original_max_position_embeddings = r.get_int("original_max_position_embeddings", 1, max_pos, max_pos);
  } else if (type == "llama3") {
    rope.type = RopeType::Llama3;
    need_factor(1.0);
    rope.low_freq_factor = r.get_number("low_freq_factor", 1e-6, 1e6);
    rope.high_freq_factor = r.get_number("high_freq_factor", 1e-6, 1e6);
    if (!(rope.high_freq_factor > rope.low_freq_factor))
      r.fail("high_freq_factor", "must exceed low_freq_factor");
    rope.original_max_position_embeddings = r.get_int("original_max_position_embeddings", 1, 1 << 24);
  } else if (type == "yarn") {
    rope.type = RopeType::Yarn;
    need_factor(1e-6);
    const bool has_orig = r.has("original_max_position_embeddings");
    rope.original_max_position_embeddings = r.get_int("original_max_position_embeddings", 1, 1 << 24, max_pos);
    // transformers 4.46-4.5x replace `factor` by max_position_embeddings / original_max_position_embeddings
    // when the latter is given; 5.x use `factor`. Where the two differ the model is ambiguous: refuse.
    if (has_orig && std::fabs(double(max_pos) / double(rope.original_max_position_embeddings) - rope.factor) >
                        1e-9 * rope.factor)
      r.fail("factor", "yarn factor " + std::to_string(rope.factor) + " differs from max_position_embeddings / "
                       "original_max_position_embeddings = " + std::to_string(max_pos) + " / " +
                       std::to_string(rope.original_max_position_embeddings) +
                       " (transformers versions disagree on which one applies)");
    // As transformers: `get("beta_fast") or 32`, `get("beta_slow") or 1` (0 means the default).
    rope.beta_fast = r.get_number("beta_fast", 0.0, 1e6, 0.0);
    rope.beta_slow = r.get_number("beta_slow", 0.0, 1e6, 0.0);
    if (rope.beta_fast == 0) rope.beta_fast = 32.0;
    if (rope.beta_slow == 0) rope.beta_slow = 1.0;
    rope.truncate = r.get_bool("truncate", true);
    const auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
    const double mscale = r.get_number("mscale", 0.0, 1e6, 0.0);
    const double mscale_all_dim = r.get_number("mscale_all_dim", 0.0, 1e6, 0.0);
    if (r.has("attention_factor")) rope.attention_factor = r.get_number("attention_factor", 0.0, 1e6);
    else if (mscale != 0 && mscale_all_dim != 0)
      rope.attention_factor = get_mscale(rope.factor, mscale) / get_mscale(rope.factor, mscale_all_dim);
    else rope.attention_factor = get_mscale(rope.factor, 1.0);
  } else {
    r.fail(r.has("rope_type") ? "rope_type" : "type",
           "rope type '" + type + "' is not implemented (implemented: " + kRopeImplemented + ")");
  }
  r.finish();
}

static void parse_rope(StrictObject& o, ModelConfig& c) {
  RopeConfig& rope = c.rope;
  const bool has_theta = o.has("rope_theta");
  rope.theta = o.get_number("rope_theta", 1.0, 1e12, 10000.0);
  const json& scaling = o.get_raw("rope_scaling");
  const json& params = o.get_raw("rope_parameters");
  if (!scaling.is_null() && !params.is_null())
    o.fail("rope_parameters", "given together with rope_scaling (use one: 4.x rope_scaling or 5.x rope_parameters)");
  if (!params.is_null()) {
    if (params.is_object())
      for (const auto& [k, v] : params.items())
        if (v.is_object())
          o.fail("rope_parameters", "per-layer-type RoPE parameters ('" + k + "': {...}) are not implemented");
    parse_rope_object(o.get_object("rope_parameters"), rope, c.max_position_embeddings, true, rope.theta, has_theta);
  } else if (!scaling.is_null()) {
    parse_rope_object(o.get_object("rope_scaling"), rope, c.max_position_embeddings, false, rope.theta, has_theta);
  }
  if (rope.type == RopeType::Dynamic && rope.original_max_position_embeddings < c.position_limit()) {
    c.position_limit_ = rope.original_max_position_embeddings;
    c.position_limit_why = "dynamic (NTK) RoPE is run as default RoPE, exact up to original_max_position_embeddings";
  }
}

ModelConfig model_config_from_json(const json& j, const std::string& source) {
  StrictObject o(j, source, "");
  ModelConfig c;
  c.hf = j;
  c.name = std::filesystem::path(source).stem().string();
  if (c.name == "config") c.name = std::filesystem::path(source).parent_path().filename().string();
  const std::string type = o.get_enum("model_type", {"llama", "mistral", "qwen2", "opt"});
  c.arch = type == "opt" ? Arch::OPT : Arch::Llama;
  c.vocab_size = o.get_int("vocab_size", 2, int64_t(1) << 24);
  c.hidden_size = o.get_int("hidden_size", 2, 1 << 18);
  c.num_heads = o.get_int("num_attention_heads", 1, 4096);
  c.full_num_layers = c.num_layers = o.get_int("num_hidden_layers", 1, 4096);
  c.bos_token_id = first_token_id(o.get_raw("bos_token_id"));
  c.eos_token_id = first_token_id(o.get_raw("eos_token_id"));
  o.accept(kHfIgnoredKeys);

  if (c.arch == Arch::Llama) {
    c.intermediate_size = o.get_int("intermediate_size", 1, 1 << 20);
    c.num_kv_heads = o.get_int("num_key_value_heads", 1, c.num_heads, c.num_heads);
    if (c.num_heads % c.num_kv_heads != 0)
      o.fail("num_key_value_heads", "must divide num_attention_heads");
    if (!o.has("head_dim") && c.hidden_size % c.num_heads != 0)
      o.fail("num_attention_heads", "must divide hidden_size (or give head_dim)");
    c.head_dim = o.get_int("head_dim", 2, 1024, c.hidden_size / c.num_heads);
    if (c.head_dim % 2 != 0) o.fail("head_dim", "must be even (RoPE rotates pairs)");
    // defaults of LlamaConfig / MistralConfig / Qwen2Config
    const int64_t default_max_pos = type == "llama" ? 2048 : type == "mistral" ? 4096 * 32 : 32768;
    c.max_position_embeddings = o.get_int("max_position_embeddings", 1, 1 << 24, default_max_pos);
    c.norm_eps = o.get_number("rms_norm_eps", 0.0, 1.0, 1e-6);
    c.tie_word_embeddings = o.get_bool("tie_word_embeddings", false);
    o.get_enum("hidden_act", {"silu"}, std::string("silu"));
    parse_rope(o, c);
    if (type == "llama") {
      c.attention_bias = c.o_bias = o.get_bool("attention_bias", false);
      c.mlp_bias = o.get_bool("mlp_bias", false);
    } else if (type == "mistral") {
      // MistralAttention has no biases; sliding_window: null (full attention) or W: keys within W - 1
      // positions of the query are seen, so sequences of at most W positions are exact.
      const int64_t w = o.get_int("sliding_window", 1, 1 << 24, 0);
      if (w > 0 && w < c.position_limit()) {
        c.position_limit_ = w;
        c.position_limit_why = "mistral sliding_window " + std::to_string(w) +
                               " is not implemented; attention is exact up to the window";
      }
    } else {  // qwen2: q/k/v biases, none on o_proj or the MLP
      c.attention_bias = true;
      if (o.get_bool("use_sliding_window", false))
        o.fail("use_sliding_window", "sliding-window attention (qwen2) is not implemented");
      o.accept({"sliding_window", "max_window_layers"});  // only used with use_sliding_window
      if (o.get_bool("use_mrope", false)) o.fail("use_mrope", "multimodal RoPE is not implemented");
      const json& lt = o.get_raw("layer_types");
      if (!lt.is_null()) {
        if (!lt.is_array()) o.fail("layer_types", "expected an array");
        for (const auto& t : lt)
          if (t != "full_attention")
            o.fail("layer_types", "layer type " + t.dump() + " is not implemented (only \"full_attention\")");
      }
    }
  } else {
    if (c.hidden_size % c.num_heads != 0) o.fail("num_attention_heads", "must divide hidden_size");
    c.intermediate_size = o.get_int("ffn_dim", 1, 1 << 20);
    c.num_kv_heads = c.num_heads;
    c.head_dim = c.hidden_size / c.num_heads;
    c.max_position_embeddings = o.get_int("max_position_embeddings", 1, 1 << 24);
    c.norm_eps = 1e-5;  // OPT's LayerNorm eps is fixed in HF's implementation
    c.tie_word_embeddings = o.get_bool("tie_word_embeddings", true);
    o.get_enum("activation_function", {"relu"}, std::string("relu"));
    // do_layer_norm_before false (opt-350m): LayerNorm after each residual add and no final LayerNorm.
    c.do_layer_norm_before = o.get_bool("do_layer_norm_before", true);
    if (o.get_bool("_remove_final_layer_norm", false))
      o.fail("_remove_final_layer_norm", "OPT without the final LayerNorm (pre-4.20 fine-tunes) is not supported");
    if (!o.get_bool("enable_bias", true)) o.fail("enable_bias", "OPT without biases is not supported");
    if (!o.get_bool("layer_norm_elementwise_affine", true))
      o.fail("layer_norm_elementwise_affine", "LayerNorm without affine weights is not supported");
    c.word_embed_proj_dim = o.get_int("word_embed_proj_dim", 1, 1 << 18, c.hidden_size);
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
    if (attention_bias) per_layer += q_dim() + 2 * kv_dim();
    if (o_bias) per_layer += H;
    if (mlp_bias) per_layer += 2 * I + H;
    rest += H;
  } else {
    per_layer = 4 * H * H + 4 * H + 2 * H * I + I + H + 4 * H;
    const int64_t P = embed_dim();
    rest = vocab_size * P * (tie_word_embeddings ? 1 : 2) + (max_position_embeddings + 2) * H;
    if (has_final_norm()) rest += 2 * H;
    if (has_projections()) rest += 2 * H * P;
  }
  return per_layer * num_layers + rest;
}

int64_t ModelConfig::kv_bytes_per_token(int64_t bytes_per_elem, bool full_depth) const {
  return 2 * kv_dim() * bytes_per_elem * (full_depth ? full_num_layers : num_layers);
}

static constexpr double kPi = 3.14159265358979323846;

// ---- RoPE (transformers' modeling_rope_utils.py, formula by formula) ----

std::vector<float> rope_inv_freq(const ModelConfig& cfg) {
  const RopeConfig& r = cfg.rope;
  const int64_t dim = cfg.head_dim, half = dim / 2;
  std::vector<double> base(static_cast<size_t>(half));  // default: theta^(-2i/dim)
  for (int64_t i = 0; i < half; ++i) base[size_t(i)] = 1.0 / std::pow(r.theta, double(2 * i) / double(dim));
  std::vector<float> out(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const double f = base[size_t(i)];
    double v = f;
    switch (r.type) {
      case RopeType::Default:
      case RopeType::Dynamic:  // default RoPE up to original_max_position_embeddings (position_limit)
        break;
      case RopeType::Linear:
        v = f / r.factor;
        break;
      case RopeType::Llama3: {
        const double old_len = double(r.original_max_position_embeddings);
        const double low_wavelen = old_len / r.low_freq_factor, high_wavelen = old_len / r.high_freq_factor;
        const double wavelen = 2 * kPi / f;
        if (wavelen > low_wavelen) {
          v = f / r.factor;
        } else if (wavelen < high_wavelen) {
          v = f;
        } else {
          const double smooth = (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
          v = (1 - smooth) * f / r.factor + smooth * f;
        }
        break;
      }
      case RopeType::Yarn: {
        const double orig = double(r.original_max_position_embeddings);
        const auto correction_dim = [&](double rot) {
          return (double(dim) * std::log(orig / (rot * 2 * kPi))) / (2 * std::log(r.theta));
        };
        double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
        if (r.truncate) low = std::floor(low), high = std::ceil(high);
        low = std::max(low, 0.0), high = std::min(high, double(dim - 1));
        if (low == high) high += 0.001;
        const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
        const double extrapolation = 1 - ramp;  // weight of the unscaled frequency
        v = (f / r.factor) * (1 - extrapolation) + f * extrapolation;
        break;
      }
    }
    out[size_t(i)] = float(v);
  }
  return out;
}

float rope_attention_scaling(const ModelConfig& cfg) {
  return cfg.rope.type == RopeType::Yarn ? float(cfg.rope.attention_factor) : 1.0f;
}

}  // namespace fd
