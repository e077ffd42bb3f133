// CUDA S-Part kernels: static kernel -> launcher with an explicit stream (llama.cpp's layering).
#include "kernels/cuda/spart_kernels.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>

#include "fastdecode/core/error.h"

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

// 16-bit activation types: loads and stores of one, two (a 4-byte pair) and four (8 bytes) elements.
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
__device__ __forceinline__ float4 operator+(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }

template <typename T>
__global__ void embed_kernel(const int32_t* tokens, const int64_t* pos, const T* table, const T* pos_table,
                             int64_t pos_offset, int64_t H, float* x) {
  const int64_t t = blockIdx.x;
  const T* e = table + int64_t(tokens[t]) * H;
  const T* p = pos_table ? pos_table + (pos[t] + pos_offset) * H : nullptr;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x)
    x[t * H + i] = Act<T>::to(e[i]) + (p ? Act<T>::to(p[i]) : 0.0f);
}

__global__ void gather_rows_kernel(const float* x, const int32_t* rows, int64_t H, float* out) {
  const float* src = x + int64_t(rows[blockIdx.x]) * H;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) out[blockIdx.x * H + i] = src[i];
}

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

// One block per row t. The row's RoPE angles are computed once into shared memory (all heads share
// them); then each thread takes four adjacent pairs (i..i+3) of a head, whose elements i..i+3 and
// i + D/2 .. i + D/2 + 3 it reads as 8 bytes each and writes as float4 / 8 bytes (D % 8 == 0).
// Pair i of head h is rotated as HF's rotate_half; v heads are copied (+ bias).
template <typename T>
__global__ void qkv_post_kernel(const T* qkv, const float* bias, const int64_t* pos, const float* inv_freq, int64_t Hq,
                                int64_t Hkv, int64_t D, float* q, float* k, float* v, __half* q16, __half* k16,
                                __half* v16) {
  extern __shared__ float cs[];  // [D/2] cos, then [D/2] sin
  const int64_t t = blockIdx.x, half = D / 2, heads = Hq + 2 * Hkv, ld = heads * D;
  if (inv_freq)
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) sincosf(float(pos[t]) * inv_freq[i], &cs[half + i], &cs[i]);
  __syncthreads();
  const T* row = qkv + t * ld;
  const int64_t per_head = half / 4;
  for (int64_t j = threadIdx.x; j < heads * per_head; j += blockDim.x) {
    const int64_t h = j / per_head, i = 4 * (j % per_head), col = h * D + i;
    float4 a = load4(row + col), b = load4(row + col + half);
    if (bias) a = a + *reinterpret_cast<const float4*>(bias + col), b = b + *reinterpret_cast<const float4*>(bias + col + half);
    const bool is_v = h >= Hq + Hkv;
    if (inv_freq && !is_v) {
      const float4 c = *reinterpret_cast<const float4*>(cs + i), s = *reinterpret_cast<const float4*>(cs + half + i);
      const float4 a2 = make_float4(a.x * c.x - b.x * s.x, a.y * c.y - b.y * s.y, a.z * c.z - b.z * s.z, a.w * c.w - b.w * s.w);
      b = make_float4(b.x * c.x + a.x * s.x, b.y * c.y + a.y * s.y, b.z * c.z + a.z * s.z, b.w * c.w + a.w * s.w);
      a = a2;
    }
    float* o32;
    __half* o16;
    int64_t oh, width;
    if (h < Hq) o32 = q, o16 = q16, oh = h, width = Hq * D;
    else if (!is_v) o32 = k, o16 = k16, oh = h - Hq, width = Hkv * D;
    else o32 = v, o16 = v16, oh = h - Hq - Hkv, width = Hkv * D;
    const int64_t o = t * width + oh * D + i;
    if (o32) *reinterpret_cast<float4*>(o32 + o) = a, *reinterpret_cast<float4*>(o32 + o + half) = b;
    if (o16) store4(o16 + o, a), store4(o16 + o + half, b);
  }
}

__device__ __forceinline__ float silu_mul1(float g, float u) { return u * (g / (1.0f + __expf(-g))); }

// Eight elements per thread (n % 8 == 0): 16-byte loads of gate and up, a 16-byte store. Columns on
// grid x, rows on grid y (striding by gridDim.y past 65535 rows): no integer division per element.
template <typename T>
__global__ void silu_mul8_kernel(const T* gu, int64_t T_rows, int64_t n, T* out) {
  const int64_t j = 8 * (blockIdx.x * int64_t(blockDim.x) + threadIdx.x);
  if (j >= n) return;
  for (int64_t t = blockIdx.y; t < T_rows; t += gridDim.y) {
    const T* g = gu + t * 2 * n + j;
    const float4 g0 = load4(g), g1 = load4(g + 4), u0 = load4(g + n), u1 = load4(g + n + 4);
    T* o = out + t * n + j;
    store4(o, make_float4(silu_mul1(g0.x, u0.x), silu_mul1(g0.y, u0.y), silu_mul1(g0.z, u0.z), silu_mul1(g0.w, u0.w)));
    store4(o + 4, make_float4(silu_mul1(g1.x, u1.x), silu_mul1(g1.y, u1.y), silu_mul1(g1.z, u1.z), silu_mul1(g1.w, u1.w)));
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

template <typename S, typename D>
__global__ void cast_kernel(const S* x, int64_t n, D* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = Act<D>::from(Act<S>::to(x[i]));
}

// One block per row: each thread keeps its best (value, index), then a shared-memory reduction that
// prefers the larger value and, on equal values, the lower index.
__global__ void argmax_kernel(const float* logits, int64_t V, int32_t* out) {
  const float* row = logits + blockIdx.x * V;
  float best = -FLT_MAX;
  int32_t bi = INT32_MAX;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
    if (row[i] > best || bi == INT32_MAX) best = row[i], bi = int32_t(i);
  __shared__ float sv[kThreads];
  __shared__ int32_t si[kThreads];
  sv[threadIdx.x] = best, si[threadIdx.x] = bi;
  __syncthreads();
  for (int o = kThreads / 2; o > 0; o >>= 1) {
    if (int(threadIdx.x) < o) {
      const float v2 = sv[threadIdx.x + o];
      const int32_t i2 = si[threadIdx.x + o];
      if (v2 > sv[threadIdx.x] || (v2 == sv[threadIdx.x] && i2 < si[threadIdx.x])) sv[threadIdx.x] = v2, si[threadIdx.x] = i2;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = si[0];
}

unsigned blocks(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

}  // namespace

void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) FD_THROW("CUDA kernel " << what << ": " << cudaGetErrorString(e));
}

void check_act_dtype(DType t, const char* what) {
  if (t != DType::F16 && t != DType::BF16)
    FD_THROW(what << ": 16-bit activations are fp16 or bf16, not " << dtype_name(t));
}

// Runs body with A16 bound to the 16-bit type named by dt.
#define FD_ACT_DISPATCH(dt, what, ...)                     \
  do {                                                     \
    check_act_dtype(dt, what);                             \
    if ((dt) == DType::F16) {                              \
      using A16 = __half;                                  \
      __VA_ARGS__;                                         \
    } else {                                               \
      using A16 = __nv_bfloat16;                             \
      __VA_ARGS__;                                         \
    }                                                      \
  } while (0)

namespace {
void check_width(int64_t n, int64_t multiple, const char* what) {
  if (n % multiple != 0) FD_THROW(what << ": width " << n << " is not a multiple of " << multiple);
}
}  // namespace

void embed(const int32_t* tokens, const int64_t* pos, const void* table, const void* pos_table, DType wt,
           int64_t pos_offset, int64_t T, int64_t H, float* x, cudaStream_t s) {
  FD_ACT_DISPATCH(wt, "embed",
                  if (T > 0) embed_kernel<A16><<<unsigned(T), kThreads, 0, s>>>(
                      tokens, pos, static_cast<const A16*>(table), static_cast<const A16*>(pos_table), pos_offset, H, x));
  check_launch("embed");
}
void gather_rows(const float* x, const int32_t* rows, int64_t n, int64_t H, float* out, cudaStream_t s) {
  if (n > 0) gather_rows_kernel<<<unsigned(n), kThreads, 0, s>>>(x, rows, H, out);
  check_launch("gather_rows");
}
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
void qkv_post(const void* qkv, DType t, const float* bias, const int64_t* pos, const float* inv_freq, int64_t T,
              int64_t Hq, int64_t Hkv, int64_t D, float* q, float* k, float* v, __half* q16, __half* k16,
              __half* v16, cudaStream_t s) {
  if (D % 8 != 0) FD_THROW("qkv_post: head_dim " << D << " is not a multiple of 8");
  FD_ACT_DISPATCH(t, "qkv_post",
                  if (T > 0) qkv_post_kernel<A16><<<unsigned(T), kThreads, size_t(D) * sizeof(float), s>>>(
                      static_cast<const A16*>(qkv), bias, pos, inv_freq, Hq, Hkv, D, q, k, v, q16, k16, v16));
  check_launch("qkv_post");
}
void silu_mul(const void* gu, DType t, int64_t T, int64_t n, void* out, cudaStream_t s) {
  FD_ACT_DISPATCH(t, "silu_mul", {
    const A16* in = static_cast<const A16*>(gu);
    A16* o = static_cast<A16*>(out);
    if (T * n > 0 && n % 8 == 0)
      silu_mul8_kernel<A16><<<dim3(blocks(n / 8), unsigned(std::min<int64_t>(T, 65535))), kThreads, 0, s>>>(in, T, n, o);
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

namespace {
template <typename S>
void cast_from(const S* src, void* dst, DType dt, int64_t n, cudaStream_t s) {
  if (dt == DType::F32) cast_kernel<S, float><<<blocks(n), kThreads, 0, s>>>(src, n, static_cast<float*>(dst));
  else if (dt == DType::F16) cast_kernel<S, __half><<<blocks(n), kThreads, 0, s>>>(src, n, static_cast<__half*>(dst));
  else cast_kernel<S, __nv_bfloat16><<<blocks(n), kThreads, 0, s>>>(src, n, static_cast<__nv_bfloat16*>(dst));
}
}  // namespace

void cast(const void* src, DType st, void* dst, DType dt, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  if (st == DType::F32) cast_from(static_cast<const float*>(src), dst, dt, n, s);
  else if (st == DType::F16) cast_from(static_cast<const __half*>(src), dst, dt, n, s);
  else cast_from(static_cast<const __nv_bfloat16*>(src), dst, dt, n, s);
  check_launch("cast");
}
void argmax_rows(const float* logits, int64_t n, int64_t V, int32_t* out, cudaStream_t s) {
  if (n > 0) argmax_kernel<<<unsigned(n), kThreads, 0, s>>>(logits, V, out);
  check_launch("argmax");
}

}  // namespace fd::cuda
