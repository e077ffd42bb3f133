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
