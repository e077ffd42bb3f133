// The S-Part: every stage of the model that touches weights, batched over all running sequences.
// Attention over the KV-cache is not here: the R-workers do it. Stages are named after the model.
#pragma once
#include <memory>
#include <string>

#include "fastdecode/model/weights.h"

namespace fd {

class SPart {
 public:
  virtual ~SPart() = default;
  virtual const ModelConfig& config() const = 0;
  virtual std::string describe() const = 0;  // backend and GEMM, for summary.json
  // x [T, H] = embeddings of tokens at positions pos.
  virtual void embed(const int32_t* tokens, const int64_t* pos, int64_t T, float* x) = 0;
  // q [T, q_dim], k, v [T, kv_dim] = projections of norm(x) (+ RoPE).
  virtual void attention_input(int layer, const float* x, const int64_t* pos, int64_t T, float* q, float* k, float* v) = 0;
  // x += o-projection of att [T, q_dim]; x += MLP(norm(x)).
  virtual void attention_output_and_mlp(int layer, const float* att, int64_t T, float* x) = 0;
  // logits [n, vocab] of final-norm(x).
  virtual void lm_head(const float* x, int64_t n, float* logits) = 0;
};

// fp32 on the CPU: the reference model's stages (fastdecode/model/reference.h). The embedded default
// when no GPU answers.
std::unique_ptr<SPart> make_cpu_spart(ModelWeights weights);
// fp16 weights on the first CUDA device, cuBLAS GEMMs with fp32 accumulation. Throws fd::Error when no
// device answers or the build has no CUDA.
std::unique_ptr<SPart> make_cuda_spart(ModelWeights weights);

}  // namespace fd
