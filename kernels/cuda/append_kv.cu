// The KV append of the CUDA attention (see attention.h): fp32 rows of K and V into the fp16 caches.
#include "kernels/cuda/attention.h"

#include "kernels/cuda/cuda_check.h"

namespace fd::cuda {

namespace {

__global__ void append_kv_kernel(const float* k, const float* v, const int32_t* slots, const int32_t* pos, int64_t total,
                                 int64_t max_ctx, int kv_dim, __half* kc, __half* vc) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= total) return;
  const int64_t t = i / kv_dim, e = i - t * kv_dim;
  const int64_t dst = (int64_t(slots[t]) * max_ctx + pos[t]) * kv_dim + e;
  kc[dst] = __float2half_rn(k[i]);
  vc[dst] = __float2half_rn(v[i]);
}

}  // namespace

void append_kv(const AppendKvParams& p, cudaStream_t s) {
  const int64_t total = p.T * int64_t(p.kv_dim);
  if (total <= 0) return;
  constexpr int kThreads = 256;
  append_kv_kernel<<<unsigned((total + kThreads - 1) / kThreads), kThreads, 0, s>>>(
      p.k, p.v, p.slots, p.pos, total, p.max_ctx, p.kv_dim, p.k_cache, p.v_cache);
  check_launch("append_kv");
}

}  // namespace fd::cuda
