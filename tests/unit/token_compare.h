// Comparing an engine's greedy tokens with the reference's when the engine computes in lower precision
// (fp16 GEMM inputs, fp16 on the wire): tokens must agree until a near-tie of the reference's logits.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "fastdecode/engine/engine.h"
#include "fastdecode/model/reference.h"
#include "fastdecode/model/weights.h"

namespace fd::test {

using Tokens = std::map<uint64_t, std::vector<int32_t>>;

struct Divergence {
  bool any = false;
  uint64_t request = 0;
  size_t index = 0;       // first differing token
  double gap = 0;         // reference logit of its token minus that of the engine's token, at that step
  double scale = 0;       // max |logit| there
  size_t agreed = 0;      // tokens equal before the first divergence (all requests)
  std::string describe() const {
    if (!any) return "none (" + std::to_string(agreed) + " tokens compared)";
    char b[200];
    std::snprintf(b, sizeof b, "request %llu token %zu: reference logit gap %.3g (%.2e of max |logit| %.3g); %zu tokens agreed before",
                  (unsigned long long)request, index, gap, gap / std::max(scale, 1e-30), scale, agreed);
    return b;
  }
};

// The reference's logits for request r's token i, replaying the expected tokens before it.
inline std::vector<float> reference_logits_at(const ModelWeights& w, DType kv_dtype, const Request& r,
                                              const std::vector<int32_t>& expect, size_t i) {
  ReferenceModel m(w);
  m.set_kv_dtype(kv_dtype);
  const int64_t s = m.add_sequence();
  std::vector<RefToken> batch;
  for (size_t t = 0; t < r.prompt.size(); ++t) batch.push_back({s, r.prompt[t], t + 1 == r.prompt.size()});
  std::vector<float> lg = m.forward(batch);
  for (size_t t = 0; t < i; ++t) lg = m.forward({{s, expect[t], true}});
  return lg;
}

// Seeded sampling in lower precision: where a request's tokens first differ from the reference's, the
// reference's draw must sit near an edge of its token's interval on the cumulative distribution
// (fd::sample_token's order: by logit, then id), within `tol` of the nucleus mass; a small logit error
// then moves the edge past the draw. Returns one line per divergence; *unexplained counts those that
// are not so (a broken sampler or model).
inline std::vector<std::string> sampled_divergences(const ModelWeights& w, DType kv_dtype,
                                                    const std::vector<Request>& reqs, const Tokens& expect,
                                                    const Tokens& got, const SamplingParams& p, double tol,
                                                    int* unexplained) {
  std::vector<std::string> out;
  *unexplained = 0;
  for (const Request& r : reqs) {
    const auto& e = expect.at(r.id);
    const auto it = got.find(r.id);
    if (it == got.end()) {
      ++*unexplained, out.push_back("request " + std::to_string(r.id) + ": no tokens");
      continue;
    }
    const auto& g = it->second;
    size_t i = 0;
    while (i < e.size() && i < g.size() && e[i] == g[i]) ++i;
    if (i == e.size() && g.size() == e.size()) continue;
    if (i >= e.size() || i >= g.size()) {
      ++*unexplained, out.push_back("request " + std::to_string(r.id) + ": token counts differ");
      continue;
    }
    const std::vector<float> lg = reference_logits_at(w, kv_dtype, r, e, i);
    const int64_t V = int64_t(lg.size());
    std::vector<int32_t> idx(static_cast<size_t>(V));
    for (int64_t t = 0; t < V; ++t) idx[size_t(t)] = int32_t(t);
    std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return lg[a] > lg[b] || (lg[a] == lg[b] && a < b); });
    const int64_t k = p.top_k > 0 ? std::min(p.top_k, V) : V;
    std::vector<double> prob(static_cast<size_t>(k));
    double sum = 0;
    for (int64_t t = 0; t < k; ++t)
      sum += prob[size_t(t)] = std::exp((double(lg[size_t(idx[size_t(t)])]) - double(lg[size_t(idx[0])])) / p.temperature);
    int64_t n = k;
    double cum = 0;
    for (int64_t t = 0; t < k; ++t) {
      prob[size_t(t)] /= sum;
      if (p.top_p < 1.0 && n == k && (cum += prob[size_t(t)]) >= p.top_p) n = t + 1;
    }
    double mass = 0;
    for (int64_t t = 0; t < n; ++t) mass += prob[size_t(t)];
    const uint64_t z = splitmix64(splitmix64(splitmix64(p.seed) ^ r.id) ^ uint64_t(i));
    const double u = double(z >> 11) * 0x1p-53 * mass;
    double lo = 0, edge = 1e300;
    for (int64_t t = 0; t < n; ++t) {
      const double hi = lo + prob[size_t(t)];
      if (idx[size_t(t)] == e[i]) edge = std::min(u - lo, hi - u);
      lo = hi;
    }
    const bool ok = edge <= tol * mass;
    if (!ok) ++*unexplained;
    char b[240];
    std::snprintf(b, sizeof b, "request %llu token %zu: reference drew %d, engine %d; the draw is %.2e of the mass from an edge of %d's interval (%s)",
                  (unsigned long long)r.id, i, e[i], g[i], edge / mass, e[i], ok ? "explained" : "NOT explained");
    out.push_back(b);
  }
  return out;
}

// First divergence of `got` from `expect` (greedy, from the reference with KV rounded to kv_dtype), with
// the reference's logit gap at that step recomputed by replaying the request's expected tokens.
inline Divergence first_divergence_with_gap(const ModelWeights& w, DType kv_dtype, const std::vector<Request>& reqs,
                                            const Tokens& expect, const Tokens& got) {
  Divergence d;
  for (const Request& r : reqs) {
    const auto& e = expect.at(r.id);
    const auto it = got.find(r.id);
    const std::vector<int32_t> g = it == got.end() ? std::vector<int32_t>{} : it->second;
    size_t i = 0;
    while (i < e.size() && i < g.size() && e[i] == g[i]) ++i;
    d.agreed += i;
    if (i == e.size() || d.any) continue;
    d.any = true, d.request = r.id, d.index = i;
    if (i >= g.size()) continue;  // the engine stopped early: no gap to report
    const std::vector<float> lg = reference_logits_at(w, kv_dtype, r, e, i);
    d.gap = double(lg[size_t(e[i])]) - double(lg[size_t(g[i])]);
    for (float x : lg) d.scale = std::max(d.scale, std::fabs(double(x)));
  }
  return d;
}

}  // namespace fd::test
