// The model's weight stages on a CUDA device (CUDA builds only; included by spart_cuda.cpp and the GPU-only
// engine). fp16 weights and activations (GEMM inputs and outputs), fp32 accumulation inside the GEMMs
// (cuBLAS GemmEx, compute 32F), an fp32 residual stream, fp32 logits. Fused GEMMs: one [q|k|v]
// projection and, for Llama, one [gate|up] projection; the elementwise work after each GEMM is one kernel
// (bias + RoPE + split; residual add + norm; activation).
// Everything runs on one stream; nothing is allocated per step once a batch size has been seen.
#pragma once
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

#include "fastdecode/core/error.h"
#include "fastdecode/model/sampler.h"
#include "fastdecode/model/weights.h"

#define CUDA_CHECK(stmt)                                                                                         \
  do {                                                                                                           \
    const cudaError_t e_ = (stmt);                                                                               \
    if (e_ != cudaSuccess) FD_THROW(__FILE__ << ":" << __LINE__ << ": " #stmt ": " << cudaGetErrorString(e_));   \
  } while (0)
#define CUBLAS_CHECK(stmt)                                                                                       \
  do {                                                                                                           \
    const cublasStatus_t e_ = (stmt);                                                                            \
    if (e_ != CUBLAS_STATUS_SUCCESS) FD_THROW(__FILE__ << ":" << __LINE__ << ": " #stmt ": cuBLAS status " << int(e_)); \
  } while (0)

namespace fd {

// A device buffer of T, grown (never shrunk) by resize; freed on destruction.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { resize(n); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  void resize(size_t n) {
    if (n <= n_) return;
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
    CUDA_CHECK(cudaMalloc(&p_, n * sizeof(T)));
    n_ = n;
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Activations of one batch of T rows on the device.
struct DevActs {
  int64_t T = 0;
  DeviceBuffer<float> x, q, k, v, att, sel, logits;
  DeviceBuffer<__half> h16, a16, i16, q16, k16, v16, qkv16, proj16, gu16;
  DeviceBuffer<int32_t> tokens, rows, starts, out_tokens;
  DeviceBuffer<int64_t> pos;
};

class CudaModel {
 public:
  // Uploads the weights (fp16) to the current device; all work goes to `stream`. sm_count_target > 0:
  // the stream runs on that many SMs (a green context); cuBLAS sizes its grids for them.
  CudaModel(const ModelWeights& w, cudaStream_t stream, int sm_count_target = 0);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  const ModelConfig& config() const { return cfg_; }
  cudaStream_t stream() const { return stream_; }
  size_t weight_bytes() const { return weight_bytes_; }

  // Sizes a's buffers for T rows (allocates only when T exceeds what a has seen) and sets a.T.
  void ensure(DevActs& a, int64_t T) const;
  // a.x = embeddings of a.tokens at a.pos (both already on the device).
  void embed(DevActs& a) const;
  // q, k, v = projections of norm(a.x) (+ bias, + RoPE at a.pos), contiguous, into a.q/a.k/a.v (fp32)
  // and/or a.q16/a.k16/a.v16 (fp16) as `outputs` says.
  enum Outputs : unsigned { kF32 = 1, kF16 = 2 };
  void attention_input(DevActs& a, int layer, unsigned outputs = kF32) const;
  // a.x += o-proj(a.a16) (+ bias); a.x += MLP(norm(a.x)).
  void attention_output_and_mlp(DevActs& a, int layer) const;
  // a.logits [n, V] = LM head of final-norm(a.x[a.rows[0..n)]).
  void logits(DevActs& a, int64_t n) const;
  // Next tokens for a.x[a.rows[0..n)]: greedy as an argmax on the device (n token ids come down);
  // otherwise the logits come down and fd::sample_token draws with (request_ids[i], steps[i]).
  void sample(DevActs& a, int64_t n, const SamplingParams& sp, const std::vector<uint64_t>& request_ids,
              const std::vector<uint64_t>& steps, int32_t* out) const;
  // Copies host → device through the pinned staging buffer (the source may change once this returns).
  void upload(void* dst, const void* src, size_t bytes) const;
  // The GEMMs of one layer alone ([q|k|v], o, [gate|up], down on a's buffers): the ceiling the S-Part
  // layer is benchmarked against (fd-spart-bench).
  void layer_gemms_only(DevActs& a, int layer) const;
  // y[T, out] = x[T, in] (fp16) · W[out, in]^T (fp16), fp32 accumulation; y fp16 or fp32 (y_type).
  void gemm(const __half* x, int64_t T, int64_t in, const __half* W, int64_t out, void* y,
            cudaDataType_t y_type = CUDA_R_16F) const;

 private:
  struct Layer {
    DeviceBuffer<__half> wqkv, wo, wgu, wdown;  // wgu: [gate|up] (Llama) or up (OPT)
    DeviceBuffer<float> attn_norm_w, attn_norm_b, mlp_norm_w, mlp_norm_b, bqkv, bo, b_up, b_down;
    bool has_bias = false;
  };
  // out = norm(x) after x += add (+ add_bias) when add is given.
  void norm(float* x, const __half* add, const float* add_bias, const float* w, const float* b, int64_t T,
            __half* out) const;

  ModelConfig cfg_;
  cudaStream_t stream_;
  cublasHandle_t blas_ = nullptr;
  DeviceBuffer<uint8_t> blas_workspace_;
  std::vector<Layer> layers_;
  DeviceBuffer<__half> embed_, pos_embed_, lm_head_;
  DeviceBuffer<float> final_norm_w_, final_norm_b_, inv_freq_;
  size_t weight_bytes_ = 0;
  mutable void* staging_ = nullptr;  // pinned
  mutable size_t staging_bytes_ = 0;
};

}  // namespace fd
