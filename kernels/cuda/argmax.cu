// Greedy sampling on the GPU: the argmax of each row (see sampling.h).
#include "kernels/cuda/sampling.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/act16.cuh"

namespace fd::cuda {

namespace {

using namespace detail;

constexpr int kArgmaxThreads = 1024;
constexpr int kBatch = 4;  // loads a thread issues before it compares (independent: latency overlaps)

// (v2, i2) beats (v1, i1): the larger value, the lower index on equal values (NaN beats nothing).
__device__ __forceinline__ bool beats(float v2, int32_t i2, float v1, int32_t i1) {
  return v2 > v1 || (v2 == v1 && i2 < i1);
}

// Lane 0 ends with the warp's best (value, index) by `beats`.
__device__ __forceinline__ void warp_best(float& best, int32_t& bi) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float v2 = __shfl_down_sync(0xffffffffu, best, o);
    const int32_t i2 = __shfl_down_sync(0xffffffffu, bi, o);
    if (beats(v2, i2, best, bi)) best = v2, bi = i2;
  }
}

// One block of 1024 threads per row. Every thread starts from (row[0], 0), as fd::argmax does, then visits its
// elements in increasing index order, kBatch loads (float4 when V % 4 == 0: the rows are then 16-byte aligned) in
// flight before it compares them, taking a strictly larger one; then a warp-shuffle and a shared-memory
// reduction with `beats`. The result is fd::argmax's exactly: the first maximum, NaNs ignored unless row[0] is one
// (then 0, as nothing compares larger than it). One row is read at close to the SM's share of
// HBM bandwidth: latency, not the compare chain, bounds it (the one-thread-per-256-elements version it replaces
// took 33 us for 64 x 32000, at 0.25 TB/s).
template <bool kVec>
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const float* logits, int64_t V, int32_t* out) {
  const float* row = logits + int64_t(blockIdx.x) * V;
  float best = __ldg(row);
  int32_t bi = 0;
  const auto take = [&](float v, int32_t i) {
    if (v > best) best = v, bi = i;
  };
  using T = std::conditional_t<kVec, float4, float>;  // what one load reads: 4 elements or 1
  const T* r = reinterpret_cast<const T*>(row);
  const int64_t n = kVec ? V / 4 : V, step = int64_t(kArgmaxThreads) * kBatch;
  for (int64_t base = threadIdx.x; base < n; base += step) {
    T x[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int64_t j = base + int64_t(k) * kArgmaxThreads;
      if (j < n) x[k] = __ldg(r + j);
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int64_t j = base + int64_t(k) * kArgmaxThreads;
      if (j >= n) continue;
      if constexpr (kVec) {
        const int32_t i = int32_t(4 * j);
        take(x[k].x, i), take(x[k].y, i + 1), take(x[k].z, i + 2), take(x[k].w, i + 3);
      } else {
        take(x[k], int32_t(j));
      }
    }
  }
  warp_best(best, bi);
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ int32_t si[kArgmaxThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) sv[warp] = best, si[warp] = bi;
  __syncthreads();
  if (warp == 0) {
    best = sv[lane], bi = si[lane];  // kArgmaxThreads / 32 == 32 warps: one per lane
    warp_best(best, bi);
    if (lane == 0) out[blockIdx.x] = bi;
  }
}

__global__ void step_inputs_kernel(const int32_t* in, int64_t n, const int32_t* picks, int32_t* tokens, int64_t* pos) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t feed = in[3 * n + i];
  tokens[i] = feed >= 0 ? picks[feed] : in[2 * n + i];
  pos[i] = in[4 * n + i];
}

}  // namespace

void step_inputs(const int32_t* in, int64_t n, const int32_t* picks, int32_t* tokens, int64_t* pos, cudaStream_t s) {
  if (n <= 0) return;
  step_inputs_kernel<<<unsigned((n + 255) / 256), 256, 0, s>>>(in, n, picks, tokens, pos);
  check_launch("step_inputs");
}

void argmax_rows(const float* logits, int64_t n, int64_t V, int32_t* out, cudaStream_t s) {
  static_assert(kArgmaxThreads == 32 * 32, "the second reduction gives one warp's partial to each lane");
  if (n > 0 && V % 4 == 0) argmax_kernel<true><<<unsigned(n), kArgmaxThreads, 0, s>>>(logits, V, out);
  else if (n > 0) argmax_kernel<false><<<unsigned(n), kArgmaxThreads, 0, s>>>(logits, V, out);
  check_launch("argmax");
}


}  // namespace fd::cuda
