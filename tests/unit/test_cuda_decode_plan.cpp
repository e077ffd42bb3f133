// The CUDA decode attention's plan (kernels/cuda/decode_plan.h), on the host: every sequence's splits cover it,
// none empty, at most the grid's, of equal length; and the workspace a call is given holds every partial any call
// with fewer sequences and any kv-head count writes. The kernels themselves are checked on the GPU
// (tests/gpu/test_cuda_attention.cpp); this is the arithmetic they rely on, run in CI.
#include "kernels/cuda/decode_plan.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace {

namespace dp = fd::cuda::decode_plan;

// What the split kernel and the combine kernel compute from a sequence's length: its chunk and its split count.
struct Cut {
  int chunk, n;
};
Cut cut(int len, int S, int C) {
  const int chunk = dp::seq_chunk(len, S, C);
  return {chunk, (len + chunk - 1) / chunk};
}

}  // namespace

TEST(CudaDecodePlan, SplitsCoverEachSequenceInEqualShares) {
  for (const int C : {64, 128, 256, 512})
    for (int S = 1; S <= dp::kMaxSplits; ++S)
      for (int len = 0; len <= 3000; ++len) {
        const Cut c = cut(len, S, C);
        ASSERT_GE(c.chunk, 1);
        if (len == 0) {
          ASSERT_EQ(c.n, 0) << "a length of 0 has no split";
          continue;
        }
        ASSERT_LE(c.n, S) << "len " << len << " S " << S << " C " << C << ": more splits than the grid has";
        ASSERT_GE(int64_t(c.n) * c.chunk, len) << "len " << len << ": rows left out";
        const int last = len - (c.n - 1) * c.chunk;  // rows of the last split
        ASSERT_GE(last, 1) << "len " << len << " S " << S << " C " << C << ": an empty split";
        ASSERT_LT(c.chunk - last, c.n) << "len " << len << " S " << S << " C " << C << ": a short tail (" << last
                                       << " rows after " << c.n - 1 << " of " << c.chunk << ")";
        // As many splits as chunks of about C need, unless the grid caps them.
        ASSERT_EQ(c.n, std::min<int64_t>(S, dp::ceil_div64(len, C))) << "len " << len << " S " << S << " C " << C;
      }
}

// The case that made the splits balanced: 528 rows at C = 512 over 2 splits are 264 + 264, not 512 + 16.
TEST(CudaDecodePlan, NoShortTail) {
  const Cut c = cut(528, 2, 512);
  EXPECT_EQ(c.chunk, 264);
  EXPECT_EQ(c.n, 2);
}

// decode_attention_workspace_floats sizes the workspace for B_max sequences as max_partials_per_head(B_max) * Hq
// partials; a call with b <= B_max sequences and Hkv kv heads plans its splits from b * Hkv * ceil(G / GT) blocks a
// split and writes b * Hq * splits partials when it splits at all. Every such call must fit.
TEST(CudaDecodePlan, WorkspaceHoldsEveryCallItIsSizedFor) {
  for (const int Hq : {1, 4, 8, 12, 32, 64})
    for (const int64_t max_ctx : {int64_t(1), int64_t(63), int64_t(100), int64_t(1024), int64_t(4096), int64_t(32768)})
      for (const int64_t B_max : {int64_t(1), int64_t(7), int64_t(64), int64_t(300)}) {
        const int64_t cap = dp::max_partials_per_head(B_max, Hq, max_ctx);
        for (int Hkv = 1; Hkv <= Hq; ++Hkv) {
          if (Hq % Hkv != 0) continue;
          const int G = Hq / Hkv, GT = dp::group_tile(G), HC = (G + GT - 1) / GT;
          for (int64_t b = 1; b <= B_max; ++b) {
            const dp::SplitPlan p = dp::plan_splits(int64_t(Hkv) * HC * b, max_ctx);
            ASSERT_GE(p.splits, 1);
            ASSERT_LE(p.splits, dp::kMaxSplits);
            if (p.splits > 1)
              ASSERT_LE(b * p.splits, cap) << "Hq " << Hq << " Hkv " << Hkv << " b " << b << " of " << B_max
                                           << " max_ctx " << max_ctx << ": " << p.splits << " splits";
          }
        }
      }
}
