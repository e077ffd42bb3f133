// SM-limited streams (CUDA green contexts, kernels/cuda/green_context.h): the granted SM count, the SMs
// kernels really run on (%smid), cudaMalloc'd memory and cuBLAS on a limited stream. Skips when no CUDA
// device answers (label gpu); without CUDA in the build only the "built without CUDA" error is checked.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "fastdecode/core/error.h"
#include "kernels/cuda/device_info.h"
#include "tests/gpu/require_gpu.h"
#include "kernels/cuda/green_context.h"

#ifdef FD_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"
#endif

using fd::cuda::SmLimitedStreams;

namespace {

class SmLimited : public ::testing::Test {
 protected:
  void SetUp() override {
    FD_SKIP_WITHOUT_GPU();
  }
};

std::string what_of(int sm_count) {
  try {
    SmLimitedStreams s(sm_count, 1);
  } catch (const fd::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// Without a device (or without CUDA) construction fails with a message that says why.
TEST(SmLimitedNoDevice, ThrowsClearly) {
  if (!fd::cuda_devices().empty()) GTEST_SKIP() << "a CUDA device answers";
  const std::string w = what_of(16);
  EXPECT_TRUE(w.find("no CUDA device answers") != std::string::npos || w.find("built without CUDA") != std::string::npos)
      << w;
}

TEST_F(SmLimited, UnlimitedReportsDeviceSmCount) {
  SmLimitedStreams s(0, 2);
  EXPECT_FALSE(s.limited());
  EXPECT_EQ(s.device_sm_count(), fd::cuda_devices()[0].sm_count);
  EXPECT_EQ(s.sm_count(), s.device_sm_count());
  EXPECT_EQ(s.n_streams(), 2);
  EXPECT_NE(s.stream(0), nullptr);
  EXPECT_NE(s.stream(0), s.stream(1));
  EXPECT_THROW(s.stream(2), fd::Error);
}

TEST_F(SmLimited, LimitedTo16GrantsAtMostOneGroupMore) {
  SmLimitedStreams s(16, 2);
  std::printf("[green context] device %d SMs; requested 16, granted %d; granularity %d, minimum group %d\n",
              s.device_sm_count(), s.sm_count(), s.granularity(), s.min_partition());
  EXPECT_TRUE(s.limited());
  EXPECT_EQ(s.requested_sm_count(), 16);
  EXPECT_GT(s.granularity(), 0);
  EXPECT_GE(s.sm_count(), 16);
  EXPECT_LE(s.sm_count(), 16 + s.granularity());
  EXPECT_LT(s.sm_count(), s.device_sm_count());
  EXPECT_NE(s.stream(0), s.stream(1));
}

TEST_F(SmLimited, RequestsThatCannotBeMetThrow) {
  const int n = fd::cuda_devices()[0].sm_count;
  const std::string w = what_of(n + 8);
  EXPECT_NE(w.find("SMs requested but device 0 has"), std::string::npos) << w;
  EXPECT_THROW(SmLimitedStreams(16, 0), fd::Error);
}

TEST_F(SmLimited, CreateAndDestroyRepeatedly) {
  for (int i = 0; i < 3; ++i) {
    SmLimitedStreams s(8 + 8 * i, 3);
    EXPECT_GE(s.sm_count(), 8 + 8 * i);
    EXPECT_GE(fd::cuda::count_sms_used(s.stream(i), 256), 1);
  }
}

// The point of the class: kernels on a limited stream run on at most the granted SMs; on an unlimited
// stream the same kernel spreads over more.
TEST_F(SmLimited, KernelsUseAtMostTheGrantedSms) {
  SmLimitedStreams lim(16, 2), all(0, 1);
  const int used_lim0 = fd::cuda::count_sms_used(lim.stream(0));
  const int used_lim1 = fd::cuda::count_sms_used(lim.stream(1));
  const int used_all = fd::cuda::count_sms_used(all.stream(0));
  std::printf("[green context] SMs used: limited (granted %d) %d and %d; unlimited (device %d) %d\n", lim.sm_count(),
              used_lim0, used_lim1, all.device_sm_count(), used_all);
  EXPECT_GE(used_lim0, 1);
  EXPECT_LE(used_lim0, lim.sm_count());
  EXPECT_LE(used_lim1, lim.sm_count());
  EXPECT_GT(used_all, lim.sm_count());
}

#ifdef FD_HAVE_CUDA

namespace {

#define BK(stmt) ASSERT_EQ((stmt), CUBLAS_STATUS_SUCCESS) << #stmt

}  // namespace

// Buffers from plain cudaMalloc (primary context), made before and after the green context, are read and
// written by work on the limited stream: copies, and a cuBLAS kernel (sscal).
TEST_F(SmLimited, CudaMallocMemoryWorksOnLimitedStream) {
  const int n = 1 << 16;
  float* before = nullptr;
  CUDA_CHECK(cudaMalloc(&before, n * sizeof(float)));
  {
    SmLimitedStreams lim(16, 1);
    cudaStream_t s = lim.stream(0);
    float* after = nullptr;
    CUDA_CHECK(cudaMalloc(&after, n * sizeof(float)));
    std::vector<float> h(n), back(n, 0.0f);
    for (int i = 0; i < n; ++i) h[size_t(i)] = float(i % 1000) - 500.0f;
    cublasHandle_t blas = nullptr;
    BK(cublasCreate(&blas));
    BK(cublasSetStream(blas, s));
    const float two = 2.0f;
    for (float* buf : {before, after}) {
      CUDA_CHECK(cudaMemcpyAsync(buf, h.data(), n * sizeof(float), cudaMemcpyHostToDevice, s));
      BK(cublasSscal(blas, n, &two, buf, 1));
      CUDA_CHECK(cudaMemcpyAsync(back.data(), buf, n * sizeof(float), cudaMemcpyDeviceToHost, s));
      CUDA_CHECK(cudaStreamSynchronize(s));
      int bad = 0;
      for (int i = 0; i < n; ++i) bad += back[size_t(i)] != 2.0f * h[size_t(i)];
      EXPECT_EQ(bad, 0) << (buf == before ? "buffer allocated before" : "buffer allocated after")
                        << " the green context";
    }
    BK(cublasDestroy(blas));
    CUDA_CHECK(cudaFree(after));
  }
  CUDA_CHECK(cudaFree(before));
  CUDA_CHECK(cudaGetLastError());
}

// cuBLAS sgemm on the limited stream, with the SM-count target set as the engine should, against a host
// product; small integers, so the fp32 result is exact.
TEST_F(SmLimited, CublasSgemmOnLimitedStream) {
  SmLimitedStreams lim(16, 1);
  cudaStream_t s = lim.stream(0);
  const int M = 96, N = 80, K = 64;  // column-major: C[M,N] = A[M,K] * B[K,N]
  std::vector<float> A(size_t(M * K)), B(size_t(K * N)), C(size_t(M * N)), ref(size_t(M * N), 0.0f);
  for (size_t i = 0; i < A.size(); ++i) A[i] = float(int(i * 7 % 11) - 5);
  for (size_t i = 0; i < B.size(); ++i) B[i] = float(int(i * 5 % 13) - 6);
  for (int j = 0; j < N; ++j)
    for (int k = 0; k < K; ++k)
      for (int i = 0; i < M; ++i) ref[size_t(j * M + i)] += A[size_t(k * M + i)] * B[size_t(j * K + k)];
  float *dA = nullptr, *dB = nullptr, *dC = nullptr;
  CUDA_CHECK(cudaMalloc(&dA, A.size() * 4));
  CUDA_CHECK(cudaMalloc(&dB, B.size() * 4));
  CUDA_CHECK(cudaMalloc(&dC, C.size() * 4));
  cublasHandle_t blas = nullptr;
  BK(cublasCreate(&blas));
  BK(cublasSetStream(blas, s));
  BK(cublasSetSmCountTarget(blas, lim.sm_count()));
  CUDA_CHECK(cudaMemcpyAsync(dA, A.data(), A.size() * 4, cudaMemcpyHostToDevice, s));
  CUDA_CHECK(cudaMemcpyAsync(dB, B.data(), B.size() * 4, cudaMemcpyHostToDevice, s));
  CUDA_CHECK(cudaMemsetAsync(dC, 0xff, C.size() * 4, s));  // NaNs: a GEMM that does not run shows
  const float one = 1.0f, zero = 0.0f;
  BK(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, M, N, K, &one, dA, M, dB, K, &zero, dC, M));
  CUDA_CHECK(cudaMemcpyAsync(C.data(), dC, C.size() * 4, cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  int bad = 0;
  for (size_t i = 0; i < C.size(); ++i) bad += C[i] != ref[i];
  EXPECT_EQ(bad, 0) << "C[0] = " << C[0] << ", expected " << ref[0];
  BK(cublasDestroy(blas));
  CUDA_CHECK(cudaFree(dA));
  CUDA_CHECK(cudaFree(dB));
  CUDA_CHECK(cudaFree(dC));
}

#endif  // FD_HAVE_CUDA
