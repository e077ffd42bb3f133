// Device helpers shared by the elementwise kernels (.cu files only): 16-bit activation loads and stores,
// a block-wide sum, and dispatch of a launcher body on the run-time activation type.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"

namespace fd::cuda::detail {

constexpr int kThreads = 256;
inline unsigned blocks(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

__device__ __forceinline__ float block_sum(float v) {
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

// 16-bit activation types: loads and stores of one, two (a 4-byte pair), four (8 bytes) and eight (16 bytes, loads)
// elements.
template <typename T>
struct Act;
template <>
struct Act<__half> {
  using T2 = __half2;
  static __device__ __forceinline__ float to(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half from(float f) { return __float2half_rn(f); }
  static __device__ __forceinline__ float2 to2(T2 v) { return __half22float2(v); }
  static __device__ __forceinline__ T2 from2(float2 f) { return __float22half2_rn(f); }
};
template <>
struct Act<__nv_bfloat16> {
  using T2 = __nv_bfloat162;
  static __device__ __forceinline__ float to(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 from(float f) { return __float2bfloat16_rn(f); }
  static __device__ __forceinline__ float2 to2(T2 v) { return __bfloat1622float2(v); }
  static __device__ __forceinline__ T2 from2(float2 f) { return __float22bfloat162_rn(f); }
};
template <>
struct Act<float> {
  static __device__ __forceinline__ float to(float v) { return v; }
  static __device__ __forceinline__ float from(float f) { return f; }
};

// Four consecutive 16-bit elements (8-byte aligned) as a float4, and back.
template <typename T>
__device__ __forceinline__ float4 load4(const T* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = Act<T>::to2(*reinterpret_cast<const typename Act<T>::T2*>(&u.x));
  const float2 b = Act<T>::to2(*reinterpret_cast<const typename Act<T>::T2*>(&u.y));
  return make_float4(a.x, a.y, b.x, b.y);
}
template <typename T>
__device__ __forceinline__ void store4(T* p, float4 f) {
  const typename Act<T>::T2 a = Act<T>::from2(make_float2(f.x, f.y)), b = Act<T>::from2(make_float2(f.z, f.w));
  uint2 u;
  u.x = *reinterpret_cast<const uint32_t*>(&a);
  u.y = *reinterpret_cast<const uint32_t*>(&b);
  *reinterpret_cast<uint2*>(p) = u;
}
// Eight consecutive 16-bit elements (one 16-byte load, 16-byte aligned) to fp32.
template <typename T>
__device__ __forceinline__ void load8(const T* p, float (&f)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 e = Act<T>::to2(*reinterpret_cast<const typename Act<T>::T2*>(&w[i]));
    f[2 * i] = e.x, f[2 * i + 1] = e.y;
  }
}
__device__ __forceinline__ float4 operator+(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }

inline void check_width(int64_t n, int64_t multiple, const char* what) {
  if (n % multiple != 0) FD_THROW(what << ": width " << n << " is not a multiple of " << multiple);
}

}  // namespace fd::cuda::detail

// Runs body with A16 bound to the 16-bit type named by dt.
#define FD_ACT_DISPATCH(dt, what, ...)              \
  do {                                              \
    ::fd::cuda::check_act_dtype(dt, what);          \
    if ((dt) == ::fd::DType::F16) {                 \
      using A16 = __half;                           \
      __VA_ARGS__;                                  \
    } else {                                        \
      using A16 = __nv_bfloat16;                    \
      __VA_ARGS__;                                  \
    }                                               \
  } while (0)
