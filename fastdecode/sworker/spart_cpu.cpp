// The CPU S-Part backend: the reference model's stages with OpenBLAS GEMMs (fp32) where OpenBLAS was
// found at configure time, the reference GEMM otherwise.
#include "fastdecode/model/reference.h"
#include "fastdecode/sworker/spart.h"

#ifdef FD_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace fd {

#ifdef FD_HAVE_OPENBLAS
// y[T, out] = x[T, in] · W[out, in]^T (+ bias): one SGEMM, W read once for the whole batch.
static void blas_linear(const float* x, int64_t T, int64_t in, const float* W, const float* bias, int64_t out, float* y) {
  if (bias)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < out; ++o) y[t * out + o] = bias[o];
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(T), int(out), int(in), 1.0f, x, int(in), W, int(in),
              bias ? 1.0f : 0.0f, y, int(out));
}
constexpr LinearFn kLinear = blas_linear;
constexpr const char* kGemm = "OpenBLAS sgemm";
#else
constexpr LinearFn kLinear = ref_linear;
constexpr const char* kGemm = "reference loops (OpenBLAS not found at configure time)";
#endif

namespace {

class CpuSPart : public SPart {
 public:
  explicit CpuSPart(ModelWeights w) : w_(std::move(w)) {}
  const ModelConfig& config() const override { return w_.cfg; }
  std::string describe() const override { return std::string("cpu fp32, GEMM: ") + kGemm; }
  void embed(const int32_t* tokens, const int64_t* pos, int64_t T, float* x) override { ref_embed(w_, tokens, pos, T, x); }
  void attention_input(int layer, const float* x, const int64_t* pos, int64_t T, float* q, float* k, float* v) override {
    ref_attention_input(w_.cfg, w_.layers[size_t(layer)], x, pos, T, q, k, v, kLinear);
  }
  void attention_output_and_mlp(int layer, const float* att, int64_t T, float* x) override {
    ref_attention_output_and_mlp(w_.cfg, w_.layers[size_t(layer)], att, T, x, kLinear);
  }
  void lm_head(const float* x, int64_t n, float* logits) override { ref_lm_head(w_, x, n, logits, kLinear); }

 private:
  ModelWeights w_;
};

}  // namespace

std::unique_ptr<SPart> make_cpu_spart(ModelWeights weights) { return std::make_unique<CpuSPart>(std::move(weights)); }

}  // namespace fd
