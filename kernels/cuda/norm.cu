// RMSNorm / LayerNorm kernels (see norm.h).
#include "kernels/cuda/norm.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>

#include "kernels/cuda/act16.cuh"

namespace fd::cuda {

namespace {

using namespace detail;

// A block normalises one row held in registers: thread t owns the float4s t, t + blockDim, ... (at most kNormVec
// of them), all loaded before the first reduction so that a row costs one memory round trip, not one a float4.
constexpr int kNormVec = 4;
constexpr int kNormMaxThreads = 1024;

// Threads for rows of n4 float4s: 256, or more when a row needs them (n4 <= kNormVec * kNormMaxThreads).
int norm_threads(int64_t n4) {
  const int64_t t = (n4 + kNormVec - 1) / kNormVec;
  return int(std::max<int64_t>(kThreads, (t + 31) / 32 * 32));
}

// The row's float4s (x += bias stored back first when bias is given) and the weights beside them.
struct Row {
  float4 v[kNormVec];
};

// f(k, i) for each float4 i = threadIdx.x + k * blockDim.x of a row of n4 that this thread owns (k < kNormVec).
template <class F>
__device__ __forceinline__ void each_owned(int n4, F&& f) {
#pragma unroll
  for (int k = 0; k < kNormVec; ++k) {
    const int i = int(threadIdx.x) + k * int(blockDim.x);
    if (i < n4) f(k, i);
  }
}

// The block's row: x[rows[blockIdx.x]] (rows null: x[blockIdx.x]) into v, + bias stored back when given; w into g.
__device__ __forceinline__ void load_row(float* x, const int32_t* rows, const float* bias, const float* w, int n4,
                                         Row& v, Row& g) {
  float4* xr = reinterpret_cast<float4*>(x) + (rows ? int64_t(rows[blockIdx.x]) : int64_t(blockIdx.x)) * n4;
  const float4 *b4 = reinterpret_cast<const float4*>(bias), *w4 = reinterpret_cast<const float4*>(w);
  each_owned(n4, [&](int k, int i) { v.v[k] = xr[i], g.v[k] = w4[i]; });
  if (b4) each_owned(n4, [&](int k, int i) { xr[i] = v.v[k] = v.v[k] + b4[i]; });
}

template <typename T>
__global__ void __launch_bounds__(kNormMaxThreads) rmsnorm_kernel(float* x, const int32_t* rows, const float* add_bias,
                                                                 const float* w, float eps, int n4, T* out) {
  Row v, g;
  load_row(x, rows, add_bias, w, n4, v, g);
  float ss = 0;
  each_owned(n4, [&](int k, int) {
    const float4 e = v.v[k];
    ss += e.x * e.x + e.y * e.y + e.z * e.z + e.w * e.w;
  });
  const float r = rsqrtf(block_sum(ss) / float(4 * n4) + eps);
  T* o = out + int64_t(blockIdx.x) * n4 * 4;
  each_owned(n4, [&](int k, int i) {
    const float4 e = v.v[k], c = g.v[k];
    store4(o + 4 * i, make_float4(c.x * (e.x * r), c.y * (e.y * r), c.z * (e.z * r), c.w * (e.w * r)));
  });
}

template <typename T>
__global__ void __launch_bounds__(kNormMaxThreads) layernorm_kernel(float* x, const int32_t* rows,
                                                                   const float* add_bias, const float* w,
                                                                   const float* b, float eps, int n4, T* out,
                                                                   bool store) {
  Row v, g;
  load_row(x, rows, add_bias, w, n4, v, g);
  const float4* bb4 = reinterpret_cast<const float4*>(b);
  float s = 0;
  each_owned(n4, [&](int k, int) {
    const float4 e = v.v[k];
    s += e.x + e.y + e.z + e.w;
  });
  const float mean = block_sum(s) / float(4 * n4);
  float var = 0;
  each_owned(n4, [&](int k, int) {
    const float4 e = v.v[k];
    var += (e.x - mean) * (e.x - mean) + (e.y - mean) * (e.y - mean) + (e.z - mean) * (e.z - mean) +
           (e.w - mean) * (e.w - mean);
  });
  const float r = rsqrtf(block_sum(var) / float(4 * n4) + eps);
  T* o = out + int64_t(blockIdx.x) * n4 * 4;
  float4* xr = reinterpret_cast<float4*>(x) + int64_t(blockIdx.x) * n4;  // store: rows is null (check_norm)
  each_owned(n4, [&](int k, int i) {
    const float4 e = v.v[k], c = g.v[k], d = bb4[i];
    const float4 y = make_float4((e.x - mean) * r * c.x + d.x, (e.y - mean) * r * c.y + d.y,
                                 (e.z - mean) * r * c.z + d.z, (e.w - mean) * r * c.w + d.w);
    store4(o + 4 * i, y);
    if (store) xr[i] = y;
  });
}

// out[t, :] = x[rows[t] (or t), :] in 16-bit: one block per row.
template <typename T>
__global__ void rows_to_act_kernel(const float* x, const int32_t* rows, int64_t n, T* out) {
  const float* xr = x + (rows ? int64_t(rows[blockIdx.x]) : int64_t(blockIdx.x)) * n;
  T* o = out + int64_t(blockIdx.x) * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) o[i] = Act<T>::from(xr[i]);
}

__global__ void add_bias_rows_kernel(float* x, const float* bias, int64_t total, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < total) x[i] += bias[i % n];
}

void check_norm(const char* what, int64_t n, const int32_t* rows, const float* add_bias, bool store = false) {
  check_width(n, 4, what);
  if (rows && store) FD_THROW(what << ": the normalized rows are stored back into x, so they cannot be gathered rows");
  if (n / 4 > int64_t(kNormVec) * kNormMaxThreads)
    FD_THROW(what << ": width " << n << " exceeds " << 4 * kNormVec * kNormMaxThreads);
  if (rows && add_bias) FD_THROW(what << ": a bias is stored back into x, so it cannot be added to gathered rows");
}

}  // namespace

void rmsnorm(float* x, const float* add_bias, const float* w, float eps, int64_t T, int64_t n, void* out, DType ot,
             cudaStream_t s, const int32_t* rows) {
  check_norm("rmsnorm", n, rows, add_bias);
  FD_ACT_DISPATCH(ot, "rmsnorm",
                  if (T > 0) rmsnorm_kernel<A16><<<unsigned(T), norm_threads(n / 4), 0, s>>>(
                      x, rows, add_bias, w, eps, int(n / 4), static_cast<A16*>(out)));
  check_launch("rmsnorm");
}
void layernorm(float* x, const float* add_bias, const float* w, const float* b, float eps, int64_t T, int64_t n,
               void* out, DType ot, cudaStream_t s, const int32_t* rows, bool store) {
  check_norm("layernorm", n, rows, add_bias, store);
  FD_ACT_DISPATCH(ot, "layernorm",
                  if (T > 0) layernorm_kernel<A16><<<unsigned(T), norm_threads(n / 4), 0, s>>>(
                      x, rows, add_bias, w, b, eps, int(n / 4), static_cast<A16*>(out), store));
  check_launch("layernorm");
}
void rows_to_act(const float* x, const int32_t* rows, int64_t T, int64_t n, void* out, DType ot, cudaStream_t s) {
  FD_ACT_DISPATCH(ot, "rows_to_act",
                  if (T * n > 0) rows_to_act_kernel<A16><<<unsigned(T), kThreads, 0, s>>>(x, rows, n,
                                                                                          static_cast<A16*>(out)));
  check_launch("rows_to_act");
}
void add_bias_rows(float* x, const float* bias, int64_t T, int64_t n, cudaStream_t s) {
  if (T * n > 0) add_bias_rows_kernel<<<blocks(T * n), kThreads, 0, s>>>(x, bias, T * n, n);
  check_launch("add_bias_rows");
}

}  // namespace fd::cuda
