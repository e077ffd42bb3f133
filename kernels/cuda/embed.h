// Embedding kernels of the CUDA S-Part. Each launcher takes its stream; tables are 16-bit (fp16 or bf16,
// the run-time DType), the residual stream fp32.
#pragma once
#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fastdecode/core/dtype.h"

namespace fd::cuda {

// x[t, :] = table[tokens[t], :] (+ pos_table[pos[t] + pos_offset, :] when pos_table): embeddings from
// 16-bit tables (type wt), fp32 out. A tensor rank's slice of the vocabulary: `table` holds the rows of ids
// [vocab_begin, vocab_end) and a token outside it embeds as 0 (the ranks' sum is then the whole embedding).
// table null: the positions alone (OPT's projected embeddings add project_in(embedding) after).
void embed(const int32_t* tokens, const int64_t* pos, const void* table, const void* pos_table, DType wt,
           int64_t pos_offset, int64_t T, int64_t H, float* x, cudaStream_t s, int64_t vocab_begin = 0,
           int64_t vocab_end = INT64_MAX);

}  // namespace fd::cuda
