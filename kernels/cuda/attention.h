// CUDA attention for the GPU-only baseline and GPU prefill: fp16 KV, fp32 math (scores, softmax and
// accumulation in fp32). Each launcher takes its stream, allocates nothing and throws fd::Error on a
// bad shape or a launch error. All pointers are device pointers, 16-byte aligned (cudaMalloc'd).
// Head dimension D: a multiple of 32 from 32 to 256 (64 and 128 are the tuned cases).
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fastdecode/core/dtype.h"

namespace fd::cuda {

// Decode attention: B sequences, one query token each, over an fp16 KV-cache in GPU memory.
// q [B, Hq*D] fp32. k_cache / v_cache fp16, element (slot s, position t, kv head h, d) at
// ((s * max_ctx + t) * Hkv + h) * D + d  (int64 indexing: caches exceed 2^32 elements).
// slots[B], lens[B] int32 device arrays: sequence b attends to positions 0..lens[b]-1 of slot slots[b]
// (its new token's K/V already stored; lens are clamped to [0, max_ctx], a length of 0 gives zeros).
// GQA: query head h uses kv head h / (Hq / Hkv). scale 1/sqrt(D), softmax in fp32. out [B, Hq*D] fp32.
// workspace: device floats of decode_attention_workspace_floats(B_max, Hq, D, max_ctx) (split-K partials),
// enough for any call with B <= B_max sequences and any Hkv; it may be null when that size is 0.
// B <= 65535.
//
// Paged layout (vLLM's PagedAttention; block_tables non-null): the caches are [num_blocks * block_size,
// Hkv, D] and position t of sequence b is physical row block_tables[b * max_blocks + t / block_size] *
// block_size + t % block_size; slots and max_ctx are ignored, lens are clamped to [0, max_blocks *
// block_size], and the workspace is sized with max_ctx = max_blocks * block_size. block_tables: [B,
// max_blocks] int32 device (entries past a sequence's length are not read).
//
// Flash-decoding: grid (kv head x query-head chunk, split, b); a block reads a contiguous chunk of its
// sequence's K/V rows once for all (up to 8) query heads of its group, 16-byte loads, online softmax;
// a sequence split in several chunks leaves partials (max, sum, acc[D]) that a combine kernel merges.
struct DecodeAttentionParams {
  const float* q = nullptr;          // [B, Hq*D] fp32
  const __half* k_cache = nullptr;   // fp16, see the layout above
  const __half* v_cache = nullptr;
  const int32_t* slots = nullptr;    // [B] device
  const int32_t* lens = nullptr;     // [B] device
  int64_t B = 0, max_ctx = 0;
  int Hq = 0, Hkv = 0, D = 0;
  float* out = nullptr;              // [B, Hq*D] fp32
  float* workspace = nullptr;        // decode_attention_workspace_floats(...) floats, or null when that is 0
  const int32_t* block_tables = nullptr;  // [B, max_blocks] device: the paged layout; null = contiguous slots
  int block_size = 0;                // tokens per block (paged layout)
  int64_t max_blocks = 0;            // block-table row stride (paged layout)
  // When set, the output goes here instead of `out`, rounded to the 16-bit type out_dtype (F16 or BF16) as
  // cuda::cast would round out: the o-projection's input without a cast kernel between (out may then be null).
  void* out_act = nullptr;
  DType out_dtype = DType::F16;
};
void decode_attention(const DecodeAttentionParams& p, cudaStream_t s);
size_t decode_attention_workspace_floats(int64_t B_max, int Hq, int D, int64_t max_ctx);

// Causal prefill attention over packed sequences: rows starts[i] .. starts[i+1]-1 (starts: device int32,
// n_seq+1 entries) are sequence i's tokens at positions 0..n_i-1; row t attends to rows starts[i]..t.
// q [T, Hq*D] fp32, k, v [T, Hkv*D] fp16, out [T, Hq*D] fp32. max_len = max n_i (host value, for the grid).
// Hq <= 65535, n_seq <= 65535.
struct PrefillAttentionParams {
  const float* q = nullptr;        // [T, Hq*D] fp32
  const __half* k = nullptr;       // [T, Hkv*D] fp16
  const __half* v = nullptr;
  const int32_t* starts = nullptr; // [n_seq + 1] device
  int64_t n_seq = 0, max_len = 0;  // max_len: the longest sequence (host value, for the grid)
  int Hq = 0, Hkv = 0, D = 0;
  float* out = nullptr;            // [T, Hq*D] fp32
};
void prefill_attention(const PrefillAttentionParams& p, cudaStream_t s);

// Stores rows of K and V (fp32 [T, Hkv*D]) into the caches as fp16 (round to nearest even) at
// (slots[t], pos[t]), the layout of decode_attention: row offset (slots[t] * max_ctx + pos[t]) * kv_dim.
struct AppendKvParams {
  const float* k = nullptr;        // [T, kv_dim] fp32
  const float* v = nullptr;
  const int32_t* slots = nullptr;  // [T] device
  const int32_t* pos = nullptr;    // [T] device
  int64_t T = 0, max_ctx = 0;
  int kv_dim = 0;
  __half* k_cache = nullptr;
  __half* v_cache = nullptr;
};
void append_kv(const AppendKvParams& p, cudaStream_t s);

}  // namespace fd::cuda
