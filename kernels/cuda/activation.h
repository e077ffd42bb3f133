// MLP activation kernels of the CUDA S-Part, on 16-bit rows (fp16 or bf16 as `t` says). Each launcher
// takes its stream.
#pragma once
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fastdecode/core/dtype.h"

namespace fd::cuda {

// out[t, i] = silu(gu[t, i] + bias[i]) * (gu[t, n + i] + bias[n + i])  (fused gate|up GEMM output [T, 2n]; in and
// out of type t; bias: fp32 [gate|up] of 2n, Llama's mlp_bias, or null for none)
void silu_mul(const void* gu, DType t, int64_t T, int64_t n, void* out, cudaStream_t s, const float* bias = nullptr);
// out = relu(up + bias)  (in and out of type t)
void relu_bias(const void* up, DType t, const float* bias, int64_t T, int64_t n, void* out, cudaStream_t s);

}  // namespace fd::cuda
