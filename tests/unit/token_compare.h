// Running an engine to completion and judging its greedy tokens against the reference model.
//
// run_engine() drives an engine the way the harness does (requests may join at later steps) and records
// every token and any breach of the Engine contract: a token after a request's finished one, a request
// that never finishes, a token for a request nobody sent, more prompt tokens in a step than the budget.
//
// check_greedy_tokens() judges every token of every request teacher-forced: the reference scores the
// engine's own prefix, so one early flip does not hide what follows. Each token must be the reference's
// argmax at that position, or a near-tie of its logits there (gap to the argmax within near_tie of the
// largest |logit|) — an engine computing in lower precision may flip only those. Each request must have
// exactly its length: max_new_tokens, or up to and including its first eos_token_id when it stops at
// EOS. It also reports how permissive the bound is: the share of positions whose top-2 gap lies inside
// it (a bound that admits most positions cannot tell a wrong token from rounding).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fastdecode/engine/engine.h"
#include "fastdecode/model/reference.h"

namespace fd::test {

using Tokens = std::map<uint64_t, std::vector<int32_t>>;

struct EngineRun {
  Tokens tokens;
  std::vector<std::string> errors;  // contract breaches, see above
  int64_t steps = 0;
  int64_t max_running = 0;          // most requests with tokens and not yet finished after a step
  int64_t max_prefill_tokens = 0;   // most prompt tokens in one step
  std::string describe_errors() const {
    std::string s;
    for (const auto& e : errors) s += "\n  " + e;
    return s;
  }
};

// Runs `e` until done() and every arrival is in: `reqs` are added before the first step, arrivals[k]
// before step k (steps with nothing to run are counted, not taken).
// prefill_budget > 0: a step may hold at most that many prompt tokens unless it starts a single prompt
// longer than the budget (whole prompts, at least one, as the fastdecode and gpu-only engines promise).
// Calls e.shutdown() at the end.
inline EngineRun run_engine(Engine& e, const std::vector<Request>& reqs,
                            const std::map<int64_t, std::vector<Request>>& arrivals = {}, int64_t prefill_budget = 0) {
  EngineRun run;
  std::map<uint64_t, const Request*> sent;
  std::map<uint64_t, bool> finished;
  auto add = [&](const std::vector<Request>& rs) {
    for (const Request& r : rs) sent[r.id] = &r;
    e.add(rs);
  };
  add(reqs);
  const int64_t last_arrival = arrivals.empty() ? 0 : arrivals.rbegin()->first;
  while (!e.done() || run.steps < last_arrival) {
    if (auto it = arrivals.find(run.steps); it != arrivals.end()) add(it->second);
    if (e.done()) {  // idle until the next arrival
      ++run.steps;
      continue;
    }
    const StepResult r = e.step();
    ++run.steps;
    run.max_prefill_tokens = std::max(run.max_prefill_tokens, r.prefill_tokens);
    if (prefill_budget > 0 && r.prefill_tokens > prefill_budget) {
      bool single_long = false;  // allowed: one whole prompt longer than the budget
      for (const auto& [id, q] : sent)
        single_long |= int64_t(q->prompt.size()) == r.prefill_tokens && r.prefill_tokens > prefill_budget;
      if (!single_long)
        run.errors.push_back("step " + std::to_string(run.steps - 1) + " prefilled " + std::to_string(r.prefill_tokens) +
                             " prompt tokens, budget " + std::to_string(prefill_budget));
    }
    for (const GeneratedToken& t : r.tokens) {
      if (!sent.count(t.request_id)) {
        run.errors.push_back("token for request " + std::to_string(t.request_id) + ", which was never added");
        continue;
      }
      if (finished[t.request_id])
        run.errors.push_back("request " + std::to_string(t.request_id) + ": token after its finished one");
      run.tokens[t.request_id].push_back(t.token);
      finished[t.request_id] = finished[t.request_id] || t.finished;
    }
    int64_t live = 0;
    for (const auto& [id, toks] : run.tokens) live += !finished[id];
    run.max_running = std::max(run.max_running, live);
  }
  for (const auto& [id, q] : sent)
    if (!finished[id]) run.errors.push_back("request " + std::to_string(id) + " never finished");
  e.shutdown();
  return run;
}

// The tokens of run_engine(e, reqs); a breach of the Engine contract fails the calling test. `stats`,
// when given, gets the whole record.
inline Tokens run_tokens(Engine& e, const std::vector<Request>& reqs, EngineRun* stats = nullptr) {
  EngineRun r = run_engine(e, reqs);
  EXPECT_TRUE(r.errors.empty()) << r.describe_errors();
  Tokens t = r.tokens;
  if (stats) *stats = std::move(r);
  return t;
}

// How the reference stores its KV (it must hold what the engine's cache holds, so tokens can be exact).
struct ReferenceKV {
  DType dtype = DType::F16;                 // K/V rounded through this as they are cached
  int64_t block_tokens = 0;                 // > 0: blocks replaced by `codec` (ReferenceModel::set_kv_block_codec)
  ReferenceModel::KVBlockCodec codec;
};

struct TokenCheck {
  size_t requests = 0, tokens = 0;
  size_t not_argmax = 0;   // tokens that are not the reference's argmax (all within the bound unless in errors)
  double worst = 0;        // largest (gap to argmax) / max|logit| over those tokens
  uint64_t worst_request = 0;
  size_t worst_index = 0;
  size_t admitted = 0;     // positions whose reference top-2 gap is within the bound
  double bound = 0;
  std::vector<std::string> errors;
  bool ok() const { return errors.empty() && tokens > 0; }
  std::string describe() const {
    char b[320];
    std::snprintf(b, sizeof b,
                  "%zu tokens in %zu requests; %zu not the reference's argmax (worst gap %.2e of max |logit|%s); "
                  "the bound %.1e admits %.1f%% of positions",
                  tokens, requests, not_argmax, worst,
                  not_argmax ? (", request " + std::to_string(worst_request) + " token " + std::to_string(worst_index)).c_str()
                             : "",
                  bound, tokens ? 100.0 * double(admitted) / double(tokens) : 0.0);
    std::string s = b;
    if (tokens == 0) s += "; NO TOKENS";
    for (size_t i = 0; i < errors.size() && i < 12; ++i) s += "\n  " + errors[i];
    if (errors.size() > 12) s += "\n  ... " + std::to_string(errors.size() - 12) + " more";
    return s;
  }
};

// See the file comment. near_tie: the bound on (argmax logit - the engine token's logit) / max|logit|
// (0: every token must be the argmax).
inline TokenCheck check_greedy_tokens(const ModelWeights& w, const ReferenceKV& kv, const std::vector<Request>& reqs,
                                      const Tokens& got, double near_tie) {
  TokenCheck c;
  c.bound = near_tie;
  ReferenceModel m(w);
  m.set_kv_dtype(kv.dtype);
  if (kv.block_tokens > 0) m.set_kv_block_codec(kv.block_tokens, kv.codec);
  const int64_t V = w.cfg.vocab_size;
  std::map<uint64_t, bool> known;
  for (const Request& r : reqs) {
    known[r.id] = true;
    ++c.requests;
    const auto it = got.find(r.id);
    const std::vector<int32_t> none;
    const std::vector<int32_t>& g = it == got.end() ? none : it->second;
    const std::string who = "request " + std::to_string(r.id);
    const int64_t s = m.add_sequence();
    std::vector<RefToken> batch;
    for (size_t t = 0; t < r.prompt.size(); ++t) batch.push_back({s, r.prompt[t], t + 1 == r.prompt.size()});
    std::vector<float> lg = m.forward(batch);
    size_t expect_len = size_t(r.max_new_tokens);
    for (size_t i = 0; i < g.size() && i < expect_len; ++i) {
      ++c.tokens;
      if (g[i] < 0 || g[i] >= V) {
        c.errors.push_back(who + " token " + std::to_string(i) + ": id " + std::to_string(g[i]) + " outside the vocabulary");
        break;
      }
      const int32_t best = argmax(lg.data(), V);
      double scale = 0, second = -INFINITY;
      for (int64_t v = 0; v < V; ++v) {
        scale = std::max(scale, std::fabs(double(lg[size_t(v)])));
        if (v != best) second = std::max(second, double(lg[size_t(v)]));
      }
      scale = std::max(scale, 1e-30);
      const double top2 = (double(lg[size_t(best)]) - second) / scale;
      if (top2 <= near_tie) ++c.admitted;
      if (g[i] != best) {
        ++c.not_argmax;
        const double gap = (double(lg[size_t(best)]) - double(lg[size_t(g[i])])) / scale;
        if (gap > c.worst) c.worst = gap, c.worst_request = r.id, c.worst_index = i;
        if (gap > near_tie) {
          char b[200];
          std::snprintf(b, sizeof b, "%s token %zu: %d where the reference's argmax is %d, gap %.3e of max |logit| > %.1e",
                        who.c_str(), i, g[i], best, gap, near_tie);
          c.errors.push_back(b);
        }
      }
      if (r.stop_at_eos && g[i] == w.cfg.eos_token_id) expect_len = i + 1;
      if (i + 1 < expect_len && i + 1 < g.size()) lg = m.forward({{s, g[i], true}});
    }
    if (g.size() != expect_len)
      c.errors.push_back(who + ": " + std::to_string(g.size()) + " tokens, expected " + std::to_string(expect_len) +
                         (r.stop_at_eos ? " (max_new_tokens or its first EOS)" : " (max_new_tokens)"));
    m.free_sequence(s);
  }
  for (const auto& [id, toks] : got)
    if (!known.count(id)) c.errors.push_back("tokens for request " + std::to_string(id) + ", which was not sent");
  return c;
}

}  // namespace fd::test
