// The GEMM table on the device (fastdecode/spart/gemm_table.h): every algorithm cuBLASLt's heuristic offers for a
// weight GEMM gives cuBLAS's default product (fp32 accumulation, each order of summation within the tolerance), a
// table's entry is what gemm() then runs (counted, and bit for bit the algorithm it names), and a table tuned on
// another device or cuBLASLt version is not used. Skips when no CUDA device answers (label gpu).
#include <gtest/gtest.h>

#ifdef FD_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "fastdecode/model/model_config.h"
#include "fastdecode/spart/cuda_model.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/gpu/require_gpu.h"
#include "tests/unit/test_helpers.h"

namespace {

using fd::DType;
using fd::test::Dev;

struct Case {
  int64_t out, in, rows;
  bool y_fp32;
  float beta;
};

class CudaGemmTable : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { FD_SKIP_WITHOUT_GPU(); }
};

TEST_P(CudaGemmTable, EveryAlgorithmIsTheDefaultsProductAndTheTableChoosesOne) {
  const DType t = GetParam();
  const fd::ModelConfig c = fd::with_layers(fd::load_model_config(fd::test::repo_path("experiments/models/tiny-llama.json")), 1);
  auto src = fd::make_random_source(3, t);
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  {
    fd::CudaModel m(fd::load_model_weights(c, *src), s, 0, t);
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::mt19937 rng(4);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    // A 16-bit-output projection, an fp32 one adding into y (the residual), an fp32 one without (the LM head).
    for (const Case& k : {Case{384, 128, 64, false, 0.0f}, Case{128, 352, 8, true, 1.0f}, Case{1000, 128, 17, true, 0.0f}}) {
      std::vector<float> wf(size_t(k.out * k.in)), xf(size_t(k.rows * k.in)), y0f(size_t(k.rows * k.out));
      for (float& v : wf) v = u(rng);
      for (float& v : xf) v = u(rng);
      for (float& v : y0f) v = u(rng);
      std::vector<uint16_t> w16(wf.size()), x16(xf.size()), y016(y0f.size());
      fd::convert_from_f32(t, wf.data(), w16.data(), wf.size());
      fd::convert_from_f32(t, xf.data(), x16.data(), xf.size());
      fd::convert_from_f32(t, y0f.data(), y016.data(), y0f.size());
      Dev<uint16_t> W(w16), X(x16);
      const size_t ybytes = y0f.size() * (k.y_fp32 ? 4 : 2);
      auto run = [&](int algo, bool through_table) {
        Dev<uint8_t> y(ybytes);
        CUDA_CHECK(cudaMemcpy(y.get(), k.y_fp32 ? static_cast<const void*>(y0f.data()) : y016.data(), ybytes,
                              cudaMemcpyHostToDevice));
        if (through_table) m.gemm(X.get(), k.rows, k.in, W.get(), k.out, y.get(), k.y_fp32, k.beta);
        else m.gemm_with(algo, X.get(), k.rows, k.in, W.get(), k.out, y.get(), k.y_fp32, k.beta);
        CUDA_CHECK(cudaStreamSynchronize(s));
        const std::vector<uint8_t> raw = y.download();
        std::vector<float> f(y0f.size());
        if (k.y_fp32) std::memcpy(f.data(), raw.data(), ybytes);
        else fd::convert_to_f32(t, raw.data(), f.data(), f.size());
        return std::make_pair(raw, f);
      };
      const auto [def_raw, def] = run(-1, false);
      double scale = 0;
      for (float v : def) scale = std::max(scale, double(std::fabs(v)));
      const fd::GemmProblem p{k.out, k.in, k.rows, t, k.y_fp32, k.beta != 0.0f};
      const int n = m.gemm_algos(p);
      EXPECT_GT(n, 0) << "no cuBLASLt algorithm for out " << k.out << " in " << k.in << " rows " << k.rows;
      // One rounding of the output type apart at most (the sums' order differs between algorithms).
      const double tol = (k.y_fp32 ? 1e-5 : t == DType::F16 ? 2e-3 : 1.6e-2) * std::max(scale, 1.0);
      for (int a = 0; a < n; ++a) {
        const std::vector<float> got = run(a, false).second;
        double err = 0;
        for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::fabs(double(got[i]) - double(def[i])));
        EXPECT_LE(err, tol) << "algorithm " << a << " of " << n << ", out " << k.out << " rows " << k.rows;
      }
      // The table's entry is what gemm() runs: the last algorithm offered, bit for bit, counted.
      auto table = std::make_shared<fd::GemmTable>();
      table->device = prop.name;
      table->cublaslt_version = int64_t(cublasLtGetVersion());
      table->set(p, n - 1);
      m.use_gemm_table(table);
      ASSERT_TRUE(m.gemm_table_info()["used"].get<bool>()) << m.gemm_table_info().dump();
      const int64_t before = m.lt_gemms();
      EXPECT_EQ(run(-1, true).first, run(n - 1, false).first);
      EXPECT_EQ(m.lt_gemms(), before + 2);  // gemm() through the table, then gemm_with
      // Another problem (one row fewer) is not in the table: cuBLAS's default, not counted.
      const int64_t c0 = m.lt_gemms();
      {
        Dev<uint8_t> y(ybytes);
        m.gemm(X.get(), k.rows - 1, k.in, W.get(), k.out, y.get(), k.y_fp32, 0.0f);
        CUDA_CHECK(cudaStreamSynchronize(s));
      }
      EXPECT_EQ(m.lt_gemms(), c0);
      m.use_gemm_table(nullptr);
    }
    // A table from another device or cuBLASLt version is not used, and the info says why.
    auto other = std::make_shared<fd::GemmTable>();
    other->device = "Some Other GPU";
    other->cublaslt_version = int64_t(cublasLtGetVersion());
    other->source = "other.json";
    m.use_gemm_table(other);
    EXPECT_FALSE(m.gemm_table_info()["used"].get<bool>());
    EXPECT_NE(m.gemm_table_info()["note"].get<std::string>().find("tuned on Some Other GPU"), std::string::npos);
    EXPECT_NE(m.gemm_table_describe().find("other.json"), std::string::npos);
    other = std::make_shared<fd::GemmTable>(*other);
    other->device = prop.name;
    other->cublaslt_version = 1;
    m.use_gemm_table(other);
    EXPECT_FALSE(m.gemm_table_info()["used"].get<bool>());
    EXPECT_NE(m.gemm_table_info()["note"].get<std::string>().find("cuBLASLt 1,"), std::string::npos);
  }
  CUDA_CHECK(cudaStreamDestroy(s));
}

INSTANTIATE_TEST_SUITE_P(Types, CudaGemmTable, ::testing::Values(DType::F16, DType::BF16),
                         [](const auto& info) { return info.param == DType::F16 ? "fp16" : "bf16"; });

}  // namespace

#endif  // FD_HAVE_CUDA
