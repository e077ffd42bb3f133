// Seeded top-k / top-p / temperature sampling on the GPU: the same tokens as fd::sample_token (see
// kernels/cuda/sampling_model.h for the algorithm and its host model).
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "fastdecode/core/sampling.h"
#include "kernels/cuda/sampling_model.h"

namespace fd::cuda {

// out[r] = fd::sample_token(logits + r * V, V, p, request_ids[r], steps[r]) for r < n, one thread block per row.
// logits [n, V] fp32, request_ids / steps [n] and out [n]: device pointers. Greedy parameters (temperature 0 or
// top_k 1) give the first maximum, as fd::argmax. Needs no workspace and allocates nothing (graph-capturable).
// Identical to the host except where the draw or the nucleus cut lands within double rounding of a cumulative
// boundary (the sums are done in another order); deterministic run to run. Logits must not be NaN (the host's
// order is undefined for NaN too) and must be finite at the maximum.
// Throws fd::Error on the parameters sample_token rejects (and V >= 2^31 - 1, n >= 2^31), or a launch error.
void sample_rows(const float* logits, int64_t n, int64_t V, const SamplingParams& p, const uint64_t* request_ids,
                 const uint64_t* steps, int32_t* out, cudaStream_t s);

// The same with per-row parameters: row r drawn with draws[r] (device array of n sampling::RowDraw, each from
// sampling::row_draw, which checks it as sample_token does). One launch; row r's token is the one the uniform
// call above gives with draws[r]'s parameters (the same block program), so it does not depend on its
// neighbours' parameters. Allocates nothing (graph-capturable).
void sample_rows(const float* logits, int64_t n, int64_t V, const sampling::RowDraw* draws, const uint64_t* request_ids,
                 const uint64_t* steps, int32_t* out, cudaStream_t s);

// out[r] = index of the largest of logits[r, 0:V] (the first one on ties), as fd::argmax (argmax.cu).
void argmax_rows(const float* logits, int64_t n, int64_t V, int32_t* out, cudaStream_t s);

// A decode step's inputs from one upload: `in` holds five arrays of n int32, [slots | lengths | tokens | feed |
// positions] (the slots and lengths are read where they lie). tokens[i] = picks[feed[i]] when feed[i] >= 0 (the
// step before's pick, taken on the device: asynchronous stepping), else in's token; pos[i] = its position, as
// int64 (argmax.cu).
void step_inputs(const int32_t* in, int64_t n, const int32_t* picks, int32_t* tokens, int64_t* pos, cudaStream_t s);

}  // namespace fd::cuda
