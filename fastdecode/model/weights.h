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

// Writes dir/config.json and dir/model.safetensors. `progress(done_bytes, total_bytes)` may be null.
void write_random_weights(const ModelConfig& cfg, uint64_t seed, DType dtype, const std::string& dir,
                          const std::function<void(int64_t, int64_t)>& progress = nullptr);

// Where fp32 weights come from: a safetensors file, or the seeded generator (same values as the file
// fd-weights would write with that seed and dtype, without touching the disk).
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // Returns the tensor as fp32, shape checked against spec.shape; errors name the file and tensor.
  virtual std::vector<float> read(const TensorSpec& spec) = 0;
  virtual std::string describe() const = 0;
};
std::unique_ptr<TensorSource> open_safetensors_source(const std::string& path);
std::unique_ptr<TensorSource> make_random_source(uint64_t seed, DType dtype);

// fp32 weights of one decoder layer. Llama uses the *_w fields and gate/up/down; OPT also uses the
// biases and fc1/fc2 (stored in up/down). Matrices are [out, in] row-major as in HF.
struct LayerWeights {
  std::vector<float> attn_norm_w, attn_norm_b;  // [H] (bias: OPT only)
  std::vector<float> wq, wk, wv, wo;            // [q_dim,H] [kv_dim,H] [kv_dim,H] [H,q_dim]
  std::vector<float> bq, bk, bv, bo;            // OPT only
  std::vector<float> mlp_norm_w, mlp_norm_b;    // [H]
  std::vector<float> w_gate;                    // Llama: [I,H]
  std::vector<float> w_up, b_up;                // Llama up_proj / OPT fc1: [I,H], [I]
  std::vector<float> w_down, b_down;            // Llama down_proj / OPT fc2: [H,I], [H]
};

struct ModelWeights {
  ModelConfig cfg;
  std::vector<float> embed;                   // [V,H]
  std::vector<float> pos_embed;               // OPT: [max_pos+2, H]
  std::vector<float> final_norm_w, final_norm_b;
  std::vector<float> lm_head;                 // [V,H]; empty when tied to embed
  std::vector<LayerWeights> layers;
  const std::vector<float>& lm_head_matrix() const { return lm_head.empty() ? embed : lm_head; }
};

ModelWeights load_model_weights(const ModelConfig& cfg, TensorSource& src);

// FNV-1a 64 of a string: the project's portable hash (splitmix64, its PRNG primitive, is in
// fastdecode/core/splitmix64.h, included above, so CUDA code can use it too).
uint64_t fnv1a64(std::string_view s);

}  // namespace fd
