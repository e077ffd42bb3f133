// Embedding kernels (see embed.h).
#include "kernels/cuda/embed.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>

#include "kernels/cuda/act16.cuh"

namespace fd::cuda {

namespace {

using namespace detail;

template <typename T>
__global__ void embed_kernel(const int32_t* tokens, const int64_t* pos, const T* table, const T* pos_table,
                             int64_t pos_offset, int64_t vocab_begin, int64_t vocab_end, int64_t H, float* x) {
  const int64_t t = blockIdx.x, tok = tokens[t];
  const T* e = tok >= vocab_begin && tok < vocab_end ? table + (tok - vocab_begin) * H : nullptr;
  const T* p = pos_table ? pos_table + (pos[t] + pos_offset) * H : nullptr;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x)
    x[t * H + i] = (e ? Act<T>::to(e[i]) : 0.0f) + (p ? Act<T>::to(p[i]) : 0.0f);
}

__global__ void gather_rows_kernel(const float* x, const int32_t* rows, int64_t H, float* out) {
  const float* src = x + int64_t(rows[blockIdx.x]) * H;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) out[blockIdx.x * H + i] = src[i];
}

}  // namespace

void embed(const int32_t* tokens, const int64_t* pos, const void* table, const void* pos_table, DType wt,
           int64_t pos_offset, int64_t T, int64_t H, float* x, cudaStream_t s, int64_t vocab_begin,
           int64_t vocab_end) {
  FD_ACT_DISPATCH(wt, "embed",
                  if (T > 0) embed_kernel<A16><<<unsigned(T), kThreads, 0, s>>>(
                      tokens, pos, static_cast<const A16*>(table), static_cast<const A16*>(pos_table), pos_offset,
                      vocab_begin, vocab_end, H, x));
  check_launch("embed");
}
void gather_rows(const float* x, const int32_t* rows, int64_t n, int64_t H, float* out, cudaStream_t s) {
  if (n > 0) gather_rows_kernel<<<unsigned(n), kThreads, 0, s>>>(x, rows, H, out);
  check_launch("gather_rows");
}

}  // namespace fd::cuda
