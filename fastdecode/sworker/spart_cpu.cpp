#include "fastdecode/model/reference.h"
#include "fastdecode/sworker/spart.h"

namespace fd {

namespace {

class CpuSPart : public SPart {
 public:
  explicit CpuSPart(ModelWeights w) : w_(std::move(w)) {}
  const ModelConfig& config() const override { return w_.cfg; }
  void embed(const int32_t* tokens, const int64_t* pos, int64_t T, float* x) override { ref_embed(w_, tokens, pos, T, x); }
  void attention_input(int layer, const float* x, const int64_t* pos, int64_t T, float* q, float* k, float* v) override {
    ref_attention_input(w_.cfg, w_.layers[size_t(layer)], x, pos, T, q, k, v);
  }
  void attention_output_and_mlp(int layer, const float* att, int64_t T, float* x) override {
    ref_attention_output_and_mlp(w_.cfg, w_.layers[size_t(layer)], att, T, x);
  }
  void lm_head(const float* x, int64_t n, float* logits) override { ref_lm_head(w_, x, n, logits); }

 private:
  ModelWeights w_;
};

}  // namespace

std::unique_ptr<SPart> make_cpu_spart(ModelWeights weights) { return std::make_unique<CpuSPart>(std::move(weights)); }

}  // namespace fd
