// The GPU sampler's algorithm (kernels/cuda/sampling_model.h), run by its sequential host model, against
// fd::sample_token on thousands of random rows with many exact ties: tiny and large vocabularies, every kind of
// top-k cut (none, 1, 2, 40, V-1, V, V+5), top-p 0.05 / 0.5 / 0.9 / 1, temperatures 0.3 .. 2, greedy.
// Tokens must be identical; a difference is accepted only where the host's own cumulative probabilities put
// the draw (or the nucleus cut) within 1e-12 of a boundary, and it is printed.
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "fastdecode/core/error.h"
#include "fastdecode/core/splitmix64.h"
#include "fastdecode/core/sampling.h"
#include "kernels/cuda/sampling_model.h"
#include "sampling_cases.h"

using namespace fd;
using fd::cuda::sample_row_model;
namespace sm = fd::cuda::sampling;

namespace {

// Bit-exact order of the host's comparisons: a > b <=> key(a) > key(b), a == b <=> same key (non-NaN).
TEST(SamplingModel, KeysOrderLikeFloats) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, inf, -inf, 1e-45f, -1e-45f, 1.17549435e-38f, -3.4e38f, 3.4e38f,
                          0.5f, -0.5f, 2.0f, 1.0000001f, 0.99999994f};
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd(0.0f, 100.0f);
  for (int i = 0; i < 2000; ++i) v.push_back(nd(rng));
  for (float a : v)
    for (size_t j = 0; j < v.size(); j += 7) {
      const float b = v[j];
      ASSERT_EQ(a > b, sm::key_of(a) > sm::key_of(b)) << a << " vs " << b;
      ASSERT_EQ(a == b, sm::key_of(a) == sm::key_of(b)) << a << " vs " << b;
    }
  for (float a : v) {
    const float back = sm::logit_of_key(sm::key_of(a));
    EXPECT_TRUE(back == a) << a;  // -0 comes back as +0, which compares equal
  }
}

// splitmix64 moved to a host-device header: same numbers as before (golden values of the reference generator).
TEST(SamplingModel, Splitmix64Unchanged) {
  static_assert(splitmix64(0) == 0xe220a8397b1dcdafull);
  EXPECT_EQ(splitmix64(1234567), 0x599ed017fb08fc85ull);
}

int64_t rows_for(int64_t V) {
  if (V >= 100000) return 1;
  if (V >= 30000) return 3;
  if (V >= 4000) return 8;
  return 16;
}

TEST(SamplingModel, SameTokensAsHostSampler) {
  const std::vector<int64_t> vocabs = {1, 2, 5, 17, 64, 300, 2048, 2049, 5000, 32000, 128256};
  const auto batches = test::sampling_batches(vocabs, rows_for, 20261201);
  int64_t rows = 0, same = 0, accepted = 0, greedy = 0;
  test::TieCoverage cov;
  for (const auto& b : batches) {
    for (int64_t r = 0; r < b.rows(); ++r) {
      const float* row = b.row(r);
      const int32_t host = sample_token(row, b.V, b.p, b.request_ids[size_t(r)], b.steps[size_t(r)]);
      const int32_t model = sample_row_model(row, b.V, b.p, b.request_ids[size_t(r)], b.steps[size_t(r)]);
      ++rows;
      if (b.p.greedy()) {
        ++greedy;
        ASSERT_EQ(model, host) << "greedy, V " << b.V << ", row kind " << test::row_kind_name(b.kinds[size_t(r)]);
        ++same;
        continue;
      }
      const test::HostTrace t = test::host_trace(row, b.V, b.p, b.request_ids[size_t(r)], b.steps[size_t(r)]);
      ASSERT_EQ(t.token, host) << "the test's replay of sample_token drifted from it";
      cov.add(row, b.V, t);
      if (model == host) {
        ++same;
        continue;
      }
      const auto why = test::explain_difference(t, b.p, model);
      ASSERT_TRUE(why.has_value()) << "model token " << model << " != host token " << host << ": V " << b.V
                                   << ", T " << b.p.temperature << ", top_k " << b.p.top_k << ", top_p "
                                   << b.p.top_p << ", row kind " << test::row_kind_name(b.kinds[size_t(r)]);
      ++accepted;
      std::printf("[accepted] V %lld T %g top_k %lld top_p %g kind %s: host %d model %d: %s\n", (long long)b.V,
                  b.p.temperature, (long long)b.p.top_k, b.p.top_p, test::row_kind_name(b.kinds[size_t(r)]), host,
                  model, why->c_str());
    }
  }
  std::printf("[sampling model] %lld rows (%lld greedy): %lld identical, %lld accepted on a boundary; "
              "top-k cut inside a run of equal logits %lld, nucleus cut inside a run %lld, drawn token in a run %lld\n",
              (long long)rows, (long long)greedy, (long long)same, (long long)accepted, (long long)cov.topk_splits_run,
              (long long)cov.nucleus_splits_run, (long long)cov.token_in_run);
  EXPECT_GT(rows, 3000);
  EXPECT_LT(accepted, rows / 100);  // boundary hits need exact ties (e.g. all-equal rows, top_p * V integral)
  EXPECT_GT(cov.topk_splits_run, 100);
  EXPECT_GT(cov.nucleus_splits_run, 100);
  EXPECT_GT(cov.token_in_run, 1000);
}

// Hand-made rows where the host's sums are exact, so equality needs no tolerance: runs of equal logits cut by
// top-p exactly at 1/2, ties at the top-k boundary, -0 against +0.
TEST(SamplingModel, ExactBoundaries) {
  SamplingParams p;
  p.temperature = 1.0;
  p.top_p = 0.5;
  const std::vector<float> four_equal = {3.0f, 3.0f, 3.0f, 3.0f};  // nucleus: exactly the first two
  for (uint64_t step = 0; step < 500; ++step) {
    const int32_t host = sample_token(four_equal.data(), 4, p, 7, step);
    ASSERT_TRUE(host == 0 || host == 1);
    ASSERT_EQ(sample_row_model(four_equal.data(), 4, p, 7, step), host) << step;
  }
  p.top_p = 1.0;
  p.top_k = 3;  // the cut falls inside the run of 2.0s: tokens 1, 2 and 4 (lowest indices first)
  const std::vector<float> run = {1.0f, 2.0f, 2.0f, 0.0f, 2.0f, 2.0f, 2.0f};
  for (uint64_t step = 0; step < 500; ++step) {
    const int32_t host = sample_token(run.data(), 7, p, 1, step);
    ASSERT_TRUE(host == 1 || host == 2 || host == 4);
    ASSERT_EQ(sample_row_model(run.data(), 7, p, 1, step), host) << step;
  }
  p.top_k = 1;  // greedy: -0 and +0 are equal, the first one wins
  const std::vector<float> zeros = {-1.0f, 0.0f, -0.0f, -2.0f};
  EXPECT_EQ(sample_row_model(zeros.data(), 4, p, 0, 0), 1);
  const std::vector<float> zeros2 = {-1.0f, -0.0f, 0.0f, -2.0f};
  EXPECT_EQ(sample_row_model(zeros2.data(), 4, p, 0, 0), 1);
  EXPECT_EQ(sample_token(zeros2.data(), 4, p, 0, 0), 1);
}

// The bucket scan's fallback (a sub-pass whose buckets, summed in another order, never reach the target that
// their parent bucket reached): the last bucket carrying weight, else the last non-empty one. Never hit by the
// random rows (it needs a target within rounding of a bucket end), so checked on a hand-made histogram.
TEST(SamplingModel, BucketScanFallbackAndRuns) {
  uint32_t cnt[sm::kBuckets] = {};
  double w[sm::kBuckets] = {};
  int32_t first[sm::kBuckets], last[sm::kBuckets];
  cnt[200] = 2, w[200] = 0.25;
  cnt[100] = 1, w[100] = 0.5;
  cnt[7] = 3, w[7] = 0.0;  // underflowed weights
  const sm::HistView h{cnt, w, first, last, 0};
  auto c = sm::cross_weight(h, false, 0.3, 0.1);  // 0.1 + 0.25 > 0.3: bucket 200
  EXPECT_EQ(c.bucket, 200);
  EXPECT_EQ(c.before, 0);
  c = sm::cross_weight(h, true, 0.85, 0.1);  // 0.1 + 0.25 + 0.5 >= 0.85
  EXPECT_EQ(c.bucket, 100);
  EXPECT_EQ(c.before, 2);
  EXPECT_EQ(c.base, 0.35);
  c = sm::cross_weight(h, false, 0.85, 0.1);  // never > 0.85: the last bucket with weight, not the zeros
  EXPECT_EQ(c.bucket, 100);
  EXPECT_EQ(c.before, 2);
  w[200] = w[100] = 0.0;
  c = sm::cross_weight(h, false, 0.85, 0.1);  // no weight at all: the last non-empty bucket
  EXPECT_EQ(c.bucket, 7);
  EXPECT_EQ(c.before, 3);
  EXPECT_EQ(sm::cross_count(h, 3).bucket, 100);
  EXPECT_EQ(sm::cross_count(h, 4).bucket, 7);
  EXPECT_EQ(sm::cross_count(h, 4).before, 3);
  // Inside a run of 10 weights 0.5 from 1.0: 1 + 0.5 m >= 3 at m = 4, > 3 at m = 5; never >= 9: the run's end.
  EXPECT_EQ(sm::tie_crossing(1.0, 0.5, 10, true, 3.0), 4);
  EXPECT_EQ(sm::tie_crossing(1.0, 0.5, 10, false, 3.0), 5);
  EXPECT_EQ(sm::tie_crossing(1.0, 0.5, 10, true, 9.0), 10);
  EXPECT_EQ(sm::tie_crossing(1.0, 0.5, 10, false, 0.5), 1);
}

// Per-row parameters (the batched form the engines use for per-request sampling): a batch whose rows each carry
// their own parameters and seed — greedy, temperature, top-k, top-p, all of them — gives each row exactly the
// token the uniform model gives it with its own parameters, and so sample_token's (up to a boundary, accepted
// by the same rule as above).
TEST(SamplingModel, PerRowParametersMatchEachRowAlone) {
  const std::vector<SamplingParams> kinds = [] {
    std::vector<SamplingParams> k(7);
    k[1].temperature = 0.7, k[1].seed = 1;
    k[2].temperature = 1.0, k[2].top_k = 8, k[2].seed = 2;
    k[3].temperature = 1.0, k[3].top_p = 0.8, k[3].seed = 3;
    k[4].temperature = 1.0, k[4].top_p = 0.8, k[4].seed = 4;  // the same, another seed
    k[5].temperature = 1.3, k[5].top_k = 20, k[5].top_p = 0.9, k[5].seed = 5;
    k[6].temperature = 0.5, k[6].top_k = 1, k[6].seed = 6;  // greedy through top_k 1
    return k;
  }();
  std::mt19937_64 rng(11);
  int64_t rows = 0, accepted = 0;
  for (int64_t V : {5, 300, 5000}) {
    const int64_t n = 3 * int64_t(kinds.size()) + 2;
    std::vector<float> logits(size_t(n * V));
    std::vector<sm::RowDraw> draws;
    std::vector<SamplingParams> params;
    std::vector<uint64_t> ids, steps;
    for (int64_t r = 0; r < n; ++r) {
      test::fill_row(logits.data() + r * V, V, int(r % test::kRowKinds), rng);
      params.push_back(kinds[size_t((r * 5) % int64_t(kinds.size()))]);
      draws.push_back(sm::row_draw(V, params.back()));
      ids.push_back(rng()), steps.push_back(rng() % 512);
    }
    const std::vector<int32_t> got = fd::cuda::sample_rows_model(logits.data(), n, V, draws, ids, steps);
    ASSERT_EQ(got.size(), size_t(n));
    for (int64_t r = 0; r < n; ++r) {
      const float* row = logits.data() + r * V;
      const SamplingParams& p = params[size_t(r)];
      ++rows;
      ASSERT_EQ(got[size_t(r)], sample_row_model(row, V, p, ids[size_t(r)], steps[size_t(r)]))
          << "V " << V << " row " << r << " (T " << p.temperature << ", top_k " << p.top_k << ", top_p " << p.top_p
          << ", seed " << p.seed << ")";
      const int32_t host = sample_token(row, V, p, ids[size_t(r)], steps[size_t(r)]);
      if (got[size_t(r)] == host) continue;
      ASSERT_FALSE(p.greedy()) << "greedy row " << r << ": " << got[size_t(r)] << " != " << host;
      ASSERT_TRUE(test::explain_difference(test::host_trace(row, V, p, ids[size_t(r)], steps[size_t(r)]), p,
                                           got[size_t(r)]).has_value())
          << "V " << V << " row " << r << ": model " << got[size_t(r)] << " != host " << host;
      ++accepted;
    }
  }
  EXPECT_LT(accepted, rows / 10);
}

TEST(SamplingModel, RejectsWhatTheHostRejects) {
  const std::vector<float> l = {0.5f, 1.0f};
  const auto bad = [&](SamplingParams p, int64_t V) {
    EXPECT_THROW(sample_token(l.data(), V, p, 0, 0), Error);
    EXPECT_THROW(sample_row_model(l.data(), V, p, 0, 0), Error);
  };
  SamplingParams p;
  p.temperature = 1.0;
  bad(p, 0);
  p.top_p = 0.0;
  bad(p, 2);
  p.top_p = 1.5;
  bad(p, 2);
  p.top_p = std::numeric_limits<double>::quiet_NaN();
  bad(p, 2);
  p.top_p = 1.0;
  p.temperature = -1.0;
  bad(p, 2);
  p.temperature = 1.0;
  p.top_k = -1;
  bad(p, 2);
}

}  // namespace
