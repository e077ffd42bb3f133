#include "fastdecode/model/sampler.h"

#include <cmath>
#include <map>
#include <vector>

#include "test_helpers.h"

using namespace fd;

namespace {
const std::vector<float> kLogits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, 0.0f, -3.0f, 1.5f};
}

TEST(Sampler, GreedyIsArgmaxWithLowestIndexOnTies) {
  EXPECT_EQ(argmax(kLogits.data(), 8), 1);
  SamplingParams p;
  EXPECT_EQ(sample_token(kLogits.data(), 8, p, 0, 0), 1);
  p.temperature = 1.0;
  p.top_k = 1;  // top-k 1 is greedy too
  EXPECT_EQ(sample_token(kLogits.data(), 8, p, 3, 9), 1);
}

TEST(Sampler, SeededAndReproducible) {
  SamplingParams p;
  p.temperature = 1.0;
  p.seed = 11;
  std::vector<int32_t> a, b, c;
  for (uint64_t step = 0; step < 200; ++step) {
    a.push_back(sample_token(kLogits.data(), 8, p, 5, step));
    b.push_back(sample_token(kLogits.data(), 8, p, 5, step));
  }
  p.seed = 12;
  for (uint64_t step = 0; step < 200; ++step) c.push_back(sample_token(kLogits.data(), 8, p, 5, step));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Sampler, FrequenciesFollowSoftmax) {
  SamplingParams p;
  p.temperature = 0.8;
  p.seed = 1;
  const int n = 40000;
  std::map<int32_t, int> count;
  for (int i = 0; i < n; ++i) ++count[sample_token(kLogits.data(), 8, p, uint64_t(i), 0)];
  double z = 0;
  for (float l : kLogits) z += std::exp(l / 0.8);
  for (int t = 0; t < 8; ++t) {
    const double expect = std::exp(kLogits[t] / 0.8) / z;
    const double sd = std::sqrt(expect * (1 - expect) / n);
    EXPECT_NEAR(double(count[t]) / n, expect, 5 * sd + 1e-4) << "token " << t;
  }
}

TEST(Sampler, TopKAndTopPCut) {
  SamplingParams p;
  p.temperature = 1.0;
  p.top_k = 3;  // tokens 1, 3 (tied at 2.0) and 7 (1.5)
  for (uint64_t s = 0; s < 2000; ++s) {
    const int32_t t = sample_token(kLogits.data(), 8, p, 0, s);
    EXPECT_TRUE(t == 1 || t == 3 || t == 7) << t;
  }
  p.top_k = 0;
  p.top_p = 0.3;  // the top token alone holds ~28% of the mass: the nucleus is {1, 3}
  std::map<int32_t, int> seen;
  for (uint64_t s = 0; s < 2000; ++s) ++seen[sample_token(kLogits.data(), 8, p, 0, s)];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[1], 800);
  EXPECT_GT(seen[3], 800);
  p.top_p = 1e-6;  // only the most likely token
  EXPECT_EQ(sample_token(kLogits.data(), 8, p, 0, 1), 1);
}

TEST(Sampler, RejectsBadParameters) {
  SamplingParams p;
  p.temperature = 1.0;
  p.top_p = 0.0;
  EXPECT_THROW(sample_token(kLogits.data(), 8, p, 0, 0), Error);
  EXPECT_THROW(sample_token(kLogits.data(), 0, SamplingParams{}, 0, 0), Error);
}
