// MLP activation kernels (see activation.h).
#include "kernels/cuda/activation.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>

#include "kernels/cuda/act16.cuh"

namespace fd::cuda {

namespace {

using namespace detail;

__device__ __forceinline__ float silu_mul1(float g, float u) { return u * (g / (1.0f + __expf(-g))); }

// Eight elements per thread (n % 8 == 0): 16-byte loads of gate and up, a 16-byte store. Columns on
// grid x, rows on grid y (striding by gridDim.y past 65535 rows): no integer division per element.
// Tried, not kept (29b0340): items numbered over the whole output, two a thread a grid apart, so that no warp of a
// row's last block idles: 2.4-2.8 TB/s at B = 512-1024 on the H200 (artifacts/stages/gemm-inputs/call4-ec2f4d1/),
// against 2.7-3.2 for this kernel in the call before (call3-b2b5bf8/, two builds).
template <typename T>
__global__ void silu_mul8_kernel(const T* gu, const float* bias, int64_t T_rows, int64_t n, T* out) {
  const int64_t j = 8 * (blockIdx.x * int64_t(blockDim.x) + threadIdx.x);
  if (j >= n) return;
  const float4 z = make_float4(0, 0, 0, 0);
  const float4* b4 = reinterpret_cast<const float4*>(bias);
  const float4 bg0 = bias ? b4[j / 4] : z, bg1 = bias ? b4[j / 4 + 1] : z, bu0 = bias ? b4[(n + j) / 4] : z,
               bu1 = bias ? b4[(n + j) / 4 + 1] : z;
  const auto add = [](float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); };
  for (int64_t t = blockIdx.y; t < T_rows; t += gridDim.y) {
    const T* g = gu + t * 2 * n + j;
    const float4 g0 = add(load4(g), bg0), g1 = add(load4(g + 4), bg1), u0 = add(load4(g + n), bu0),
                 u1 = add(load4(g + n + 4), bu1);
    T* o = out + t * n + j;
    store4(o, make_float4(silu_mul1(g0.x, u0.x), silu_mul1(g0.y, u0.y), silu_mul1(g0.z, u0.z), silu_mul1(g0.w, u0.w)));
    store4(o + 4, make_float4(silu_mul1(g1.x, u1.x), silu_mul1(g1.y, u1.y), silu_mul1(g1.z, u1.z), silu_mul1(g1.w, u1.w)));
  }
}

template <typename T>
__global__ void silu_mul_kernel(const T* gu, const float* bias, int64_t total, int64_t n, T* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < total) {
    const int64_t t = i / n, j = i % n;
    const float bg = bias ? bias[j] : 0.0f, bu = bias ? bias[n + j] : 0.0f;
    out[i] = Act<T>::from(silu_mul1(Act<T>::to(gu[t * 2 * n + j]) + bg, Act<T>::to(gu[t * 2 * n + n + j]) + bu));
  }
}

template <typename T>
__global__ void relu_bias_kernel(const T* up, const float* bias, int64_t total, int64_t n, T* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < total) out[i] = Act<T>::from(fmaxf(Act<T>::to(up[i]) + bias[i % n], 0.0f));
}

}  // namespace

void silu_mul(const void* gu, DType t, int64_t T, int64_t n, void* out, cudaStream_t s, const float* bias) {
  FD_ACT_DISPATCH(t, "silu_mul", {
    const A16* in = static_cast<const A16*>(gu);
    A16* o = static_cast<A16*>(out);
    if (T * n > 0 && n % 8 == 0)
      silu_mul8_kernel<A16><<<dim3(blocks(n / 8), unsigned(std::min<int64_t>(T, 65535))), kThreads, 0, s>>>(in, bias, T, n, o);
    else if (T * n > 0) silu_mul_kernel<A16><<<blocks(T * n), kThreads, 0, s>>>(in, bias, T * n, n, o);
  });
  check_launch("silu_mul");
}
void relu_bias(const void* up, DType t, const float* bias, int64_t T, int64_t n, void* out, cudaStream_t s) {
  FD_ACT_DISPATCH(t, "relu_bias",
                  if (T * n > 0) relu_bias_kernel<A16><<<blocks(T * n), kThreads, 0, s>>>(
                      static_cast<const A16*>(up), bias, T * n, n, static_cast<A16*>(out)));
  check_launch("relu_bias");
}


}  // namespace fd::cuda
