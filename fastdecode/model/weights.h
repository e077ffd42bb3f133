// The tensors of a model (HF names and shapes), seeded random initialisation, and loading into fp32.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fastdecode/core/dtype.h"
#include "fastdecode/core/splitmix64.h"
#include "fastdecode/model/model_config.h"

namespace fd {

// How a tensor is initialised by the random generator: uniform with the given mean and standard
// deviation (bound = sqrt(3)*stddev). See docs/WEIGHTS.md for the choice of scales.
struct TensorSpec {
  std::string name;              // HF name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;    // HF layout: Linear weights are [out_features, in_features]
  float mean = 0.0f;
  float stddev = 0.0f;
  int64_t numel() const;
};

// Every tensor of LlamaForCausalLM / OPTForCausalLM for the first cfg.num_layers layers, in HF order.
std::vector<TensorSpec> model_tensor_specs(const ModelConfig& cfg);

// Fills `out` (numel elements of `dtype`) with tensor `spec`'s values for `seed`. Each element is a
// pure function of (seed, spec.name, index), so the bytes are the same on every machine, in any
// order, and a reduced-layer model's tensors equal the full model's.
void random_tensor_bytes(const TensorSpec& spec, uint64_t seed, DType dtype, void* out);

// Writes dir/config.json and the checkpoint in the HF Hub layout (fastdecode/model/checkpoint.cpp):
// max_shard_bytes == 0: one dir/model.safetensors; > 0: shards model-00001-of-0000N.safetensors of at
// most max_shard_bytes each (a tensor bigger than that gets a shard of its own) plus
// model.safetensors.index.json, or one model.safetensors when everything fits in one shard. Stale
// model*.safetensors / index files in dir are removed first. `progress(done_bytes, total_bytes)` may
// be null.
void write_random_weights(const ModelConfig& cfg, uint64_t seed, DType dtype, const std::string& dir,
                          const std::function<void(int64_t, int64_t)>& progress = nullptr,
                          int64_t max_shard_bytes = 0);

// Where fp32 weights come from: a checkpoint on disk, or the seeded generator (same values as the
// files fd-weights would write with that seed and dtype, without touching the disk).
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // Returns the tensor as fp32, shape checked against spec.shape; errors name the file and tensor.
  virtual std::vector<float> read(const TensorSpec& spec) = 0;
  virtual std::string describe() const = 0;
  // Validates the whole tensor set before anything is read: every `needed` tensor present with its
  // shape and nothing else but `skipped` (tensors of the model this run does not load) and ignorable
  // buffers. fd::ConfigError naming the file and tensor. The random source generates exactly what is
  // asked for: nothing to check.
  virtual void check(const std::vector<TensorSpec>& needed, const std::vector<TensorSpec>& skipped) const {
    (void)needed;
    (void)skipped;
  }
};
// `path`: a checkpoint folder (model.safetensors, or model.safetensors.index.json + shards), a
// .safetensors file or an index .json (see Checkpoint::open in checkpoint.h).
std::unique_ptr<TensorSource> open_safetensors_source(const std::string& path);
std::unique_ptr<TensorSource> make_random_source(uint64_t seed, DType dtype);
// src.check(model_tensor_specs(cfg), the full-depth model's tensors beyond a `layers` override): what
// load paths call before loading, so a bad checkpoint fails before any work.
void check_tensor_source(const ModelConfig& cfg, const TensorSource& src);

// fp32 weights of one decoder layer. Llama uses the *_w fields and gate/up/down; OPT also uses the
// biases and fc1/fc2 (stored in up/down). Matrices are [out, in] row-major as in HF.
struct LayerWeights {
  std::vector<float> attn_norm_w, attn_norm_b;  // [H] (bias: OPT only)
  std::vector<float> wq, wk, wv, wo;            // [q_dim,H] [kv_dim,H] [kv_dim,H] [H,q_dim]
  std::vector<float> bq, bk, bv, bo;            // OPT; Llama attention_bias (qwen2: no bo); empty if none
  std::vector<float> mlp_norm_w, mlp_norm_b;    // [H]
  std::vector<float> w_gate, b_gate;            // Llama: [I,H], [I] (b_gate: mlp_bias only)
  std::vector<float> w_up, b_up;                // Llama up_proj / OPT fc1: [I,H], [I]
  std::vector<float> w_down, b_down;            // Llama down_proj / OPT fc2: [H,I], [H]
};

// Which part of the model a ModelWeights holds (tensor/pipeline parallel, fastdecode/model/shard.h).
// The default is the whole model, as load_model_weights returns it; -1 ends mean "to the end".
struct WeightShard {
  int64_t tp_rank = 0, tp_size = 1;        // tensor rank t of T: heads and MLP columns [t/T, (t+1)/T)
  int64_t pp_rank = 0, pp_size = 1;        // pipeline stage p of P
  int64_t layer_begin = 0, layer_end = -1;  // global layers [begin, end); layers[i] is global layer begin + i
  int64_t vocab_begin = 0, vocab_end = -1;  // embedding / LM-head rows held, global ids [begin, end)
  int64_t vocab_padded = 0;                 // Vp = ceil(V/T): each rank's slot in the gathered logits (0: V)
  bool first_stage = true, last_stage = true;  // holds the embedding / the final norm and LM head
};

struct ModelWeights {
  ModelConfig cfg;
  WeightShard shard;  // default: the whole model
  std::vector<float> embed;                   // [V,H] (OPT: [V,P])
  std::vector<float> pos_embed;               // OPT: [max_pos+2, H]
  std::vector<float> project_in, project_out; // OPT word_embed_proj_dim P != H: [H,P], [P,H]; else empty
  std::vector<float> final_norm_w, final_norm_b;
  std::vector<float> lm_head;                 // [V,H] (OPT: [V,P]); empty when tied to embed
  std::vector<LayerWeights> layers;
  const std::vector<float>& lm_head_matrix() const { return lm_head.empty() ? embed : lm_head; }
};

ModelWeights load_model_weights(const ModelConfig& cfg, TensorSource& src);

// FNV-1a 64 of a string: the project's portable hash (splitmix64, its PRNG primitive, is in
// fastdecode/core/splitmix64.h, included above, so CUDA code can use it too).
uint64_t fnv1a64(std::string_view s);

}  // namespace fd
