// Elementwise and normalisation kernels of the CUDA S-Part. Each launcher takes its stream.
// Shapes: rows T, width n; activations fp32 unless the name says f16 (the GEMM inputs). `ld` is a row
// stride in elements where a kernel works on a slice of a fused GEMM output (e.g. q inside [T, q|k|v]).
#pragma once
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace fd::cuda {

// Throws fd::Error naming `what` when the last launch failed (cudaGetLastError).
void check_launch(const char* what);

// x[t, :] = table[tokens[t], :] (+ pos_table[pos[t] + pos_offset, :] when pos_table): embeddings, fp16
// tables, fp32 out.
void embed(const int32_t* tokens, const int64_t* pos, const __half* table, const __half* pos_table, int64_t pos_offset,
           int64_t T, int64_t H, float* x, cudaStream_t s);
// out[i, :] = x[rows[i], :]
void gather_rows(const float* x, const int32_t* rows, int64_t n, int64_t H, float* out, cudaStream_t s);
// Norms with an optional residual add first: when add is given, x[t, :] += add[t, :] (+ add_bias) is
// stored back, then normalised. One block per row; statistics in fp32.
// out[t, :] = fp16(w * x[t, :] / rms(x[t, :]))            (Llama RMSNorm)
void rmsnorm_to_f16(float* x, const __half* add, const float* add_bias, const float* w, float eps, int64_t T,
                    int64_t n, __half* out, cudaStream_t s);
// out[t, :] = fp16((x - mean) / std * w + b)              (OPT LayerNorm, biased variance, two passes)
void layernorm_to_f16(float* x, const __half* add, const float* add_bias, const float* w, const float* b, float eps,
                      int64_t T, int64_t n, __half* out, cudaStream_t s);
// After the fused [q|k|v] GEMM (fp16 [T, qd + 2 kvd]): + bias (if any), RoPE on q and k (if inv_freq),
// split into contiguous q [T, qd], k, v [T, kvd], written as fp32 and/or fp16 (null outputs skipped).
void qkv_post(const __half* qkv, const float* bias, const int64_t* pos, const float* inv_freq, int64_t T, int64_t Hq,
              int64_t Hkv, int64_t D, float* q, float* k, float* v, __half* q16, __half* k16, __half* v16,
              cudaStream_t s);
// x[t, i] += y[t, i] (+ bias[i] if bias)
void add_residual(float* x, const __half* y, const float* bias, int64_t T, int64_t n, cudaStream_t s);
// out[t, i] = fp16(silu(gu[t, i]) * gu[t, n + i])  (fused gate|up GEMM output [T, 2n])
void silu_mul_to_f16(const __half* gu, int64_t T, int64_t n, __half* out, cudaStream_t s);
// out = fp16(relu(up + bias))
void relu_bias_to_f16(const __half* up, const float* bias, int64_t T, int64_t n, __half* out, cudaStream_t s);
void to_f16(const float* x, int64_t n, __half* out, cudaStream_t s);
void to_f32(const __half* x, int64_t n, float* out, cudaStream_t s);
// out[r] = index of the largest of logits[r, 0:V] (the first one on ties), as fd::argmax.
void argmax_rows(const float* logits, int64_t n, int64_t V, int32_t* out, cudaStream_t s);

}  // namespace fd::cuda
