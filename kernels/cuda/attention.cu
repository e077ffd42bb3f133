// CUDA attention: flash-decoding over an fp16 KV-cache, tiled causal prefill (see attention.h; the KV append is in
// append_kv.cu).
#include "kernels/cuda/attention.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "fd_fault_cuda_decode_skips_last_kv.h"  // planted fault (scripts/fault-check.sh; fastdecode/core/fault.h)
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/decode_plan.h"

namespace fd::cuda {

namespace {

// ---------------------------------------------------------------------------------------------------
// Decode. A block owns (b, kv head, query-head chunk, split): rows [start, end) of its sequence, all the
// chunk's query heads (GT <= 8). Threads form groups of TPR lanes, one row per group at a time, each lane
// holding 8 consecutive elements of D (one 16-byte load of K and of V per row); partial dot products are
// reduced across the group with xor shuffles. Every group keeps its own online-softmax state (max, sum,
// acc slice); the block merges the groups through shared memory at the end.
constexpr int kDecThreads = 128;
using namespace decode_plan;  // the split plan (decode_plan.h)

void check_head_dim(const char* what, int D) {
  if (D < 32 || D > 256 || D % 32 != 0)
    FD_THROW(what << ": head_dim " << D << " is not supported (a multiple of 32 from 32 to 256)");
}

void check_heads(const char* what, int Hq, int Hkv) {
  if (Hq <= 0 || Hkv <= 0 || Hq % Hkv != 0)
    FD_THROW(what << ": num_heads " << Hq << " must be a positive multiple of num_kv_heads " << Hkv);
}

struct DecodeArgs {
  const float* q;
  const __half* k;
  const __half* v;
  const int32_t* slots;
  const int32_t* lens;
  int64_t max_ctx;
  int Hq, Hkv, G, HC;  // HC: query-head chunks per kv head (ceil(G / GT))
  int C;               // preferred chunk
  float qscale;        // 1/sqrt(D) * log2(e): scores in the exp2 domain
  float* out;
  void* out_act;  // non-null: the output as 16-bit (bf16 when act_bf16, else fp16) instead of out
  bool act_bf16;
  float* ws_acc;  // [B, Hq, S, D]
  float* ws_ml;   // [B, Hq, S, 2]: max (log2 domain), sum
  const int32_t* block_tables;  // paged layout: [B, max_blocks] (Paged kernels only)
  int block_size;
  int64_t max_blocks;
};

__device__ __forceinline__ int seq_len(const int32_t* lens, int b, int64_t max_ctx) {
#ifdef FD_FAULT_CUDA_DECODE_SKIPS_LAST_KV  // planted fault: the length taken as the last position's index, so the
  const int64_t n = int64_t(lens[b]) - 1;   // newest K/V row (the one appended this step) is never attended
#else
  const int64_t n = lens[b];
#endif
  return int(n < 0 ? 0 : n > max_ctx ? max_ctx : n);
}
// Output element i: fp32 into out, or rounded to 16 bits into out_act.
__device__ __forceinline__ void store_out(float* out, void* out_act, bool bf16, int64_t i, float x) {
  if (!out_act) out[i] = x;
  else if (bf16) static_cast<__nv_bfloat16*>(out_act)[i] = __float2bfloat16_rn(x);
  else static_cast<__half*>(out_act)[i] = __float2half_rn(x);
}

// Eight fp16 (one 16-byte load) to fp32; bit extraction instead of a type-punned pointer.
__device__ __forceinline__ void h8_to_f32(const uint4& u, float (&f)[8]) {
  const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __half2float(__ushort_as_half((unsigned short)(w[i] & 0xFFFFu)));
    f[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(w[i] >> 16)));
  }
}

// Paged: rows are found through the block table (one lookup per row); the contiguous instantiation is
// the code as it was, unchanged.
template <int D, int GT, bool Paged>
__global__ void __launch_bounds__(kDecThreads) decode_split_kernel(const DecodeArgs a) {
  constexpr int TPR = D <= 32 ? 4 : D <= 64 ? 8 : D <= 128 ? 16 : 32;  // lanes per row (power of two)
  constexpr int NG = kDecThreads / TPR;                                  // row groups per block
  constexpr int R = GT >= 8 ? 2 : 4;                                     // rows per group per step
  __shared__ __align__(16) float sm_acc[NG][GT][D];
  __shared__ float sm_m[NG][GT], sm_l[NG][GT], sm_w[NG][GT], sm_M[GT], sm_L[GT];

  const int b = blockIdx.z, sp = blockIdx.y, S = gridDim.y;
  const int kvh = blockIdx.x / a.HC, hc = blockIdx.x % a.HC;
  const int qh0 = kvh * a.G + hc * GT;
  const int ng = min(GT, a.G - hc * GT);  // query heads of this block
  const int len = seq_len(a.lens, b, a.max_ctx);
  const int chunk = seq_chunk(len, S, a.C);
  const int nsplit = (len + chunk - 1) / chunk;
  const int64_t start64 = int64_t(sp) * chunk;
  const int64_t head_row = int64_t(b) * a.Hq + qh0;  // (b, first query head)
  if (start64 >= len) {
    if (len == 0 && sp == 0)
      for (int i = threadIdx.x; i < ng * D; i += kDecThreads) store_out(a.out, a.out_act, a.act_bf16, head_row * D + i, 0.0f);
    return;
  }
  const int start = int(start64), end = int(start64 + chunk < len ? start64 + chunk : len);

  const int tid = threadIdx.x, grp = tid / TPR, lane = tid % TPR;
  const bool active = lane * 8 < D;  // D = 96, 160, 192, 224: the top lanes of a group idle
  const int64_t rs = int64_t(a.Hkv) * D;  // elements between consecutive positions
  const int64_t base_off = Paged ? int64_t(kvh) * D + lane * 8 : (int64_t(a.slots[b]) * a.max_ctx * a.Hkv + kvh) * D + lane * 8;
  const __half* kp = a.k + base_off;
  const __half* vp = a.v + base_off;
  const int32_t* table = Paged ? a.block_tables + int64_t(b) * a.max_blocks : nullptr;

  float qv[GT][8], acc[GT][8], m[GT], l[GT];
#pragma unroll
  for (int j = 0; j < GT; ++j) {
    m[j] = -INFINITY;
    l[j] = 0.0f;
    float4 x0 = make_float4(0.f, 0.f, 0.f, 0.f), x1 = x0;
    if (j < ng && active) {
      const float4* qp = reinterpret_cast<const float4*>(a.q + (head_row + j) * D + lane * 8);
      x0 = qp[0];
      x1 = qp[1];
    }
    qv[j][0] = x0.x * a.qscale; qv[j][1] = x0.y * a.qscale; qv[j][2] = x0.z * a.qscale; qv[j][3] = x0.w * a.qscale;
    qv[j][4] = x1.x * a.qscale; qv[j][5] = x1.y * a.qscale; qv[j][6] = x1.z * a.qscale; qv[j][7] = x1.w * a.qscale;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[j][e] = 0.0f;
  }

  // Step: group grp takes rows base + r*NG + grp (r < R); the bounds are block-uniform, so every lane
  // reaches every shuffle.
  for (int base = start; base < end; base += NG * R) {
    uint4 kr[R], vr[R];
    bool valid[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int t = base + r * NG + grp;
      valid[r] = t < end;
      kr[r] = vr[r] = make_uint4(0u, 0u, 0u, 0u);
      if (valid[r] && active) {
        int64_t row = t;
        if constexpr (Paged) row = int64_t(__ldg(table + t / a.block_size)) * a.block_size + t % a.block_size;
        kr[r] = __ldg(reinterpret_cast<const uint4*>(kp + row * rs));
        vr[r] = __ldg(reinterpret_cast<const uint4*>(vp + row * rs));
      }
    }
    float s[R][GT];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float kf[8];
      h8_to_f32(kr[r], kf);
#pragma unroll
      for (int j = 0; j < GT; ++j) {
        float d = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) d = fmaf(qv[j][e], kf[e], d);
#pragma unroll
        for (int o = TPR / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        s[r][j] = d;
      }
    }
#pragma unroll
    for (int j = 0; j < GT; ++j) {
      float mx = m[j];
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (valid[r]) mx = fmaxf(mx, s[r][j]);
      const float corr = mx == m[j] ? 1.0f : exp2f(m[j] - mx);  // also 1 while both are -inf
      float psum = 0.0f;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        s[r][j] = valid[r] ? exp2f(s[r][j] - mx) : 0.0f;
        psum += s[r][j];
      }
      l[j] = l[j] * corr + psum;
      m[j] = mx;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[j][e] *= corr;
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float vf[8];
      h8_to_f32(vr[r], vf);
#pragma unroll
      for (int j = 0; j < GT; ++j)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[j][e] = fmaf(s[r][j], vf[e], acc[j][e]);
    }
  }

  // Merge the groups: M = max m_g, w_g = 2^(m_g - M), L = sum w_g l_g, acc = sum w_g acc_g.
  if (active)
#pragma unroll
    for (int j = 0; j < GT; ++j) {
      float4* dst = reinterpret_cast<float4*>(&sm_acc[grp][j][lane * 8]);
      dst[0] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
      dst[1] = make_float4(acc[j][4], acc[j][5], acc[j][6], acc[j][7]);
    }
  if (lane == 0)
#pragma unroll
    for (int j = 0; j < GT; ++j) {
      sm_m[grp][j] = m[j];
      sm_l[grp][j] = l[j];
    }
  __syncthreads();
  if (tid < GT) {
    float M = -INFINITY;
    for (int g = 0; g < NG; ++g) M = fmaxf(M, sm_m[g][tid]);
    float L = 0.0f;
    for (int g = 0; g < NG; ++g) {
      const float w = sm_m[g][tid] == -INFINITY ? 0.0f : exp2f(sm_m[g][tid] - M);
      sm_w[g][tid] = w;
      L += w * sm_l[g][tid];
    }
    sm_M[tid] = M;
    sm_L[tid] = L;
  }
  __syncthreads();
  for (int i = tid; i < ng * D; i += kDecThreads) {
    const int j = i / D, d = i % D;
    float x = 0.0f;
#pragma unroll
    for (int g = 0; g < NG; ++g) x = fmaf(sm_w[g][j], sm_acc[g][j][d], x);
    if (nsplit == 1)
      store_out(a.out, a.out_act, a.act_bf16, (head_row + j) * D + d, x / sm_L[j]);
    else
      a.ws_acc[((head_row + j) * S + sp) * D + d] = x;
  }
  if (nsplit > 1 && tid < ng) {
    float* ml = a.ws_ml + ((head_row + tid) * S + sp) * 2;
    ml[0] = sm_M[tid];
    ml[1] = sm_L[tid];
  }
}

// One block per (q head, b) whose sequence was split: weights 2^(m_s - M) / L from one warp, then
// out[d] = sum_s w_s acc_s[d].
__global__ void decode_combine_kernel(const int32_t* lens, int64_t max_ctx, int Hq, int D, int S, int C,
                                      const float* ws_acc, const float* ws_ml, float* out, void* out_act,
                                      bool act_bf16) {
  const int b = blockIdx.y;
  const int len = seq_len(lens, b, max_ctx);
  const int chunk = seq_chunk(len, S, C);
  const int n = (len + chunk - 1) / chunk;
  if (n <= 1) return;  // the split kernel wrote the output
  const int64_t row = int64_t(b) * Hq + blockIdx.x;
  __shared__ float w[kMaxSplits];
  if (threadIdx.x < 32) {
    const int i = threadIdx.x;
    const float mi = i < n ? ws_ml[(row * S + i) * 2] : -INFINITY;
    const float li = i < n ? ws_ml[(row * S + i) * 2 + 1] : 0.0f;
    float M = mi;
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    const float e = i < n ? exp2f(mi - M) : 0.0f;
    float L = e * li;
    for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
    w[i] = e / L;
  }
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float x = 0.0f;
#pragma unroll 8  // the partials' loads in flight together (the sum's order unchanged)
    for (int i = 0; i < n; ++i) x = fmaf(w[i], ws_acc[(row * S + i) * D + d], x);
    store_out(out, out_act, act_bf16, row * D + d, x);
  }
}

using DecodeKernel = void (*)(DecodeArgs);

template <int D, bool Paged>
DecodeKernel decode_kernel_for_group(int GT) {
  switch (GT) {
    case 1: return decode_split_kernel<D, 1, Paged>;
    case 2: return decode_split_kernel<D, 2, Paged>;
    case 4: return decode_split_kernel<D, 4, Paged>;
    default: return decode_split_kernel<D, 8, Paged>;
  }
}

template <bool Paged>
DecodeKernel decode_kernel_for(int D, int GT) {
  switch (D) {
    case 32: return decode_kernel_for_group<32, Paged>(GT);
    case 64: return decode_kernel_for_group<64, Paged>(GT);
    case 96: return decode_kernel_for_group<96, Paged>(GT);
    case 128: return decode_kernel_for_group<128, Paged>(GT);
    case 160: return decode_kernel_for_group<160, Paged>(GT);
    case 192: return decode_kernel_for_group<192, Paged>(GT);
    case 224: return decode_kernel_for_group<224, Paged>(GT);
    default: return decode_kernel_for_group<256, Paged>(GT);
  }
}

// ---------------------------------------------------------------------------------------------------
// Prefill. A block owns a tile of kPM query rows of one sequence and one query head; K/V tiles of kPN rows
// are converted to fp32 in shared memory. Thread (tx = lane % 8, ty = lane / 8 + 4 * warp) owns query rows
// ty + 16a (a < 4), key columns tx + 8c (c < 4) of the score tile and output columns tx*4 + 32c (float4
// chunks, c < D/32). Online softmax per row in the exp2 domain; tiles above the diagonal are skipped and
// the query tiles with the most work are launched first.
constexpr int kPM = 64, kPN = 32, kPThreads = 128;
constexpr int kPStride = kPM + 4;  // row stride of the transposed probability tile

size_t prefill_smem_bytes(int D) {
  const size_t qs = size_t(D) + 4;
  return (size_t(kPM) * qs + size_t(kPN) * qs + size_t(kPN) * size_t(D) + size_t(kPN) * kPStride) * sizeof(float);
}

template <int D>
__global__ void __launch_bounds__(kPThreads) prefill_kernel(const float* __restrict__ q, const __half* __restrict__ k,
                                                            const __half* __restrict__ v,
                                                            const int32_t* __restrict__ starts, int Hq, int Hkv,
                                                            float qscale, float* __restrict__ out) {
  constexpr int QS = D + 4;  // padded: rows 8 apart in a warp's K reads start on distinct banks
  constexpr int DC = D / 32;
  extern __shared__ float4 prefill_smem[];
  float* Qs = reinterpret_cast<float*>(prefill_smem);  // [kPM][QS], pre-scaled by qscale
  float* Ks = Qs + kPM * QS;                            // [kPN][QS]
  float* Vs = Ks + kPN * QS;                            // [kPN][D]
  float* Ps = Vs + kPN * D;                             // [kPN][kPStride]: Ps[j][ty*4 + a] = p(row ty+16a, key j)

  const int seq = blockIdx.z, h = blockIdx.y;
  const int q0 = int(gridDim.x - 1 - blockIdx.x) * kPM;
  const int s0 = starts[seq], n = starts[seq + 1] - s0;
  if (q0 >= n) return;
  const int kvh = h / (Hq / Hkv);
  const int64_t qstride = int64_t(Hq) * D, kvstride = int64_t(Hkv) * D;
  const int tid = threadIdx.x, lane = tid & 31, tx = lane & 7, ty = (lane >> 3) + 4 * (tid >> 5);

  for (int i = tid; i < kPM * (D / 4); i += kPThreads) {
    const int r = i / (D / 4), c = (i % (D / 4)) * 4;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (q0 + r < n) {
      x = *reinterpret_cast<const float4*>(q + int64_t(s0 + q0 + r) * qstride + int64_t(h) * D + c);
      x.x *= qscale; x.y *= qscale; x.z *= qscale; x.w *= qscale;
    }
    *reinterpret_cast<float4*>(Qs + r * QS + c) = x;
  }

  float o[4][DC][4], m[4], l[4];
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    m[a] = -INFINITY;
    l[a] = 0.0f;
#pragma unroll
    for (int c = 0; c < DC; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[a][c][e] = 0.0f;
  }

  const int kend = min(n, q0 + kPM);  // keys any row of the tile sees
  const int ntiles = (kend + kPN - 1) / kPN;
  for (int kt = 0; kt < ntiles; ++kt) {
    const int k0 = kt * kPN;
    __syncthreads();  // the previous tile's Ks, Vs, Ps are consumed (and Qs is written, first time)
    for (int i = tid; i < kPN * (D / 8); i += kPThreads) {
      const int r = i / (D / 8), c = (i % (D / 8)) * 8;
      uint4 kr = make_uint4(0u, 0u, 0u, 0u), vr = kr;
      if (k0 + r < n) {
        const int64_t off = int64_t(s0 + k0 + r) * kvstride + int64_t(kvh) * D + c;
        kr = __ldg(reinterpret_cast<const uint4*>(k + off));
        vr = __ldg(reinterpret_cast<const uint4*>(v + off));
      }
      float f[8];
      h8_to_f32(kr, f);
      reinterpret_cast<float4*>(Ks + r * QS + c)[0] = make_float4(f[0], f[1], f[2], f[3]);
      reinterpret_cast<float4*>(Ks + r * QS + c)[1] = make_float4(f[4], f[5], f[6], f[7]);
      h8_to_f32(vr, f);
      reinterpret_cast<float4*>(Vs + r * D + c)[0] = make_float4(f[0], f[1], f[2], f[3]);
      reinterpret_cast<float4*>(Vs + r * D + c)[1] = make_float4(f[4], f[5], f[6], f[7]);
    }
    __syncthreads();

    float sc[4][4];
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int c = 0; c < 4; ++c) sc[a][c] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < D; d += 4) {
      float4 qa[4], kb[4];
#pragma unroll
      for (int a = 0; a < 4; ++a) qa[a] = *reinterpret_cast<const float4*>(Qs + (ty + 16 * a) * QS + d);
#pragma unroll
      for (int c = 0; c < 4; ++c) kb[c] = *reinterpret_cast<const float4*>(Ks + (tx + 8 * c) * QS + d);
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          float x = sc[a][c];
          x = fmaf(qa[a].x, kb[c].x, x);
          x = fmaf(qa[a].y, kb[c].y, x);
          x = fmaf(qa[a].z, kb[c].z, x);
          x = fmaf(qa[a].w, kb[c].w, x);
          sc[a][c] = x;
        }
    }

#pragma unroll
    for (int a = 0; a < 4; ++a) {
      const int row = q0 + ty + 16 * a;
      float mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (k0 + tx + 8 * c > row) sc[a][c] = -INFINITY;  // causal (covers keys >= n for rows < n)
        mx = fmaxf(mx, sc[a][c]);
      }
#pragma unroll
      for (int off = 4; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float mnew = fmaxf(m[a], mx);
      const float corr = mnew == m[a] ? 1.0f : exp2f(m[a] - mnew);
      float rsum = 0.0f;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        sc[a][c] = sc[a][c] == -INFINITY ? 0.0f : exp2f(sc[a][c] - mnew);
        rsum += sc[a][c];
      }
#pragma unroll
      for (int off = 4; off > 0; off >>= 1) rsum += __shfl_xor_sync(0xffffffffu, rsum, off);
      l[a] = l[a] * corr + rsum;
      m[a] = mnew;
#pragma unroll
      for (int c = 0; c < DC; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[a][c][e] *= corr;
    }
#pragma unroll
    for (int c = 0; c < 4; ++c)
      *reinterpret_cast<float4*>(Ps + (tx + 8 * c) * kPStride + ty * 4) =
          make_float4(sc[0][c], sc[1][c], sc[2][c], sc[3][c]);
    __syncthreads();

    const int jn = min(kPN, kend - k0);
    for (int j = 0; j < jn; ++j) {
      const float4 p = *reinterpret_cast<const float4*>(Ps + j * kPStride + ty * 4);
#pragma unroll
      for (int c = 0; c < DC; ++c) {
        const float4 vv = *reinterpret_cast<const float4*>(Vs + j * D + tx * 4 + 32 * c);
        const float pa[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
        for (int a = 0; a < 4; ++a) {
          o[a][c][0] = fmaf(pa[a], vv.x, o[a][c][0]);
          o[a][c][1] = fmaf(pa[a], vv.y, o[a][c][1]);
          o[a][c][2] = fmaf(pa[a], vv.z, o[a][c][2]);
          o[a][c][3] = fmaf(pa[a], vv.w, o[a][c][3]);
        }
      }
    }
  }

#pragma unroll
  for (int a = 0; a < 4; ++a) {
    const int row = q0 + ty + 16 * a;
    if (row >= n) continue;
    const float inv = 1.0f / l[a];
    float* dst = out + int64_t(s0 + row) * qstride + int64_t(h) * D + tx * 4;
#pragma unroll
    for (int c = 0; c < DC; ++c)
      *reinterpret_cast<float4*>(dst + 32 * c) =
          make_float4(o[a][c][0] * inv, o[a][c][1] * inv, o[a][c][2] * inv, o[a][c][3] * inv);
  }
}

using PrefillKernel = void (*)(const float*, const __half*, const __half*, const int32_t*, int, int, float, float*);

PrefillKernel prefill_kernel_for(int D) {
  switch (D) {
    case 32: return prefill_kernel<32>;
    case 64: return prefill_kernel<64>;
    case 96: return prefill_kernel<96>;
    case 128: return prefill_kernel<128>;
    case 160: return prefill_kernel<160>;
    case 192: return prefill_kernel<192>;
    case 224: return prefill_kernel<224>;
    default: return prefill_kernel<256>;
  }
}

float exp2_scale(int D) { return float(1.0 / std::sqrt(double(D)) * 1.4426950408889634); }

}  // namespace

size_t decode_attention_workspace_floats(int64_t B, int Hq, int D, int64_t max_ctx) {
  if (B <= 0 || Hq <= 0 || D <= 0 || max_ctx <= 0) return 0;
  return size_t(max_partials_per_head(B, Hq, max_ctx)) * size_t(Hq) * (size_t(D) + 2);
}

void decode_attention(const DecodeAttentionParams& p, cudaStream_t s) {
  const float* q = p.q;
  const __half *k_cache = p.k_cache, *v_cache = p.v_cache;
  const int32_t *slots = p.slots, *lens = p.lens;
  const bool paged = p.block_tables != nullptr;
  const int64_t B = p.B;
  if (paged && (p.block_size <= 0 || p.max_blocks <= 0))
    FD_THROW("decode_attention: paged layout with block_size " << p.block_size << " and max_blocks " << p.max_blocks
                                                               << " (both must be positive)");
  // Paged: sequences reach at most max_blocks * block_size positions (the clamp and the split plan).
  const int64_t max_ctx = paged ? p.max_blocks * int64_t(p.block_size) : p.max_ctx;
  const int Hq = p.Hq, Hkv = p.Hkv, D = p.D;
  float *out = p.out, *workspace = p.workspace;
  if (B <= 0) return;
  check_heads("decode_attention", Hq, Hkv);
  check_head_dim("decode_attention", D);
  if (max_ctx <= 0) FD_THROW("decode_attention: max_ctx " << max_ctx << " must be positive");
  if (B > 65535) FD_THROW("decode_attention: batch " << B << " exceeds 65535 sequences per call");
  const int G = Hq / Hkv, GT = group_tile(G), HC = (G + GT - 1) / GT;
  const SplitPlan plan = plan_splits(int64_t(Hkv) * HC * B, max_ctx);
  if (plan.splits > 1 && workspace == nullptr)
    FD_THROW("decode_attention: a workspace of " << decode_attention_workspace_floats(B, Hq, D, max_ctx)
                                                  << " floats is required");
  if (p.out_act && p.out_dtype != DType::F16 && p.out_dtype != DType::BF16)
    FD_THROW("decode_attention: a 16-bit output must be F16 or BF16");
  if (!p.out_act && !out) FD_THROW("decode_attention: no output");
  const bool bf16 = p.out_dtype == DType::BF16;
  const size_t acc_floats = size_t(B) * size_t(Hq) * size_t(plan.splits) * size_t(D);
  DecodeArgs a{q,         k_cache,     v_cache,     slots,       lens,   max_ctx,
               Hq,        Hkv,         G,           HC,          plan.chunk, exp2_scale(D),
               out,       p.out_act,   bf16,        workspace,   workspace ? workspace + acc_floats : nullptr,
               p.block_tables, p.block_size, p.max_blocks};
  const dim3 grid(unsigned(Hkv * HC), unsigned(plan.splits), unsigned(B));
  (paged ? decode_kernel_for<true>(D, GT) : decode_kernel_for<false>(D, GT))<<<grid, kDecThreads, 0, s>>>(a);
  check_launch("decode_attention");
  if (plan.splits > 1) {
    decode_combine_kernel<<<dim3(unsigned(Hq), unsigned(B)), 128, 0, s>>>(lens, max_ctx, Hq, D, plan.splits, plan.chunk,
                                                                          a.ws_acc, a.ws_ml, out, p.out_act, bf16);
    check_launch("decode_attention (combine)");
  }
}

void prefill_attention(const PrefillAttentionParams& p, cudaStream_t s) {
  const float* q = p.q;
  const __half *k = p.k, *v = p.v;
  const int32_t* starts = p.starts;
  const int64_t n_seq = p.n_seq, max_len = p.max_len;
  const int Hq = p.Hq, Hkv = p.Hkv, D = p.D;
  float* out = p.out;
  if (n_seq <= 0 || max_len <= 0) return;
  check_heads("prefill_attention", Hq, Hkv);
  check_head_dim("prefill_attention", D);
  if (Hq > 65535 || n_seq > 65535)
    FD_THROW("prefill_attention: " << Hq << " heads x " << n_seq << " sequences exceed the grid (65535 each)");
  if (max_len > (int64_t(1) << 30)) FD_THROW("prefill_attention: max_len " << max_len << " is too large");
  const PrefillKernel kern = prefill_kernel_for(D);
  const size_t smem = prefill_smem_bytes(D);
  const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e != cudaSuccess)
    FD_THROW("prefill_attention: " << smem << " bytes of shared memory refused: " << cudaGetErrorString(e));
  const dim3 grid(unsigned(ceil_div64(max_len, kPM)), unsigned(Hq), unsigned(n_seq));
  kern<<<grid, kPThreads, smem, s>>>(q, k, v, starts, Hq, Hkv, exp2_scale(D), out);
  check_launch("prefill_attention");
}

}  // namespace fd::cuda
