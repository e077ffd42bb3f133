// Bias + RoPE + split after the fused [q|k|v] GEMM (see qkv.h).
#include "kernels/cuda/qkv.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>

#include "kernels/cuda/act16.cuh"

namespace fd::cuda {

namespace {

using namespace detail;

// Blocks (t, y): row t's work items y * blockDim .. (y + 1) * blockDim - 1, one a thread (a row's items spread
// over blocks, so that a thread makes one round trip to memory, not one an item). A block computes the row's RoPE
// angles into shared memory first (all heads share them); a work item is four adjacent pairs (i..i+3) of a head,
// whose elements i..i+3 and i + D/2 .. i + D/2 + 3 it reads as 8 bytes each and writes as float4 / 8 bytes
// (D % 8 == 0). Pair i of head h is rotated as HF's rotate_half; v heads are copied (+ bias).
template <typename T>
__global__ void qkv_post_kernel(const T* qkv, const float* bias, const int64_t* pos, const float* inv_freq,
                                float rope_scale, int64_t Hq, int64_t Hkv, int64_t D, float* q, float* k, float* v,
                                __half* q16, __half* k16, __half* v16, const int32_t* slots, int64_t max_ctx) {
  extern __shared__ float cs[];  // [D/2] cos, then [D/2] sin (both times rope_scale)
  const int64_t t = blockIdx.x, half = D / 2, heads = Hq + 2 * Hkv, ld = heads * D;
  if (inv_freq)
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
      float sn, cn;
      sincosf(float(pos[t]) * inv_freq[i], &sn, &cn);
      cs[i] = cn * rope_scale, cs[half + i] = sn * rope_scale;
    }
  __syncthreads();
  const T* row = qkv + t * ld;
  const int64_t per_head = half / 4;
  const int64_t j = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (j < heads * per_head) {
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
    // k and v into a cache: row slots[t] * max_ctx + pos[t] of width Hkv * D.
    const int64_t o16_at = slots && h >= Hq ? (int64_t(slots[t]) * max_ctx + pos[t]) * width + oh * D + i : o;
    if (o16) store4(o16 + o16_at, a), store4(o16 + o16_at + half, b);
  }
}

}  // namespace

void qkv_post(const QkvPostParams& p, cudaStream_t s) {
  if (p.D % 8 != 0) FD_THROW("qkv_post: head_dim " << p.D << " is not a multiple of 8");
  FD_ACT_DISPATCH(p.dtype, "qkv_post",
                  if (p.T > 0) qkv_post_kernel<A16><<<dim3(unsigned(p.T), blocks((p.Hq + 2 * p.Hkv) * (p.D / 8))),
                                                      kThreads, size_t(p.D) * sizeof(float), s>>>(
                      static_cast<const A16*>(p.qkv), p.bias, p.pos, p.inv_freq, p.rope_scale, p.Hq, p.Hkv, p.D,
                      p.q, p.k, p.v, p.q16, p.k16, p.v16, p.slots, p.max_ctx));
  check_launch("qkv_post");
}

}  // namespace fd::cuda
