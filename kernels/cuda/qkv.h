// After the fused [q|k|v] GEMM: + bias (if any), RoPE on q and k (if inv_freq), split into contiguous
// q [T, Hq*D], k, v [T, Hkv*D], written as fp32 and/or fp16 (null outputs skipped), the fp16 k and v either
// contiguous or straight into a KV-cache (QkvPostParams::slots). D % 8 == 0; every pointer aligned to 16 bytes
// (the 16-bit tensors are read and written 16 bytes at a time when D % 16 == 0, else 8).
#pragma once
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fastdecode/core/dtype.h"

namespace fd::cuda {

struct QkvPostParams {
  const void* qkv = nullptr;          // [T, (Hq + 2 Hkv) * D], 16-bit of type `dtype`
  DType dtype = DType::F16;
  const float* bias = nullptr;        // [(Hq + 2 Hkv) * D] or null
  const int64_t* pos = nullptr;       // [T] positions (for RoPE)
  const float* inv_freq = nullptr;    // [D / 2] RoPE inverse frequencies, or null: no RoPE (OPT)
  float rope_scale = 1.0f;            // cos and sin are multiplied by this (yarn's attention factor)
  int64_t T = 0, Hq = 0, Hkv = 0, D = 0;
  float* q = nullptr;                 // fp32 outputs, each may be null
  float* k = nullptr;
  float* v = nullptr;
  __half* q16 = nullptr;              // fp16 outputs (the wire tensors), each may be null
  __half* k16 = nullptr;
  __half* v16 = nullptr;
  // When given, k16 and v16 are KV-caches in decode_attention's contiguous layout (attention.h) and row t's k and
  // v go to cache row slots[t] * max_ctx + pos[t] (what append_kv would store from the fp32 k and v).
  const int32_t* slots = nullptr;     // [T] device
  int64_t max_ctx = 0;
};
void qkv_post(const QkvPostParams& p, cudaStream_t s);

}  // namespace fd::cuda
