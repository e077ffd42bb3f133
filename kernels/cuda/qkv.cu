// Bias + RoPE + split after the fused [q|k|v] GEMM (see qkv.h).
#include "kernels/cuda/qkv.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>

#include "kernels/cuda/act16.cuh"

namespace fd::cuda {

namespace {

using namespace detail;

// P consecutive 16-bit elements (P = 4: 8 bytes, P = 8: 16 bytes, aligned) as floats, and back.
template <typename T, int P>
__device__ __forceinline__ void load_p(const T* p, float (&f)[P]) {
  if constexpr (P == 4) {
    const float4 a = load4(p);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w;
  } else {
    static_assert(P == 8);
    load8(p, f);
  }
}
template <typename T, int P>
__device__ __forceinline__ void store_p(T* p, const float (&f)[P]) {
#pragma unroll
  for (int i = 0; i < P; i += 4) store4(p + i, make_float4(f[i], f[i + 1], f[i + 2], f[i + 3]));
}

// Blocks (t, y): row t's work items y * blockDim .. (y + 1) * blockDim - 1, one a thread (a row's items spread
// over blocks, so that a thread makes one round trip to memory, not one an item). A work item is P adjacent pairs
// (i..i+P-1) of a head, whose elements i.. and i + D/2 .. it reads and writes as P * 2 bytes each (P = 8, 16-byte
// accesses, when D % 16 == 0; else P = 4). A thread issues its loads first; then the block computes the row's RoPE
// angles into shared memory (all heads share them) while they are in flight. Pair i of head h is rotated as HF's
// rotate_half; v heads are copied (+ bias).
template <typename T, int P>
__global__ void qkv_post_kernel(const T* qkv, const float* bias, const int64_t* pos, const float* inv_freq,
                                float rope_scale, int64_t Hq, int64_t Hkv, int64_t D, float* q, float* k, float* v,
                                __half* q16, __half* k16, __half* v16, const int32_t* slots, int64_t max_ctx) {
  extern __shared__ float cs[];  // [D/2] cos, then [D/2] sin (both times rope_scale)
  const int64_t t = blockIdx.x, half = D / 2, heads = Hq + 2 * Hkv, ld = heads * D;
  const T* row = qkv + t * ld;
  const int64_t per_head = half / P;
  const int64_t j = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  const bool active = j < heads * per_head;
  const int64_t h = active ? j / per_head : 0, i = P * (active ? j % per_head : 0), col = h * D + i;
  float a[P], b[P];
  if (active) load_p<T, P>(row + col, a), load_p<T, P>(row + col + half, b);
  if (inv_freq)
    for (int64_t n = threadIdx.x; n < half; n += blockDim.x) {
      float sn, cn;
      sincosf(float(pos[t]) * inv_freq[n], &sn, &cn);
      cs[n] = cn * rope_scale, cs[half + n] = sn * rope_scale;
    }
  __syncthreads();
  if (!active) return;
  if (bias)
#pragma unroll
    for (int e = 0; e < P; ++e) a[e] += bias[col + e], b[e] += bias[col + half + e];
  const bool is_v = h >= Hq + Hkv;
  if (inv_freq && !is_v)
#pragma unroll
    for (int e = 0; e < P; ++e) {
      const float c = cs[i + e], sn = cs[half + i + e], a2 = a[e] * c - b[e] * sn;
      b[e] = b[e] * c + a[e] * sn;
      a[e] = a2;
    }
  float* o32;
  __half* o16;
  int64_t oh, width;
  if (h < Hq) o32 = q, o16 = q16, oh = h, width = Hq * D;
  else if (!is_v) o32 = k, o16 = k16, oh = h - Hq, width = Hkv * D;
  else o32 = v, o16 = v16, oh = h - Hq - Hkv, width = Hkv * D;
  const int64_t o = t * width + oh * D + i;
  if (o32)
#pragma unroll
    for (int e = 0; e < P; e += 4) {
      *reinterpret_cast<float4*>(o32 + o + e) = make_float4(a[e], a[e + 1], a[e + 2], a[e + 3]);
      *reinterpret_cast<float4*>(o32 + o + half + e) = make_float4(b[e], b[e + 1], b[e + 2], b[e + 3]);
    }
  // k and v into a cache: row slots[t] * max_ctx + pos[t] of width Hkv * D.
  const int64_t o16_at = slots && h >= Hq ? (int64_t(slots[t]) * max_ctx + pos[t]) * width + oh * D + i : o;
  if (o16) store_p<__half, P>(o16 + o16_at, a), store_p<__half, P>(o16 + o16_at + half, b);
}

template <typename T, int P>
void launch_qkv_post(const QkvPostParams& p, cudaStream_t s) {
  qkv_post_kernel<T, P><<<dim3(unsigned(p.T), blocks((p.Hq + 2 * p.Hkv) * (p.D / (2 * P)))), kThreads,
                          size_t(p.D) * sizeof(float), s>>>(static_cast<const T*>(p.qkv), p.bias, p.pos, p.inv_freq,
                                                            p.rope_scale, p.Hq, p.Hkv, p.D, p.q, p.k, p.v, p.q16,
                                                            p.k16, p.v16, p.slots, p.max_ctx);
}

}  // namespace

void qkv_post(const QkvPostParams& p, cudaStream_t s) {
  if (p.D % 8 != 0) FD_THROW("qkv_post: head_dim " << p.D << " is not a multiple of 8");
  FD_ACT_DISPATCH(p.dtype, "qkv_post", if (p.T > 0) {
    if (p.D % 16 == 0) launch_qkv_post<A16, 8>(p, s);
    else launch_qkv_post<A16, 4>(p, s);
  });
  check_launch("qkv_post");
}

}  // namespace fd::cuda
