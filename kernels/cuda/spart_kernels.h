// Elementwise and normalisation kernels of the CUDA S-Part. Each launcher takes its stream.
// Shapes: rows T, width n. The residual stream x is fp32; the GEMM inputs and outputs ("act") are 16-bit,
// fp16 or bf16 as the launcher's `DType` says (void pointers: the model's activation type is a run-time
// choice); the wire tensors q16/k16/v16 are always fp16.
#pragma once
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fastdecode/core/dtype.h"

namespace fd::cuda {

// Throws fd::Error naming `what` when the last launch failed (cudaGetLastError).
void check_launch(const char* what);
// Throws unless t is F16 or BF16 (the 16-bit activation and weight types).
void check_act_dtype(DType t, const char* what);

// x[t, :] = table[tokens[t], :] (+ pos_table[pos[t] + pos_offset, :] when pos_table): embeddings from
// 16-bit tables (type wt), fp32 out.
void embed(const int32_t* tokens, const int64_t* pos, const void* table, const void* pos_table, DType wt,
           int64_t pos_offset, int64_t T, int64_t H, float* x, cudaStream_t s);
// out[i, :] = x[rows[i], :]
void gather_rows(const float* x, const int32_t* rows, int64_t n, int64_t H, float* out, cudaStream_t s);
// Norms of the fp32 residual rows x[t, :] into 16-bit out (type ot). When add_bias is given,
// x[t, :] += add_bias is stored back first (OPT's o-projection bias: the GEMM added its product into x
// already). One block per row; statistics in fp32.
// out[t, :] = w * x[t, :] / rms(x[t, :])                  (Llama RMSNorm)
void rmsnorm(float* x, const float* add_bias, const float* w, float eps, int64_t T, int64_t n, void* out, DType ot,
             cudaStream_t s);
// out[t, :] = (x - mean) / std * w + b                    (OPT LayerNorm, biased variance, two passes)
void layernorm(float* x, const float* add_bias, const float* w, const float* b, float eps, int64_t T, int64_t n,
               void* out, DType ot, cudaStream_t s);
// After the fused [q|k|v] GEMM (16-bit [T, qd + 2 kvd] of type t): + bias (if any), RoPE on q and k (if
// inv_freq), split into contiguous q [T, qd], k, v [T, kvd], written as fp32 and/or fp16 (null outputs
// skipped).
void qkv_post(const void* qkv, DType t, const float* bias, const int64_t* pos, const float* inv_freq, int64_t T,
              int64_t Hq, int64_t Hkv, int64_t D, float* q, float* k, float* v, __half* q16, __half* k16,
              __half* v16, cudaStream_t s);
// x[t, i] += bias[i]
void add_bias_rows(float* x, const float* bias, int64_t T, int64_t n, cudaStream_t s);
// out[t, i] = silu(gu[t, i]) * gu[t, n + i]  (fused gate|up GEMM output [T, 2n]; in and out of type t)
void silu_mul(const void* gu, DType t, int64_t T, int64_t n, void* out, cudaStream_t s);
// out = relu(up + bias)  (in and out of type t)
void relu_bias(const void* up, DType t, const float* bias, int64_t T, int64_t n, void* out, cudaStream_t s);
// dst = src, n elements, between fp32, fp16 and bf16 (round to nearest even).
void cast(const void* src, DType st, void* dst, DType dt, int64_t n, cudaStream_t s);
// out[r] = index of the largest of logits[r, 0:V] (the first one on ties), as fd::argmax.
void argmax_rows(const float* logits, int64_t n, int64_t V, int32_t* out, cudaStream_t s);

}  // namespace fd::cuda
