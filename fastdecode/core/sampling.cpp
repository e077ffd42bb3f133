#include "fastdecode/core/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "fastdecode/core/error.h"
#include "fd_fault_sampler_ignores_temperature.h"  // planted fault (scripts/fault-check.sh; fastdecode/core/fault.h)
#include "fastdecode/core/splitmix64.h"

namespace fd {

int32_t argmax(const float* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  return int32_t(best);
}

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& p, uint64_t request_id,
                     uint64_t step) {
  FD_CHECK(vocab > 0, "empty logits");
  FD_CHECK(p.temperature >= 0 && p.top_k >= 0 && p.top_p > 0 && p.top_p <= 1, "bad sampling parameters");
  if (p.greedy()) return argmax(logits, vocab);

  // Candidates sorted by logit, descending; ties broken by lower token id so the order is total.
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  const int64_t k = p.top_k > 0 ? std::min(p.top_k, vocab) : vocab;
  const auto cmp = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), cmp);
  idx.resize(size_t(k));

  // Softmax over the top-k at the given temperature (in double).
  std::vector<double> prob(static_cast<size_t>(k));
  const double mx = logits[idx[0]];
  double sum = 0;
  double temperature = p.temperature;
#ifdef FD_FAULT_SAMPLER_IGNORES_TEMPERATURE  // planted fault: every draw at temperature 1
  temperature = 1.0;
#endif
  for (int64_t i = 0; i < k; ++i) sum += prob[size_t(i)] = std::exp((double(logits[idx[size_t(i)]]) - mx) / temperature);
  for (auto& x : prob) x /= sum;

  // Nucleus: the smallest prefix whose mass reaches top_p.
  int64_t n = k;
  if (p.top_p < 1.0) {
    double cum = 0;
    for (int64_t i = 0; i < k; ++i) {
      cum += prob[size_t(i)];
      if (cum >= p.top_p) {
        n = i + 1;
        break;
      }
    }
  }
  double mass = 0;
  for (int64_t i = 0; i < n; ++i) mass += prob[size_t(i)];

  // One uniform draw in [0, mass) from 53 bits of a hash of (seed, request, step).
  const uint64_t z = splitmix64(splitmix64(splitmix64(p.seed) ^ request_id) ^ step);
  const double u = double(z >> 11) * 0x1p-53 * mass;
  double cum = 0;
  for (int64_t i = 0; i < n; ++i) {
    cum += prob[size_t(i)];
    if (u < cum) return idx[size_t(i)];
  }
  return idx[size_t(n - 1)];
}

}  // namespace fd
