// Random sampling cases shared by the CPU test of the GPU sampler's host model (tests/unit/test_sampling_model.cpp)
// and the GPU test of the kernel (tests/gpu/test_cuda_sampling.cpp): batches of logit rows with many exact ties,
// a replay of fd::sample_token that keeps its intermediate values, and the rule that accepts a different token
// only when the host's own numbers put the draw (or the nucleus cut) within rounding of a boundary.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "fastdecode/core/splitmix64.h"
#include "fastdecode/core/sampling.h"

namespace fd::test {

// Rows of one batch share V and the parameters (as one sample_rows call does); request ids and steps vary.
struct SamplingBatch {
  int64_t V = 0;
  SamplingParams p;
  std::vector<float> logits;  // [n, V]
  std::vector<uint64_t> request_ids, steps;
  std::vector<int> kinds;  // generator of each row (see fill_row)
  int64_t rows() const { return int64_t(request_ids.size()); }
  const float* row(int64_t r) const { return logits.data() + r * V; }
};

constexpr int kRowKinds = 8;
inline const char* row_kind_name(int kind) {
  static const char* names[kRowKinds] = {"normal",  "integers", "quarter-steps", "fp16-rounded",
                                         "all-equal", "peaked+masked", "wide (underflow)", "signed zeros"};
  return names[kind];
}

// One row of logits of the given kind; most kinds have many exactly equal values.
inline void fill_row(float* row, int64_t V, int kind, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> small(-3, 3);
  const float inf = std::numeric_limits<float>::infinity();
  switch (kind) {
    case 0:  // continuous, occasional duplicates copied in
      for (int64_t i = 0; i < V; ++i) row[i] = 3.0f * nd(rng);
      for (int64_t j = 0; j < V / 8; ++j) row[rng() % uint64_t(V)] = row[rng() % uint64_t(V)];
      break;
    case 1:  // integers in [-3, 3]: huge runs of equal logits
      for (int64_t i = 0; i < V; ++i) row[i] = float(small(rng));
      break;
    case 2:  // multiples of 1/4
      for (int64_t i = 0; i < V; ++i) row[i] = std::round(4.0f * 2.0f * nd(rng)) / 4.0f;
      break;
    case 3:  // rounded to fp16 precision (10 mantissa bits), like logits from an fp16 LM head
      for (int64_t i = 0; i < V; ++i) {
        float x = 4.0f * nd(rng);
        uint32_t b;
        std::memcpy(&b, &x, 4);
        b = (b + 0x1000u) & ~0x1fffu;
        std::memcpy(&x, &b, 4);
        row[i] = x;
      }
      break;
    case 4: {  // every logit equal
      const float c = float(small(rng));
      for (int64_t i = 0; i < V; ++i) row[i] = c;
      break;
    }
    case 5:  // a few large logits, the rest small, some masked to -inf (at least one finite)
      for (int64_t i = 0; i < V; ++i) row[i] = (rng() % 4 == 0) ? -inf : nd(rng);
      for (int j = 0; j < 3; ++j) row[rng() % uint64_t(V)] = 8.0f + float(rng() % 3);
      break;
    case 6:  // spread so wide that most weights underflow to exactly 0
      for (int64_t i = 0; i < V; ++i) row[i] = 400.0f * nd(rng);
      break;
    default:  // -0, +0, +-1: the host treats -0 == +0
      for (int64_t i = 0; i < V; ++i) {
        const int c = int(rng() % 4);
        row[i] = c == 0 ? -0.0f : c == 1 ? 0.0f : c == 2 ? 1.0f : -1.0f;
      }
      break;
  }
}

// The case matrix: V x top_k x top_p, temperature cycling through 0.3 .. 2, rows of every kind.
// rows_for(V) rows per batch; plus greedy batches.
inline std::vector<SamplingBatch> sampling_batches(const std::vector<int64_t>& vocabs, int64_t (*rows_for)(int64_t),
                                                   uint64_t seed) {
  std::mt19937_64 rng(seed);
  const double temps[] = {0.3, 0.5, 0.8, 1.0, 1.4, 2.0};
  const double top_ps[] = {0.05, 0.5, 0.9, 1.0};
  std::vector<SamplingBatch> out;
  size_t ti = 0;
  for (int64_t V : vocabs) {
    std::set<int64_t> ks = {0, 1, 2, 40, V - 1, V, V + 5};
    for (int64_t k : ks) {
      for (double tp : top_ps) {
        SamplingBatch b;
        b.V = V;
        b.p.temperature = temps[ti++ % 6];
        b.p.top_k = std::max<int64_t>(k, 0);
        b.p.top_p = tp;
        b.p.seed = rng();
        const int64_t n = rows_for(V);
        b.logits.resize(size_t(n * V));
        for (int64_t r = 0; r < n; ++r) {
          const int kind = int((r + ti) % kRowKinds);
          fill_row(b.logits.data() + r * V, V, kind, rng);
          b.kinds.push_back(kind);
          b.request_ids.push_back(rng());
          b.steps.push_back(rng() % 4096);
        }
        out.push_back(std::move(b));
      }
    }
    // Greedy (temperature 0): the first maximum.
    SamplingBatch g;
    g.V = V;
    const int64_t n = rows_for(V);
    g.logits.resize(size_t(n * V));
    for (int64_t r = 0; r < n; ++r) {
      fill_row(g.logits.data() + r * V, V, int(r % kRowKinds), rng);
      g.kinds.push_back(int(r % kRowKinds));
      g.request_ids.push_back(rng());
      g.steps.push_back(r);
    }
    out.push_back(std::move(g));
  }
  return out;
}

// fd::sample_token (non-greedy) replayed step by step, keeping what the acceptance rule needs.
struct HostTrace {
  std::vector<int32_t> order;  // the top-k, sorted
  std::vector<double> cum;     // cumulative probabilities over it, summed as the host does
  int64_t n = 0;               // nucleus size
  double frac = 0, mass = 0, u = 0;
  int32_t token = -1;
};

inline HostTrace host_trace(const float* logits, int64_t vocab, const SamplingParams& p, uint64_t request_id,
                            uint64_t step) {
  HostTrace t;
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  const int64_t k = p.top_k > 0 ? std::min(p.top_k, vocab) : vocab;
  const auto cmp = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), cmp);
  idx.resize(size_t(k));
  std::vector<double> prob(static_cast<size_t>(k));
  const double mx = logits[idx[0]];
  double sum = 0;
  for (int64_t i = 0; i < k; ++i)
    sum += prob[size_t(i)] = std::exp((double(logits[idx[size_t(i)]]) - mx) / p.temperature);
  for (auto& x : prob) x /= sum;
  t.cum.resize(size_t(k));
  double cum = 0;
  for (int64_t i = 0; i < k; ++i) t.cum[size_t(i)] = cum += prob[size_t(i)];
  t.n = k;
  if (p.top_p < 1.0)
    for (int64_t i = 0; i < k; ++i)
      if (t.cum[size_t(i)] >= p.top_p) {
        t.n = i + 1;
        break;
      }
  for (int64_t i = 0; i < t.n; ++i) t.mass += prob[size_t(i)];
  t.frac = double(splitmix64(splitmix64(splitmix64(p.seed) ^ request_id) ^ step) >> 11) * 0x1p-53;
  t.u = t.frac * t.mass;
  t.token = idx[size_t(t.n - 1)];
  for (int64_t i = 0; i < t.n; ++i)
    if (t.u < t.cum[size_t(i)]) {
      t.token = idx[size_t(i)];
      break;
    }
  t.order = std::move(idx);
  return t;
}

// Why `got` may differ from the host's token, or nullopt when nothing explains it. Accepted: the host's
// cumulative probabilities between the two tokens all lie within tol * mass of the draw u (the draw sits on a
// boundary, which summing in another order may move across), possibly after moving the nucleus cut to another
// size whose cumulative lies within tol of top_p.
inline std::optional<std::string> explain_difference(const HostTrace& t, const SamplingParams& p, int32_t got,
                                                     double tol = 1e-12) {
  const auto it = std::find(t.order.begin(), t.order.end(), got);
  if (it == t.order.end()) return std::nullopt;  // outside the top-k: never a rounding effect
  const int64_t pg = it - t.order.begin();
  const int64_t k = int64_t(t.order.size());
  std::vector<int64_t> sizes = {t.n};
  if (p.top_p < 1.0)
    for (int64_t m = 1; m <= k; ++m)
      if (m != t.n && std::fabs(t.cum[size_t(m - 1)] - p.top_p) <= tol) sizes.push_back(m);
  for (int64_t n : sizes) {
    if (pg >= n) continue;
    const double mass = t.cum[size_t(n - 1)];
    const double u = t.frac * mass;
    int64_t ph = n - 1;
    for (int64_t i = 0; i < n; ++i)
      if (u < t.cum[size_t(i)]) {
        ph = i;
        break;
      }
    char buf[300];
    const std::string cut = n == t.n ? std::string()
                                     : "nucleus cut moved from " + std::to_string(t.n) + " to " + std::to_string(n) +
                                           " (host cumulative within tol of top_p); ";
    if (ph == pg) return cut + "same token after that";
    double worst = 0;
    bool ok = true;
    for (int64_t j = std::min(pg, ph); j < std::max(pg, ph); ++j) {
      const double d = std::fabs(u - t.cum[size_t(j)]) / mass;
      worst = std::max(worst, d);
      ok = ok && d <= tol;
    }
    if (ok) {
      std::snprintf(buf, sizeof buf, "draw on a boundary: host position %lld, got %lld, |u - cum| / mass <= %.3g",
                    (long long)ph, (long long)pg, worst);
      return cut + buf;
    }
  }
  return std::nullopt;
}

// How often a case exercised the runs of equal logits (where the kernel resolves positions inside a run).
struct TieCoverage {
  int64_t topk_splits_run = 0, nucleus_splits_run = 0, token_in_run = 0;
  void add(const float* logits, int64_t V, const HostTrace& t) {
    const auto run_at = [&](int64_t pos) {  // does sorted position pos share its logit with a neighbour?
      const float l = logits[t.order[size_t(pos)]];
      int64_t same = 0;
      for (int64_t i = 0; i < V; ++i) same += logits[i] == l;
      return same > 1;
    };
    const int64_t k = int64_t(t.order.size());
    if (k < V && run_at(k - 1)) {
      const float l = logits[t.order[size_t(k - 1)]];
      int64_t inside = 0, all = 0;
      for (int32_t i : t.order) inside += logits[i] == l;
      for (int64_t i = 0; i < V; ++i) all += logits[i] == l;
      topk_splits_run += inside < all;
    }
    if (t.n < k && logits[t.order[size_t(t.n - 1)]] == logits[t.order[size_t(t.n)]]) ++nucleus_splits_run;
    const auto pos = std::find(t.order.begin(), t.order.end(), t.token) - t.order.begin();
    if (run_at(pos)) ++token_in_run;
  }
};

}  // namespace fd::test
