// Same-run ceilings for the GPU kernels' benchmarks (see ceilings.h).
#include "kernels/cuda/ceilings.h"

#include <algorithm>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/cuda_check.h"

namespace fd::cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kReadBlocks = 132 * 8;   // a few waves of resident blocks on an H200 (grid-stride loop)
constexpr int kFmaBlocks = 132 * 16;
constexpr int kFmaChains = 8;          // independent FMA chains per thread (latency hidden)

__global__ void read_kernel(const uint4* p, size_t n, float* sink) {
  float acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);  // streaming: no reuse expected
    acc += __uint_as_float(v.x ^ v.y ^ v.z ^ v.w);
  }
  __shared__ float part[kThreads];
  part[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0;
    for (int i = 0; i < kThreads; ++i) s += part[i];
    sink[blockIdx.x] = s;
  }
}

__global__ void fma_kernel(int64_t iters, float* sink) {
  float a[kFmaChains];
  for (int c = 0; c < kFmaChains; ++c) a[c] = float(threadIdx.x + c) * 1e-7f;
  const float m = 0.999999f, b = 1e-7f;
  for (int64_t i = 0; i < iters; ++i)
#pragma unroll
    for (int c = 0; c < kFmaChains; ++c) a[c] = fmaf(a[c], m, b);
  float s = 0;
  for (int c = 0; c < kFmaChains; ++c) s += a[c];
  sink[blockIdx.x * size_t(blockDim.x) + threadIdx.x] = s;
}

}  // namespace

size_t read_ceiling_sink_floats() { return kReadBlocks; }
size_t fma_ceiling_sink_floats() { return size_t(kFmaBlocks) * kThreads; }

void read_ceiling(const void* p, size_t bytes, float* sink, cudaStream_t s) {
  if (bytes % 16 != 0) FD_THROW("read_ceiling: " << bytes << " bytes is not a multiple of 16");
  read_kernel<<<kReadBlocks, kThreads, 0, s>>>(static_cast<const uint4*>(p), bytes / 16, sink);
  check_launch("read_ceiling");
}

int64_t fma_ceiling(int64_t flops, float* sink, cudaStream_t s) {
  const int64_t per_iter = int64_t(kFmaBlocks) * kThreads * kFmaChains * 2;
  const int64_t iters = std::max<int64_t>(1, flops / per_iter);
  fma_kernel<<<kFmaBlocks, kThreads, 0, s>>>(iters, sink);
  check_launch("fma_ceiling");
  return iters * per_iter;
}

namespace {

__device__ __forceinline__ uint64_t mix64(uint64_t z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_uniform16_kernel(uint16_t* p, size_t n, float amplitude, uint64_t seed, bool bf16) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float u = float(mix64(seed * 0x9e3779b97f4a7c15ull + i) >> 40) * 0x1p-24f;  // [0, 1)
    const float v = amplitude * (2.0f * u - 1.0f);
    p[i] = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v)) : __half_as_ushort(__float2half_rn(v));
  }
}

}  // namespace

void fill_uniform16(void* p, size_t n, float amplitude, uint64_t seed, bool bf16, cudaStream_t s) {
  if (n == 0) return;
  const int blocks = int(std::min<size_t>((n + kThreads - 1) / kThreads, size_t(132) * 16));
  fill_uniform16_kernel<<<blocks, kThreads, 0, s>>>(static_cast<uint16_t*>(p), n, amplitude, seed, bf16);
  check_launch("fill_uniform16");
}

}  // namespace fd::cuda
