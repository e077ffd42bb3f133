// CUDA S-Part kernels: static kernel -> launcher with an explicit stream (llama.cpp's layering).
#include "kernels/cuda/spart_kernels.h"

namespace fd::cuda {

namespace {

constexpr int kThreads = 256;

__device__ float block_sum(float v) {
  __shared__ float warp_sums[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? warp_sums[lane] : 0.0f;
  if (warp == 0)
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __shared__ float total;
  if (threadIdx.x == 0) total = v;
  __syncthreads();
  return total;
}

__global__ void rmsnorm_kernel(const float* x, const float* w, float eps, int64_t n, __half* out) {
  const float* xr = x + blockIdx.x * n;
  float ss = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  const float r = rsqrtf(block_sum(ss) / float(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[blockIdx.x * n + i] = __float2half(w[i] * (xr[i] * r));
}

__global__ void layernorm_kernel(const float* x, const float* w, const float* b, float eps, int64_t n, __half* out) {
  const float* xr = x + blockIdx.x * n;
  float s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
  const float mean = block_sum(s) / float(n);
  float v = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) v += (xr[i] - mean) * (xr[i] - mean);
  const float r = rsqrtf(block_sum(v) / float(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    out[blockIdx.x * n + i] = __float2half((xr[i] - mean) * r * w[i] + b[i]);
}

__global__ void add_bias_kernel(float* y, const float* bias, int64_t total, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < total) y[i] += bias[i % n];
}

__global__ void add_residual_kernel(float* x, const float* y, const float* bias, int64_t total, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < total) x[i] += y[i] + (bias ? bias[i % n] : 0.0f);
}

// One thread per (token, head, pair i): pairs (i, i + D/2).
__global__ void rope_kernel(float* q, const int64_t* pos, const float* inv_freq, int64_t heads, int64_t D, int64_t total) {
  const int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (idx >= total) return;
  const int64_t half = D / 2, i = idx % half, th = idx / half, t = th / heads;
  float* v = q + th * D;
  const float angle = float(pos[t]) * inv_freq[i];
  float c, s;
  sincosf(angle, &s, &c);
  const float a = v[i], b = v[i + half];
  v[i] = a * c - b * s;
  v[i + half] = b * c + a * s;
}

__global__ void silu_mul_kernel(const float* gate, const float* up, int64_t n, __half* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) {
    const float g = gate[i];
    out[i] = __float2half(up[i] * (g / (1.0f + __expf(-g))));
  }
}

__global__ void relu_bias_kernel(const float* up, const float* bias, int64_t total, int64_t n, __half* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < total) out[i] = __float2half(fmaxf(up[i] + bias[i % n], 0.0f));
}

__global__ void to_f16_kernel(const float* x, int64_t n, __half* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __float2half(x[i]);
}

unsigned blocks(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

}  // namespace

void rmsnorm_to_f16(const float* x, const float* w, float eps, int64_t T, int64_t n, __half* out, cudaStream_t s) {
  if (T > 0) rmsnorm_kernel<<<unsigned(T), kThreads, 0, s>>>(x, w, eps, n, out);
}
void layernorm_to_f16(const float* x, const float* w, const float* b, float eps, int64_t T, int64_t n, __half* out,
                      cudaStream_t s) {
  if (T > 0) layernorm_kernel<<<unsigned(T), kThreads, 0, s>>>(x, w, b, eps, n, out);
}
void add_bias(float* y, const float* bias, int64_t T, int64_t n, cudaStream_t s) {
  if (T * n > 0) add_bias_kernel<<<blocks(T * n), kThreads, 0, s>>>(y, bias, T * n, n);
}
void add_residual(float* x, const float* y, const float* bias, int64_t T, int64_t n, cudaStream_t s) {
  if (T * n > 0) add_residual_kernel<<<blocks(T * n), kThreads, 0, s>>>(x, y, bias, T * n, n);
}
void rope(float* q, const int64_t* pos, const float* inv_freq, int64_t T, int64_t heads, int64_t D, cudaStream_t s) {
  const int64_t total = T * heads * (D / 2);
  if (total > 0) rope_kernel<<<blocks(total), kThreads, 0, s>>>(q, pos, inv_freq, heads, D, total);
}
void silu_mul_to_f16(const float* gate, const float* up, int64_t n, __half* out, cudaStream_t s) {
  if (n > 0) silu_mul_kernel<<<blocks(n), kThreads, 0, s>>>(gate, up, n, out);
}
void relu_bias_to_f16(const float* up, const float* bias, int64_t T, int64_t n, __half* out, cudaStream_t s) {
  if (T * n > 0) relu_bias_kernel<<<blocks(T * n), kThreads, 0, s>>>(up, bias, T * n, n, out);
}
void to_f16(const float* x, int64_t n, __half* out, cudaStream_t s) {
  if (n > 0) to_f16_kernel<<<blocks(n), kThreads, 0, s>>>(x, n, out);
}

}  // namespace fd::cuda
