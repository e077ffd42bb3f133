// Normalisation kernels of the CUDA S-Part: the fp32 residual rows x[t, :] (width n, n % 4 == 0) into
// 16-bit out (fp16 or bf16 as `ot` says). When add_bias is given, x[t, :] += add_bias is stored back
// first (OPT's o-projection bias: the GEMM added its product into x already). When rows is given (device
// int32 [T]), output row t normalises x[rows[t], :] instead (the rows the LM head reads; no add_bias then).
// One block per row, held in registers (n <= 16384); statistics in fp32. Each launcher takes its stream.
#pragma once
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fastdecode/core/dtype.h"

namespace fd::cuda {

// out[t, :] = w * x[t, :] / rms(x[t, :])                  (Llama RMSNorm)
void rmsnorm(float* x, const float* add_bias, const float* w, float eps, int64_t T, int64_t n, void* out, DType ot,
             cudaStream_t s, const int32_t* rows = nullptr);
// out[t, :] = (x - mean) / std * w + b                    (OPT LayerNorm, biased variance: mean, then variance)
// store: x[t, :] = that row in fp32 too (post-LayerNorm OPT, whose residual stream is the normalized row; not with rows)
void layernorm(float* x, const float* add_bias, const float* w, const float* b, float eps, int64_t T, int64_t n,
               void* out, DType ot, cudaStream_t s, const int32_t* rows = nullptr, bool store = false);
// out[t, :] = x[rows[t] (rows null: t), :] as 16-bit, no normalisation (post-LayerNorm OPT has no final norm)
void rows_to_act(const float* x, const int32_t* rows, int64_t T, int64_t n, void* out, DType ot, cudaStream_t s);
// x[t, i] += bias[i]
void add_bias_rows(float* x, const float* bias, int64_t T, int64_t n, cudaStream_t s);

}  // namespace fd::cuda
