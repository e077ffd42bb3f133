// Greedy sampling on the GPU: the argmax of each row (see sampling.h).
#include "kernels/cuda/sampling.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>

#include "kernels/cuda/act16.cuh"

namespace fd::cuda {

namespace {

using namespace detail;

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

}  // namespace

void argmax_rows(const float* logits, int64_t n, int64_t V, int32_t* out, cudaStream_t s) {
  if (n > 0) argmax_kernel<<<unsigned(n), kThreads, 0, s>>>(logits, V, out);
  check_launch("argmax");
}


}  // namespace fd::cuda
