// CUDA S-Part kernels: static kernel -> launcher with an explicit stream (llama.cpp's layering).
#include "kernels/cuda/spart_kernels.h"

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

__global__ void embed_kernel(const int32_t* tokens, const int64_t* pos, const __half* table, const __half* pos_table,
                             int64_t pos_offset, int64_t H, float* x) {
  const int64_t t = blockIdx.x;
  const __half* e = table + int64_t(tokens[t]) * H;
  const __half* p = pos_table ? pos_table + (pos[t] + pos_offset) * H : nullptr;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x)
    x[t * H + i] = __half2float(e[i]) + (p ? __half2float(p[i]) : 0.0f);
}

__global__ void gather_rows_kernel(const float* x, const int32_t* rows, int64_t H, float* out) {
  const float* src = x + int64_t(rows[blockIdx.x]) * H;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) out[blockIdx.x * H + i] = src[i];
}

// x += add (+ bias) when add is given (stored back); returns nothing, the row is then in x.
__device__ __forceinline__ float residual(float* xr, const __half* ar, const float* bias, int64_t i) {
  float v = xr[i];
  if (ar) {
    v += __half2float(ar[i]) + (bias ? bias[i] : 0.0f);
    xr[i] = v;
  }
  return v;
}

__global__ void rmsnorm_kernel(float* x, const __half* add, const float* add_bias, const float* w, float eps, int64_t n,
                               __half* out) {
  float* xr = x + blockIdx.x * n;
  const __half* ar = add ? add + blockIdx.x * n : nullptr;
  float ss = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = residual(xr, ar, add_bias, i);
    ss += v * v;
  }
  const float r = rsqrtf(block_sum(ss) / float(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[blockIdx.x * n + i] = __float2half(w[i] * (xr[i] * r));
}

__global__ void layernorm_kernel(float* x, const __half* add, const float* add_bias, const float* w, const float* b,
                                 float eps, int64_t n, __half* out) {
  float* xr = x + blockIdx.x * n;
  const __half* ar = add ? add + blockIdx.x * n : nullptr;
  float s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += residual(xr, ar, add_bias, i);
  const float mean = block_sum(s) / float(n);
  float v = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) v += (xr[i] - mean) * (xr[i] - mean);
  const float r = rsqrtf(block_sum(v) / float(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    out[blockIdx.x * n + i] = __float2half((xr[i] - mean) * r * w[i] + b[i]);
}

__global__ void add_residual_kernel(float* x, const __half* y, const float* bias, int64_t total, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < total) x[i] += __half2float(y[i]) + (bias ? bias[i % n] : 0.0f);
}

// One block per row t. The row's RoPE angles are computed once into shared memory (all heads share
// them); then each thread takes two adjacent pairs (i, i+1) of a head, whose elements (i, i+1) and
// (i + D/2, i + D/2 + 1) it reads and writes as half2 / float2 (D % 4 == 0). Pair i of head h is
// rotated as HF's rotate_half; v heads are copied (+ bias).
__global__ void qkv_post_kernel(const __half* qkv, const float* bias, const int64_t* pos, const float* inv_freq,
                                int64_t Hq, int64_t Hkv, int64_t D, float* q, float* k, float* v, __half* q16,
                                __half* k16, __half* v16) {
  extern __shared__ float cs[];  // [D/2] cos, then [D/2] sin
  const int64_t t = blockIdx.x, half = D / 2, heads = Hq + 2 * Hkv, ld = heads * D;
  if (inv_freq)
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) sincosf(float(pos[t]) * inv_freq[i], &cs[half + i], &cs[i]);
  __syncthreads();
  const __half* row = qkv + t * ld;
  const int64_t per_head = half / 2;
  for (int64_t j = threadIdx.x; j < heads * per_head; j += blockDim.x) {
    const int64_t h = j / per_head, i = 2 * (j % per_head), col = h * D + i;
    float2 a = __half22float2(*reinterpret_cast<const __half2*>(row + col));
    float2 b = __half22float2(*reinterpret_cast<const __half2*>(row + col + half));
    if (bias) a.x += bias[col], a.y += bias[col + 1], b.x += bias[col + half], b.y += bias[col + half + 1];
    const bool is_v = h >= Hq + Hkv;
    if (inv_freq && !is_v) {
      const float c0 = cs[i], c1 = cs[i + 1], s0 = cs[half + i], s1 = cs[half + i + 1];
      const float2 a2 = make_float2(a.x * c0 - b.x * s0, a.y * c1 - b.y * s1);
      b = make_float2(b.x * c0 + a.x * s0, b.y * c1 + a.y * s1);
      a = a2;
    }
    float* o32;
    __half* o16;
    int64_t oh, width;
    if (h < Hq) o32 = q, o16 = q16, oh = h, width = Hq * D;
    else if (!is_v) o32 = k, o16 = k16, oh = h - Hq, width = Hkv * D;
    else o32 = v, o16 = v16, oh = h - Hq - Hkv, width = Hkv * D;
    const int64_t o = t * width + oh * D + i;
    if (o32) *reinterpret_cast<float2*>(o32 + o) = a, *reinterpret_cast<float2*>(o32 + o + half) = b;
    if (o16) *reinterpret_cast<__half2*>(o16 + o) = __float22half2_rn(a), *reinterpret_cast<__half2*>(o16 + o + half) = __float22half2_rn(b);
  }
}

// Two elements per thread (n even): half2 loads and stores.
__global__ void silu_mul2_kernel(const __half* gu, int64_t total2, int64_t n, __half* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < total2) {
    const int64_t e = 2 * i, t = e / n, j = e % n;
    const float2 g = __half22float2(*reinterpret_cast<const __half2*>(gu + t * 2 * n + j));
    const float2 u = __half22float2(*reinterpret_cast<const __half2*>(gu + t * 2 * n + n + j));
    *reinterpret_cast<__half2*>(out + e) =
        __floats2half2_rn(u.x * (g.x / (1.0f + __expf(-g.x))), u.y * (g.y / (1.0f + __expf(-g.y))));
  }
}

__global__ void add_residual2_kernel(float* x, const __half* y, const float* bias, int64_t total2, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < total2) {
    const int64_t e = 2 * i;
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(y + e));
    float2 xv = *reinterpret_cast<float2*>(x + e);
    xv.x += a.x + (bias ? bias[e % n] : 0.0f);
    xv.y += a.y + (bias ? bias[(e + 1) % n] : 0.0f);
    *reinterpret_cast<float2*>(x + e) = xv;
  }
}

__global__ void silu_mul_kernel(const __half* gu, int64_t total, int64_t n, __half* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < total) {
    const int64_t t = i / n, j = i % n;
    const float g = __half2float(gu[t * 2 * n + j]), u = __half2float(gu[t * 2 * n + n + j]);
    out[i] = __float2half(u * (g / (1.0f + __expf(-g))));
  }
}

__global__ void relu_bias_kernel(const __half* up, const float* bias, int64_t total, int64_t n, __half* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < total) out[i] = __float2half(fmaxf(__half2float(up[i]) + bias[i % n], 0.0f));
}

__global__ void to_f16_kernel(const float* x, int64_t n, __half* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __float2half(x[i]);
}

__global__ void to_f32_kernel(const __half* x, int64_t n, float* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = __half2float(x[i]);
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

void embed(const int32_t* tokens, const int64_t* pos, const __half* table, const __half* pos_table, int64_t pos_offset,
           int64_t T, int64_t H, float* x, cudaStream_t s) {
  if (T > 0) embed_kernel<<<unsigned(T), kThreads, 0, s>>>(tokens, pos, table, pos_table, pos_offset, H, x);
  check_launch("embed");
}
void gather_rows(const float* x, const int32_t* rows, int64_t n, int64_t H, float* out, cudaStream_t s) {
  if (n > 0) gather_rows_kernel<<<unsigned(n), kThreads, 0, s>>>(x, rows, H, out);
  check_launch("gather_rows");
}
void rmsnorm_to_f16(float* x, const __half* add, const float* add_bias, const float* w, float eps, int64_t T,
                    int64_t n, __half* out, cudaStream_t s) {
  if (T > 0) rmsnorm_kernel<<<unsigned(T), kThreads, 0, s>>>(x, add, add_bias, w, eps, n, out);
  check_launch("rmsnorm");
}
void layernorm_to_f16(float* x, const __half* add, const float* add_bias, const float* w, const float* b, float eps,
                      int64_t T, int64_t n, __half* out, cudaStream_t s) {
  if (T > 0) layernorm_kernel<<<unsigned(T), kThreads, 0, s>>>(x, add, add_bias, w, b, eps, n, out);
  check_launch("layernorm");
}
void add_residual(float* x, const __half* y, const float* bias, int64_t T, int64_t n, cudaStream_t s) {
  if (T * n > 0 && n % 2 == 0) add_residual2_kernel<<<blocks(T * n / 2), kThreads, 0, s>>>(x, y, bias, T * n / 2, n);
  else if (T * n > 0) add_residual_kernel<<<blocks(T * n), kThreads, 0, s>>>(x, y, bias, T * n, n);
  check_launch("add_residual");
}
void qkv_post(const __half* qkv, const float* bias, const int64_t* pos, const float* inv_freq, int64_t T, int64_t Hq,
              int64_t Hkv, int64_t D, float* q, float* k, float* v, __half* q16, __half* k16, __half* v16,
              cudaStream_t s) {
  if (D % 4 != 0) FD_THROW("qkv_post: head_dim " << D << " is not a multiple of 4");
  if (T > 0)
    qkv_post_kernel<<<unsigned(T), kThreads, size_t(D) * sizeof(float), s>>>(qkv, bias, pos, inv_freq, Hq, Hkv, D, q, k,
                                                                            v, q16, k16, v16);
  check_launch("qkv_post");
}
void silu_mul_to_f16(const __half* gu, int64_t T, int64_t n, __half* out, cudaStream_t s) {
  if (T * n > 0 && n % 2 == 0) silu_mul2_kernel<<<blocks(T * n / 2), kThreads, 0, s>>>(gu, T * n / 2, n, out);
  else if (T * n > 0) silu_mul_kernel<<<blocks(T * n), kThreads, 0, s>>>(gu, T * n, n, out);
  check_launch("silu_mul");
}
void relu_bias_to_f16(const __half* up, const float* bias, int64_t T, int64_t n, __half* out, cudaStream_t s) {
  if (T * n > 0) relu_bias_kernel<<<blocks(T * n), kThreads, 0, s>>>(up, bias, T * n, n, out);
  check_launch("relu_bias");
}
void to_f16(const float* x, int64_t n, __half* out, cudaStream_t s) {
  if (n > 0) to_f16_kernel<<<blocks(n), kThreads, 0, s>>>(x, n, out);
  check_launch("to_f16");
}
void to_f32(const __half* x, int64_t n, float* out, cudaStream_t s) {
  if (n > 0) to_f32_kernel<<<blocks(n), kThreads, 0, s>>>(x, n, out);
  check_launch("to_f32");
}
void argmax_rows(const float* logits, int64_t n, int64_t V, int32_t* out, cudaStream_t s) {
  if (n > 0) argmax_kernel<<<unsigned(n), kThreads, 0, s>>>(logits, V, out);
  check_launch("argmax");
}

}  // namespace fd::cuda
