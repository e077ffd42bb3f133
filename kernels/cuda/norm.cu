// RMSNorm / LayerNorm kernels (see norm.h).
#include "kernels/cuda/norm.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>

#include "kernels/cuda/act16.cuh"

namespace fd::cuda {

namespace {

using namespace detail;

// Row x (n % 4 == 0) in float4s: x += bias (stored back) when bias is given; returns the element.
__device__ __forceinline__ float4 row4(float4* xr, const float4* bias, int64_t i) {
  float4 v = xr[i];
  if (bias) xr[i] = v = v + bias[i];
  return v;
}

template <typename T>
__global__ void rmsnorm_kernel(float* x, const float* add_bias, const float* w, float eps, int64_t n, T* out) {
  float4* xr = reinterpret_cast<float4*>(x + blockIdx.x * n);
  const float4* b4 = reinterpret_cast<const float4*>(add_bias);
  const float4* w4 = reinterpret_cast<const float4*>(w);
  T* o = out + blockIdx.x * n;
  float ss = 0;
  for (int64_t i = threadIdx.x; i < n / 4; i += blockDim.x) {
    const float4 v = row4(xr, b4, i);
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  const float r = rsqrtf(block_sum(ss) / float(n) + eps);
  for (int64_t i = threadIdx.x; i < n / 4; i += blockDim.x) {
    const float4 v = xr[i], g = w4[i];
    store4(o + 4 * i, make_float4(g.x * (v.x * r), g.y * (v.y * r), g.z * (v.z * r), g.w * (v.w * r)));
  }
}

template <typename T>
__global__ void layernorm_kernel(float* x, const float* add_bias, const float* w, const float* b, float eps, int64_t n,
                                 T* out) {
  float4* xr = reinterpret_cast<float4*>(x + blockIdx.x * n);
  const float4* b4 = reinterpret_cast<const float4*>(add_bias);
  const float4* w4 = reinterpret_cast<const float4*>(w);
  const float4* bb4 = reinterpret_cast<const float4*>(b);
  T* o = out + blockIdx.x * n;
  float s = 0;
  for (int64_t i = threadIdx.x; i < n / 4; i += blockDim.x) {
    const float4 v = row4(xr, b4, i);
    s += v.x + v.y + v.z + v.w;
  }
  const float mean = block_sum(s) / float(n);
  float var = 0;
  for (int64_t i = threadIdx.x; i < n / 4; i += blockDim.x) {
    const float4 v = xr[i];
    var += (v.x - mean) * (v.x - mean) + (v.y - mean) * (v.y - mean) + (v.z - mean) * (v.z - mean) +
           (v.w - mean) * (v.w - mean);
  }
  const float r = rsqrtf(block_sum(var) / float(n) + eps);
  for (int64_t i = threadIdx.x; i < n / 4; i += blockDim.x) {
    const float4 v = xr[i], g = w4[i], c = bb4[i];
    store4(o + 4 * i, make_float4((v.x - mean) * r * g.x + c.x, (v.y - mean) * r * g.y + c.y,
                                  (v.z - mean) * r * g.z + c.z, (v.w - mean) * r * g.w + c.w));
  }
}

__global__ void add_bias_rows_kernel(float* x, const float* bias, int64_t total, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < total) x[i] += bias[i % n];
}

}  // namespace

void rmsnorm(float* x, const float* add_bias, const float* w, float eps, int64_t T, int64_t n, void* out, DType ot,
             cudaStream_t s) {
  check_width(n, 4, "rmsnorm");
  FD_ACT_DISPATCH(ot, "rmsnorm",
                  if (T > 0) rmsnorm_kernel<A16><<<unsigned(T), kThreads, 0, s>>>(x, add_bias, w, eps, n, static_cast<A16*>(out)));
  check_launch("rmsnorm");
}
void layernorm(float* x, const float* add_bias, const float* w, const float* b, float eps, int64_t T, int64_t n,
               void* out, DType ot, cudaStream_t s) {
  check_width(n, 4, "layernorm");
  FD_ACT_DISPATCH(ot, "layernorm",
                  if (T > 0) layernorm_kernel<A16><<<unsigned(T), kThreads, 0, s>>>(x, add_bias, w, b, eps, n,
                                                                                 static_cast<A16*>(out)));
  check_launch("layernorm");
}
void add_bias_rows(float* x, const float* bias, int64_t T, int64_t n, cudaStream_t s) {
  if (T * n > 0) add_bias_rows_kernel<<<blocks(T * n), kThreads, 0, s>>>(x, bias, T * n, n);
  check_launch("add_bias_rows");
}

}  // namespace fd::cuda
