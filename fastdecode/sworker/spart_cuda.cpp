// The CUDA S-Part backend: fp16 weights and GEMM inputs on the GPU, fp32 accumulation (cuBLAS
// GemmEx, compute 32F) and fp32 activations, the norm / RoPE / activation kernels of
// kernels/cuda/spart_kernels.cu. This first version keeps the SPart interface's host tensors: every
// stage uploads its inputs and downloads its outputs on one stream (no residency of the residual
// stream, no CUDA graphs yet); it is the numerics and integration step of issue 4, not its speed.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <utility>
#include <vector>

#include "fastdecode/core/dtype.h"
#include "fastdecode/model/reference.h"
#include "fastdecode/sworker/spart.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/spart_kernels.h"

#define CUDA_CHECK(stmt)                                                                      \
  do {                                                                                        \
    const cudaError_t e_ = (stmt);                                                            \
    if (e_ != cudaSuccess) FD_THROW(__FILE__ << ":" << __LINE__ << ": " #stmt ": " << cudaGetErrorString(e_)); \
  } while (0)
#define CUBLAS_CHECK(stmt)                                                                     \
  do {                                                                                         \
    const cublasStatus_t e_ = (stmt);                                                          \
    if (e_ != CUBLAS_STATUS_SUCCESS) FD_THROW(__FILE__ << ":" << __LINE__ << ": " #stmt ": cuBLAS status " << int(e_)); \
  } while (0)

namespace fd {

namespace {

// A device buffer of T, freed on destruction.
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
  ~DeviceBuffer() { if (p_) cudaFree(p_); }
  void resize(size_t n) {
    if (n <= n_) return;
    if (p_) cudaFree(p_);
    p_ = nullptr;
    CUDA_CHECK(cudaMalloc(&p_, n * sizeof(T)));
    n_ = n;
  }
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

DeviceBuffer<__half> upload_f16(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  convert_from_f32(DType::F16, v.data(), h.data(), v.size());
  DeviceBuffer<__half> d(v.size());
  CUDA_CHECK(cudaMemcpy(d.get(), h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  return d;
}

DeviceBuffer<float> upload_f32(const std::vector<float>& v) {
  DeviceBuffer<float> d(std::max<size_t>(1, v.size()));
  if (!v.empty()) CUDA_CHECK(cudaMemcpy(d.get(), v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  return d;
}

struct LayerDev {
  DeviceBuffer<__half> wq, wk, wv, wo, w_gate, w_up, w_down;
  DeviceBuffer<float> attn_norm_w, attn_norm_b, mlp_norm_w, mlp_norm_b, bq, bk, bv, bo, b_up, b_down;
  bool has_bias = false;
};

class CudaSPart : public SPart {
 public:
  explicit CudaSPart(ModelWeights w) : host_(std::move(w)) {
    const auto devs = cuda_devices();
    if (devs.empty()) FD_THROW("CUDA S-Part: no CUDA device answers");
    CUDA_CHECK(cudaSetDevice(0));
    device_name_ = devs[0].name;
    CUDA_CHECK(cudaStreamCreate(&stream_));
    CUBLAS_CHECK(cublasCreate(&blas_));
    CUBLAS_CHECK(cublasSetStream(blas_, stream_));
    const ModelConfig& c = host_.cfg;
    for (const LayerWeights& L : host_.layers) {
      LayerDev d;
      d.wq = upload_f16(L.wq), d.wk = upload_f16(L.wk), d.wv = upload_f16(L.wv), d.wo = upload_f16(L.wo);
      d.w_up = upload_f16(L.w_up), d.w_down = upload_f16(L.w_down);
      if (!L.w_gate.empty()) d.w_gate = upload_f16(L.w_gate);
      d.attn_norm_w = upload_f32(L.attn_norm_w), d.mlp_norm_w = upload_f32(L.mlp_norm_w);
      d.has_bias = !L.bq.empty();
      if (d.has_bias) {
        d.attn_norm_b = upload_f32(L.attn_norm_b), d.mlp_norm_b = upload_f32(L.mlp_norm_b);
        d.bq = upload_f32(L.bq), d.bk = upload_f32(L.bk), d.bv = upload_f32(L.bv), d.bo = upload_f32(L.bo);
        d.b_up = upload_f32(L.b_up), d.b_down = upload_f32(L.b_down);
      }
      layers_.push_back(std::move(d));
    }
    lm_head_ = upload_f16(host_.lm_head_matrix());
    final_norm_w_ = upload_f32(host_.final_norm_w);
    if (!host_.final_norm_b.empty()) final_norm_b_ = upload_f32(host_.final_norm_b);
    std::vector<float> inv(size_t(c.head_dim / 2));
    for (size_t i = 0; i < inv.size(); ++i)  // as the reference: double, then fp32
      inv[i] = float(1.0 / std::pow(c.rope_theta, double(2 * i) / double(c.head_dim)));
    inv_freq_ = upload_f32(inv);
  }
  ~CudaSPart() override {
    if (blas_) cublasDestroy(blas_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  const ModelConfig& config() const override { return host_.cfg; }
  std::string describe() const override {
    return "cuda (" + device_name_ + "): fp16 weights and GEMM inputs, fp32 accumulation (cuBLAS GemmEx), fp32 activations; host staging per stage";
  }

  void embed(const int32_t* tokens, const int64_t* pos, int64_t T, float* x) override { ref_embed(host_, tokens, pos, T, x); }

  void attention_input(int layer, const float* x, const int64_t* pos, int64_t T, float* q, float* k, float* v) override {
    const ModelConfig& c = host_.cfg;
    const LayerDev& L = layers_[size_t(layer)];
    const int64_t H = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim();
    ensure(T);
    CUDA_CHECK(cudaMemcpyAsync(x_.get(), x, size_t(T * H) * 4, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(pos_.get(), pos, size_t(T) * 8, cudaMemcpyHostToDevice, stream_));
    norm(x_.get(), L.attn_norm_w.get(), L.has_bias ? L.attn_norm_b.get() : nullptr, T, h16_.get());
    gemm(h16_.get(), T, H, L.wq.get(), qd, q_.get());
    gemm(h16_.get(), T, H, L.wk.get(), kvd, k_.get());
    gemm(h16_.get(), T, H, L.wv.get(), kvd, v_.get());
    if (L.has_bias) {
      cuda::add_bias(q_.get(), L.bq.get(), T, qd, stream_);
      cuda::add_bias(k_.get(), L.bk.get(), T, kvd, stream_);
      cuda::add_bias(v_.get(), L.bv.get(), T, kvd, stream_);
    }
    if (c.arch == Arch::Llama) {
      cuda::rope(q_.get(), pos_.get(), inv_freq_.get(), T, c.num_heads, c.head_dim, stream_);
      cuda::rope(k_.get(), pos_.get(), inv_freq_.get(), T, c.num_kv_heads, c.head_dim, stream_);
    }
    CUDA_CHECK(cudaMemcpyAsync(q, q_.get(), size_t(T * qd) * 4, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaMemcpyAsync(k, k_.get(), size_t(T * kvd) * 4, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaMemcpyAsync(v, v_.get(), size_t(T * kvd) * 4, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void attention_output_and_mlp(int layer, const float* att, int64_t T, float* x) override {
    const ModelConfig& c = host_.cfg;
    const LayerDev& L = layers_[size_t(layer)];
    const int64_t H = c.hidden_size, I = c.intermediate_size, qd = c.q_dim();
    ensure(T);
    CUDA_CHECK(cudaMemcpyAsync(x_.get(), x, size_t(T * H) * 4, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaMemcpyAsync(q_.get(), att, size_t(T * qd) * 4, cudaMemcpyHostToDevice, stream_));
    cuda::to_f16(q_.get(), T * qd, a16_.get(), stream_);
    gemm(a16_.get(), T, qd, L.wo.get(), H, proj_.get());
    cuda::add_residual(x_.get(), proj_.get(), L.has_bias ? L.bo.get() : nullptr, T, H, stream_);
    norm(x_.get(), L.mlp_norm_w.get(), L.has_bias ? L.mlp_norm_b.get() : nullptr, T, h16_.get());
    gemm(h16_.get(), T, H, L.w_up.get(), I, up_.get());
    if (c.arch == Arch::Llama) {
      gemm(h16_.get(), T, H, L.w_gate.get(), I, gate_.get());
      cuda::silu_mul_to_f16(gate_.get(), up_.get(), T * I, i16_.get(), stream_);
    } else {
      cuda::relu_bias_to_f16(up_.get(), L.b_up.get(), T, I, i16_.get(), stream_);
    }
    gemm(i16_.get(), T, I, L.w_down.get(), H, proj_.get());
    cuda::add_residual(x_.get(), proj_.get(), L.has_bias ? L.b_down.get() : nullptr, T, H, stream_);
    CUDA_CHECK(cudaMemcpyAsync(x, x_.get(), size_t(T * H) * 4, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void lm_head(const float* x, int64_t n, float* logits) override {
    const ModelConfig& c = host_.cfg;
    ensure(n);
    logits_.resize(size_t(n * c.vocab_size));
    CUDA_CHECK(cudaMemcpyAsync(x_.get(), x, size_t(n * c.hidden_size) * 4, cudaMemcpyHostToDevice, stream_));
    norm(x_.get(), final_norm_w_.get(), host_.final_norm_b.empty() ? nullptr : final_norm_b_.get(), n, h16_.get());
    gemm(h16_.get(), n, c.hidden_size, lm_head_.get(), c.vocab_size, logits_.get());
    CUDA_CHECK(cudaMemcpyAsync(logits, logits_.get(), size_t(n * c.vocab_size) * 4, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  void ensure(int64_t T) {
    const ModelConfig& c = host_.cfg;
    const size_t t = size_t(T), H = size_t(c.hidden_size), I = size_t(c.intermediate_size);
    x_.resize(t * H), proj_.resize(t * H), h16_.resize(t * H);
    q_.resize(t * size_t(c.q_dim())), a16_.resize(t * size_t(c.q_dim()));
    k_.resize(t * size_t(c.kv_dim())), v_.resize(t * size_t(c.kv_dim()));
    up_.resize(t * I), gate_.resize(t * I), i16_.resize(t * I), pos_.resize(t);
  }
  void norm(const float* x, const float* w, const float* b, int64_t T, __half* out) {
    const ModelConfig& c = host_.cfg;
    if (c.arch == Arch::Llama) cuda::rmsnorm_to_f16(x, w, float(c.norm_eps), T, c.hidden_size, out, stream_);
    else cuda::layernorm_to_f16(x, w, b, float(c.norm_eps), T, c.hidden_size, out, stream_);
  }
  // y[T, out] (fp32) = x[T, in] (fp16) · W[out, in]^T (fp16), fp32 accumulation. Row-major as column-major:
  // Y^T (out x T) = W^T(col-major view of W is in x out, transposed) · X^T.
  void gemm(const __half* x, int64_t T, int64_t in, const __half* W, int64_t out, float* y) {
    const float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, int(out), int(T), int(in), &one, W, CUDA_R_16F, int(in), x,
                              CUDA_R_16F, int(in), &zero, y, CUDA_R_32F, int(out), CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
  }

  ModelWeights host_;  // fp32 host copy: embeddings (looked up on the host) and the shapes
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::vector<LayerDev> layers_;
  DeviceBuffer<__half> lm_head_;
  DeviceBuffer<float> final_norm_w_, final_norm_b_, inv_freq_;
  DeviceBuffer<float> x_, proj_, q_, k_, v_, up_, gate_, logits_;
  DeviceBuffer<__half> h16_, a16_, i16_;
  DeviceBuffer<int64_t> pos_;
};

}  // namespace

std::unique_ptr<SPart> make_cuda_spart(ModelWeights weights) { return std::make_unique<CudaSPart>(std::move(weights)); }

}  // namespace fd
