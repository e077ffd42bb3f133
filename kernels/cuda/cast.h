// Type conversion on the GPU.
#pragma once
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fastdecode/core/dtype.h"

namespace fd::cuda {

// dst = src, n elements, between fp32, fp16 and bf16 (round to nearest even).
void cast(const void* src, DType st, void* dst, DType dt, int64_t n, cudaStream_t s);

}  // namespace fd::cuda
