// Normalisation kernels of the CUDA S-Part: the fp32 residual rows x[t, :] (width n, n % 4 == 0) into
// 16-bit out (fp16 or bf16 as `ot` says). When add_rows ([T, n], type ot) or add_bias ([n]) is given,
// x[t, :] += add_rows[t, :] + add_bias is stored back first: the residual branch a GEMM left in 16 bits (and its
// bias), added on the way into the next norm. out may be add_rows (every row is read before it is written).
// One block per row; statistics in fp32. Each launcher takes its stream.
#pragma once
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fastdecode/core/dtype.h"

namespace fd::cuda {

// out[t, :] = w * x[t, :] / rms(x[t, :])                  (Llama RMSNorm)
void rmsnorm(float* x, const void* add_rows, const float* add_bias, const float* w, float eps, int64_t T, int64_t n,
             void* out, DType ot, cudaStream_t s);
// out[t, :] = (x - mean) / std * w + b                    (OPT LayerNorm, biased variance, two passes)
void layernorm(float* x, const void* add_rows, const float* add_bias, const float* w, const float* b, float eps,
               int64_t T, int64_t n, void* out, DType ot, cudaStream_t s);
// x[t, i] += rows[t, i] + bias[i] (rows [T, n] of type t, or null; bias [n], or null), n % 4 == 0.
void add_rows(float* x, const void* rows, DType t, const float* bias, int64_t T, int64_t n, cudaStream_t s);

}  // namespace fd::cuda
