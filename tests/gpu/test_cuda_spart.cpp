// CUDA S-Part vs the fp32 CPU S-Part (the reference stages) on the same weights: every stage's output
// within an fp16 tolerance, and FastDecode with the CUDA S-Part vs the reference engine: greedy tokens
// compared in tests/gpu/test_gpu_only.cpp. Skips when no CUDA device answers (label gpu).
#include <cmath>
#include <cstdio>
#include <map>

#include "baselines/reference/reference_engine.h"
#include "fastdecode/spart/spart.h"
#include "kernels/cuda/device_info.h"
#include "tests/gpu/require_gpu.h"
#include "tests/unit/test_helpers.h"

using namespace fd;
using fd::test::repo_path;

namespace {

// |c - r| <= kTol * (max|r| over the tensor): fp16 GEMM inputs (11-bit mantissa, 2^-11 ~ 4.9e-4 relative
// per element); with fp32 accumulation the errors average out to ~2e-4 of the tensor's scale.
constexpr double kTol = 2e-3;  // measured on the H200: at most 2.7e-4 (artifacts/sworker)
// bf16 activations (8-bit mantissa, 2^-8 ~ 3.9e-3 relative per element): 8x the fp16 bound.
constexpr double kTolBf16 = 1.6e-2;

double rel_err(const std::vector<float>& c, const std::vector<float>& r) {
  double mx = 0, err = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    mx = std::max(mx, std::fabs(double(r[i])));
    err = std::max(err, std::fabs(double(c[i]) - double(r[i])));
  }
  return err / std::max(mx, 1e-30);
}

class CudaSPartVsCpu : public ::testing::TestWithParam<std::pair<const char*, int>> {
 protected:
  void SetUp() override {
    FD_SKIP_WITHOUT_GPU();
  }
};

// Every stage of the CUDA S-Part with `act` weights and activations vs the CPU S-Part on the same
// weights (drawn in `act`, so both hold the same values). The attention output goes in as `att_dt` host
// tensors (fp16: the wire; with bf16 activations it is cast on the device).
void check_stages(ModelConfig c, DType act, DType att_dt, double tol) {
  auto src = make_random_source(5, act);
  const ModelWeights w = load_model_weights(c, *src);
  auto cpu = make_cpu_spart(w), gpu = make_cuda_spart(w, {0, act, false});
  const int64_t T = 5, qd = c.q_dim(), kvd = c.kv_dim();
  std::vector<int32_t> tok = {3, 17, 42, 7, 99};
  std::vector<int64_t> pos = {0, 1, 2, 3, 4};
  cpu->embed(0, tok.data(), pos.data(), T);
  gpu->embed(0, tok.data(), pos.data(), T);
  std::vector<int32_t> all = {0, 1, 2, 3, 4};
  for (int l = 0; l < c.num_layers; ++l) {
    std::vector<float> q1(size_t(T * qd)), k1(size_t(T * kvd)), v1(k1.size()), q2(q1.size()), k2(k1.size()), v2(k1.size());
    cpu->attention_input(0, l, DType::F32, q1.data(), k1.data(), v1.data());
    gpu->attention_input(0, l, DType::F32, q2.data(), k2.data(), v2.data());
    EXPECT_LT(rel_err(q2, q1), tol) << "layer " << l << " q";
    EXPECT_LT(rel_err(k2, k1), tol) << "layer " << l << " k";
    EXPECT_LT(rel_err(v2, v1), tol) << "layer " << l << " v";
    // q as a stand-in attention output, fed to both (as att_dt, rounded the same way for both) and
    // checked through the residual stream.
    if (att_dt == DType::F16) {
      std::vector<uint16_t> q16(q1.size());
      convert_from_f32(DType::F16, q1.data(), q16.data(), q1.size());
      convert_to_f32(DType::F16, q16.data(), q1.data(), q1.size());
      cpu->set_attention(0, DType::F32, {{q1.data(), T}});
      gpu->set_attention(0, DType::F16, {{q16.data(), T}});
    } else {
      cpu->set_attention(0, DType::F32, {{q1.data(), T}});
      gpu->set_attention(0, DType::F32, {{q1.data(), T}});
    }
    cpu->attention_output_and_mlp(0, l);
    gpu->attention_output_and_mlp(0, l);
    std::vector<float> l1(size_t(T * c.vocab_size)), l2(l1.size());
    cpu->logits(0, all, l1.data());
    gpu->logits(0, all, l2.data());
    EXPECT_LT(rel_err(l2, l1), tol) << "layer " << l << " logits";
    std::printf("%s %s layer %d: rel err q %.2e k %.2e v %.2e logits %.2e\n", c.name.c_str(),
                std::string(dtype_name(act)).c_str(), l, rel_err(q2, q1), rel_err(k2, k1), rel_err(v2, v1),
                rel_err(l2, l1));
  }
  // Greedy sampling on the device = argmax of the host logits.
  std::vector<float> lg(size_t(T * c.vocab_size));
  gpu->logits(0, all, lg.data());
  std::vector<int32_t> got(static_cast<size_t>(T));
  gpu->sample(0, all, SamplingParams{}, {1, 2, 3, 4, 5}, {0, 0, 0, 0, 0}, got.data());
  for (int64_t t = 0; t < T; ++t) EXPECT_EQ(got[size_t(t)], argmax(&lg[size_t(t * c.vocab_size)], c.vocab_size)) << t;
  // Seeded sampling on the device (cuda::sample_rows) = fd::sample_token on the same logits, with each
  // row's own (request, step): the rows, ids and steps reach the kernel in order.
  SamplingParams tk;
  tk.temperature = 0.8, tk.top_k = 40, tk.top_p = 0.9, tk.seed = 3;
  SamplingParams full;
  full.temperature = 1.3, full.seed = 4;
  const std::vector<uint64_t> ids = {11, 12, 13, 14, 15}, steps = {0, 7, 3, 9, 1};
  for (const SamplingParams& sp : {tk, full}) {
    gpu->sample(0, all, sp, ids, steps, got.data());
    for (int64_t t = 0; t < T; ++t)
      EXPECT_EQ(got[size_t(t)], sample_token(&lg[size_t(t * c.vocab_size)], c.vocab_size, sp, ids[size_t(t)], steps[size_t(t)]))
          << "row " << t << " top_k " << sp.top_k;
  }
}

ModelConfig param_model(const std::pair<const char*, int>& p) {
  ModelConfig c = load_model_config(repo_path(std::string("experiments/models/") + p.first + ".json"));
  return p.second > 0 ? with_layers(c, p.second) : c;
}

}  // namespace

TEST_P(CudaSPartVsCpu, StagesWithinFp16Tolerance) { check_stages(param_model(GetParam()), DType::F16, DType::F32, kTol); }

TEST_P(CudaSPartVsCpu, Bf16StagesWithinBf16Tolerance) {
  check_stages(param_model(GetParam()), DType::BF16, DType::F16, kTolBf16);
}

// fp16 host tensors (the wire dtype of the engine on a GPU) = the fp32 ones rounded; prefill attention
// on the device vs the CPU S-Part's (reference attention over fp16-rounded K/V).
TEST_P(CudaSPartVsCpu, Fp16HostTensorsAndPrefillAttention) {
  ModelConfig c = load_model_config(repo_path(std::string("experiments/models/") + GetParam().first + ".json"));
  c = with_layers(c, 1);
  auto src = make_random_source(6, DType::F16);
  const ModelWeights w = load_model_weights(c, *src);
  auto cpu = make_cpu_spart(w), gpu = make_cuda_spart(w);
  const std::vector<int64_t> starts = {0, 1, 4, 41};  // prompts of 1, 3 and 37 tokens
  const int64_t T = starts.back(), qd = c.q_dim(), kvd = c.kv_dim();
  std::vector<int32_t> tok;
  std::vector<int64_t> pos;
  for (size_t i = 0; i + 1 < starts.size(); ++i)
    for (int64_t t = starts[i]; t < starts[i + 1]; ++t) tok.push_back(int32_t((t * 7 + 3) % c.vocab_size)), pos.push_back(t - starts[i]);
  cpu->embed(2, tok.data(), pos.data(), T);
  gpu->embed(2, tok.data(), pos.data(), T);
  std::vector<float> k1(size_t(T * kvd)), v1(k1.size()), k2(k1.size()), v2(k1.size());
  std::vector<uint16_t> k16(k1.size()), v16(k1.size());
  cpu->attention_input(2, 0, DType::F32, nullptr, k1.data(), v1.data());
  gpu->attention_input(2, 0, DType::F16, nullptr, k16.data(), v16.data());
  convert_to_f32(DType::F16, k16.data(), k2.data(), k2.size());
  convert_to_f32(DType::F16, v16.data(), v2.data(), v2.size());
  EXPECT_LT(rel_err(k2, k1), kTol);
  EXPECT_LT(rel_err(v2, v1), kTol);
  cpu->prefill_attention(2, starts);
  gpu->prefill_attention(2, starts);
  cpu->attention_output_and_mlp(2, 0);
  gpu->attention_output_and_mlp(2, 0);
  std::vector<int32_t> last = {0, 3, 40};
  std::vector<float> l1(last.size() * size_t(c.vocab_size)), l2(l1.size());
  cpu->logits(2, last, l1.data());
  gpu->logits(2, last, l2.data());
  EXPECT_LT(rel_err(l2, l1), kTol);
  std::printf("%s prefill: rel err k %.2e v %.2e logits %.2e (q_dim %lld)\n", c.name.c_str(), rel_err(k2, k1),
              rel_err(v2, v1), rel_err(l2, l1), (long long)qd);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaSPartVsCpu,
                         ::testing::Values(std::make_pair("tiny-llama", 0), std::make_pair("tiny-opt", 0),
                                           std::make_pair("tiny-llama-gqa", 0), std::make_pair("llama-2-7b", 1),
                                           std::make_pair("llama-3-8b", 1)));
