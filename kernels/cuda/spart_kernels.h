// Elementwise and normalisation kernels of the CUDA S-Part. Each launcher takes its stream.
// Shapes: rows T, width n; activations fp32 unless the name says f16 (the GEMM inputs).
#pragma once
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace fd::cuda {

// out[t, :] = fp16(w * x[t, :] / rms(x[t, :]))            (Llama RMSNorm; statistics in fp32)
void rmsnorm_to_f16(const float* x, const float* w, float eps, int64_t T, int64_t n, __half* out, cudaStream_t s);
// out[t, :] = fp16((x - mean) / std * w + b)              (OPT LayerNorm, biased variance)
void layernorm_to_f16(const float* x, const float* w, const float* b, float eps, int64_t T, int64_t n, __half* out,
                      cudaStream_t s);
// y[t, i] += bias[i]
void add_bias(float* y, const float* bias, int64_t T, int64_t n, cudaStream_t s);
// x[t, i] += y[t, i] (+ bias[i] if bias)
void add_residual(float* x, const float* y, const float* bias, int64_t T, int64_t n, cudaStream_t s);
// HF rotate_half RoPE in place on [T, heads, D] at positions pos[T]; inv_freq[D/2] precomputed.
void rope(float* q, const int64_t* pos, const float* inv_freq, int64_t T, int64_t heads, int64_t D, cudaStream_t s);
// out = fp16(silu(gate) * up)  /  out = fp16(relu(up + bias))
void silu_mul_to_f16(const float* gate, const float* up, int64_t n, __half* out, cudaStream_t s);
void relu_bias_to_f16(const float* up, const float* bias, int64_t T, int64_t n, __half* out, cudaStream_t s);
void to_f16(const float* x, int64_t n, __half* out, cudaStream_t s);

}  // namespace fd::cuda
