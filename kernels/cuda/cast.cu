// fp32 / fp16 / bf16 conversion on the GPU (see cast.h).
#include "kernels/cuda/cast.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>

#include "kernels/cuda/act16.cuh"

namespace fd::cuda {

namespace {

using namespace detail;

template <typename S, typename D>
__global__ void cast_kernel(const S* x, int64_t n, D* out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = Act<D>::from(Act<S>::to(x[i]));
}

}  // namespace

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

}  // namespace fd::cuda
