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

// Items of eight elements over the whole [T, n] output (n % 8 == 0), numbered row by row, so that every thread of
// every block has work (a grid of row-wide blocks left 5 of 8 warps idle in each row's last block at n = 11008); a
// thread takes two items a grid apart and issues their eight 16-byte loads before any arithmetic. The output is one
// contiguous run; an item's gate and up are 16 bytes of row t's two halves.
template <typename T>
__global__ void silu_mul8_kernel(const T* gu, uint32_t n8, uint32_t items, T* out) {
  const uint32_t stride = gridDim.x * blockDim.x, k0 = blockIdx.x * blockDim.x + threadIdx.x;
  float4 g[2][2], u[2][2];
  uint32_t k[2] = {k0, k0 + stride};
#pragma unroll
  for (int r = 0; r < 2; ++r)
    if (k[r] < items) {
      const uint32_t t = k[r] / n8, j = k[r] - t * n8;
      const T* p = gu + (size_t(t) * 2 * n8 + j) * 8;
      g[r][0] = load4(p), g[r][1] = load4(p + 4), u[r][0] = load4(p + size_t(n8) * 8), u[r][1] = load4(p + size_t(n8) * 8 + 4);
    }
#pragma unroll
  for (int r = 0; r < 2; ++r)
    if (k[r] < items) {
      T* o = out + size_t(k[r]) * 8;
#pragma unroll
      for (int h = 0; h < 2; ++h)
        store4(o + 4 * h, make_float4(silu_mul1(g[r][h].x, u[r][h].x), silu_mul1(g[r][h].y, u[r][h].y),
                                      silu_mul1(g[r][h].z, u[r][h].z), silu_mul1(g[r][h].w, u[r][h].w)));
    }
}

template <typename T>
__global__ void silu_mul_kernel(const T* gu, int64_t total, int64_t n, T* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < total) {
    const int64_t t = i / n, j = i % n;
    out[i] = Act<T>::from(silu_mul1(Act<T>::to(gu[t * 2 * n + j]), Act<T>::to(gu[t * 2 * n + n + j])));
  }
}

template <typename T>
__global__ void relu_bias_kernel(const T* up, const float* bias, int64_t total, int64_t n, T* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < total) out[i] = Act<T>::from(fmaxf(Act<T>::to(up[i]) + bias[i % n], 0.0f));
}

}  // namespace

void silu_mul(const void* gu, DType t, int64_t T, int64_t n, void* out, cudaStream_t s) {
  FD_ACT_DISPATCH(t, "silu_mul", {
    const A16* in = static_cast<const A16*>(gu);
    A16* o = static_cast<A16*>(out);
    if (T * n > 0 && n % 8 == 0 && T * n / 8 < (int64_t(1) << 31)) {
      const int64_t items = T * n / 8, grid = (items + 2 * kThreads - 1) / (2 * kThreads);
      silu_mul8_kernel<A16><<<unsigned(grid), kThreads, 0, s>>>(in, uint32_t(n / 8), uint32_t(items), o);
    }
    else if (T * n > 0) silu_mul_kernel<A16><<<blocks(T * n), kThreads, 0, s>>>(in, T * n, n, o);
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
