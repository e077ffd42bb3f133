// Timing GPU work for the benchmarks (CUDA builds): CUDA events around back-to-back calls.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>

#include "fastdecode/spart/cuda_model.h"  // CUDA_CHECK

namespace fd {

// Milliseconds per call of `call` (work it enqueues on `stream`): one warm-up call (cuBLAS heuristics,
// caches), then `reps` calls between two events recorded on the stream.
inline double cuda_ms_per_call(cudaStream_t stream, int64_t reps, const std::function<void()>& call) {
  call();
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  CUDA_CHECK(cudaEventRecord(e0, stream));
  for (int64_t r = 0; r < reps; ++r) call();
  CUDA_CHECK(cudaEventRecord(e1, stream));
  CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  return double(ms) / double(reps);
}

}  // namespace fd
