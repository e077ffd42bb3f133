// How the CUDA decode attention (attention.cu) cuts its work: query heads per block, the split plan over the
// context, each sequence's chunk, and the workspace a call may need. Plain C++ on the host (the unit tests check
// it without a GPU: tests/unit/test_cuda_decode_plan.cpp); seq_chunk is also the kernels' own (host and device).
#pragma once
#include <algorithm>
#include <cstdint>

#if defined(__CUDACC__)
#define FD_PLAN_HD __host__ __device__
#else
#define FD_PLAN_HD
#endif

namespace fd::cuda::decode_plan {

constexpr int kMinChunk = 64;            // smallest preferred chunk (a balanced split reads over half of one)
constexpr int kMaxChunk = 512;           // preferred chunk never grows past this (balance across lengths)
constexpr int kMaxSplits = 32;           // splits per sequence (one warp merges them)
constexpr int64_t kTargetBlocks = 4096;  // ~2 waves of resident blocks on an H200 (132 SMs)
constexpr int kMaxGroup = 8;             // query heads per block

struct SplitPlan {
  int chunk;   // preferred chunk C (seq_chunk gives a sequence's own)
  int splits;  // grid size in the split dimension: no sequence is cut in more
};

inline int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The largest power-of-two chunk (64..512) that still leaves kTargetBlocks blocks when the sequences fill
// max_ctx; splits = ceil(max_ctx / chunk) capped at kMaxSplits. Non-increasing in blocks_per_split, so the
// smallest blocks_per_split bounds the workspace.
inline SplitPlan plan_splits(int64_t blocks_per_split, int64_t max_ctx) {
  int64_t c = kMinChunk;
  while (c < kMaxChunk && blocks_per_split * ceil_div64(max_ctx, 2 * c) >= kTargetBlocks) c *= 2;
  const int64_t s = std::max<int64_t>(1, std::min<int64_t>(kMaxSplits, ceil_div64(max_ctx, c)));
  return {int(c), int(s)};
}

inline int group_tile(int G) {  // query heads per block: the next power of two, at most kMaxGroup
  int gt = 1;
  while (gt < G && gt < kMaxGroup) gt *= 2;
  return gt;
}

// Chunk of a sequence of length len over at most S splits of about the preferred chunk C: n = min(S, ceil(len / C))
// splits of equal length (ceil(len / n) rows; the last may be shorter by less than n), so that no split is left with
// a short tail (528 rows at C = 512 are 264 + 264, not 512 + 16). The same in the split and the combine kernel; at
// least 1 (a length of 0 gives no split). A sequence is cut in ceil(len / chunk) <= S splits.
FD_PLAN_HD inline int seq_chunk(int len, int S, int C) {
  const int c = (len + C - 1) / C, n = S < c ? S : c < 1 ? 1 : c;
  const int chunk = (len + n - 1) / n;
  return chunk < 1 ? 1 : chunk;
}

// Partials (b, q head, split) a call with at most B sequences may write, for any Hkv dividing Hq: a call
// with b sequences has b * Hkv * ceil(G / GT) >= b * ceil(Hq / 8) blocks per split and plan_splits is
// non-increasing in that, so it writes at most b * Hq * splits(b * ceil(Hq / 8)) partials. The maximum is
// taken over every b <= B because b * splits(b) is not monotone (the chunk doubles at thresholds of b).
inline int64_t max_partials_per_head(int64_t B, int Hq, int64_t max_ctx) {
  int64_t best = 0;
  for (int64_t b = 1; b <= B; ++b) {
    const SplitPlan p = plan_splits(b * ceil_div64(Hq, kMaxGroup), max_ctx);
    if (p.splits > 1) best = std::max(best, b * p.splits);
  }
  return best;
}

}  // namespace fd::cuda::decode_plan
