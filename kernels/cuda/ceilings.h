// Same-run ceilings for the GPU kernels' benchmarks (fd-kernel-bench): what the device achieves on the
// simplest kernel bound by the same resource.
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace fd::cuda {

// Reads `bytes` (a multiple of 16, 16-byte aligned) once with 16-byte loads and writes one float per
// block into sink (device, >= read_ceiling_sink_floats()): the device's achievable read bandwidth.
void read_ceiling(const void* p, size_t bytes, float* sink, cudaStream_t s);
size_t read_ceiling_sink_floats();
// fp32 FMAs on registers, about `flops` floating-point operations in all (2 per FMA), writing one float
// per thread into sink (>= fma_ceiling_sink_floats()): the device's achievable fp32 CUDA-core rate.
// Returns the operations it launched (flops rounded to whole iterations, at least one).
int64_t fma_ceiling(int64_t flops, float* sink, cudaStream_t s);
size_t fma_ceiling_sink_floats();

}  // namespace fd::cuda
