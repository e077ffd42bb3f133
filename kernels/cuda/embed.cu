// Embedding kernels (see embed.h).
#include "kernels/cuda/embed.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>

#include "kernels/cuda/act16.cuh"

namespace fd::cuda {

namespace {

using namespace detail;

// One block per row. Vec: H % 8 == 0, eight elements a thread at a time (16-byte loads, all of a thread's
// loads issued before its stores, so that a row costs one memory round trip); else one at a time.
template <typename T, bool Vec>
__global__ void embed_kernel(const int32_t* tokens, const int64_t* pos, const T* __restrict__ table,
                             const T* __restrict__ pos_table, int64_t pos_offset, int64_t vocab_begin,
                             int64_t vocab_end, int64_t H, float* __restrict__ x) {
  const int64_t t = blockIdx.x, tok = tokens[t];
  const T* e = table && tok >= vocab_begin && tok < vocab_end ? table + (tok - vocab_begin) * H : nullptr;
  const T* p = pos_table ? pos_table + (pos[t] + pos_offset) * H : nullptr;
  if constexpr (Vec) {
#pragma unroll 4
    for (int64_t i = 8 * int64_t(threadIdx.x); i < H; i += 8 * int64_t(blockDim.x)) {
      float a[8] = {}, b[8] = {};
      if (e) load8(e + i, a);
      if (p) load8(p + i, b);
      float4* o = reinterpret_cast<float4*>(x + t * H + i);
      o[0] = make_float4(a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]);
      o[1] = make_float4(a[4] + b[4], a[5] + b[5], a[6] + b[6], a[7] + b[7]);
    }
  } else {
    for (int64_t i = threadIdx.x; i < H; i += blockDim.x)
      x[t * H + i] = (e ? Act<T>::to(e[i]) : 0.0f) + (p ? Act<T>::to(p[i]) : 0.0f);
  }
}

}  // namespace

void embed(const int32_t* tokens, const int64_t* pos, const void* table, const void* pos_table, DType wt,
           int64_t pos_offset, int64_t T, int64_t H, float* x, cudaStream_t s, int64_t vocab_begin,
           int64_t vocab_end) {
  FD_ACT_DISPATCH(wt, "embed", if (T > 0) {
    const auto* tb = static_cast<const A16*>(table);
    const auto* pt = static_cast<const A16*>(pos_table);
    if (H % 8 == 0)
      embed_kernel<A16, true><<<unsigned(T), kThreads, 0, s>>>(tokens, pos, tb, pt, pos_offset, vocab_begin, vocab_end, H, x);
    else
      embed_kernel<A16, false><<<unsigned(T), kThreads, 0, s>>>(tokens, pos, tb, pt, pos_offset, vocab_begin, vocab_end, H, x);
  });
  check_launch("embed");
}

}  // namespace fd::cuda
