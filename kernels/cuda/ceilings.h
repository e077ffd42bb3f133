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

// Fills n 16-bit values (bf16 when `bf16`, else fp16) at p with uniform values in [-amplitude, amplitude), a
// hash of (seed, index): the same bits for the same arguments on every device. Benchmarks feed GEMMs with it,
// because a tensor-core GEMM's time depends on its operands' bits: on the H200 the gate/up GEMM of a Llama-2-7b
// layer took 110.8 us on an all-zero input and 127.0 us on a norm's output at B = 512 (ncu, same kernel,
// artifacts/stages/gemm-inputs/): a ceiling timed on zeros is not one the real layer can reach.
void fill_uniform16(void* p, size_t n, float amplitude, uint64_t seed, bool bf16, cudaStream_t s);

}  // namespace fd::cuda
