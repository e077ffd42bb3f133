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
//
// run_engine() also checks logits recording (a row with every token of a request with record_logits, none
// for the others) and keeps the rows; check_scored_run() judges a run with per-request sampling, teacher
// forcing and recorded logits against the reference along the stream each sequence really continued with;
// issue11_requests() is the batch the engines' tests share for it.
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

// The first (request, index) where two runs' tokens differ, for failure messages ("none" when they agree).
inline std::string first_divergence(const Tokens& a, const Tokens& b) {
  for (const auto& [id, toks] : a) {
    const auto it = b.find(id);
    if (it == b.end()) return "request " + std::to_string(id) + " missing";
    const auto& o = it->second;
    for (size_t i = 0; i < std::min(toks.size(), o.size()); ++i)
      if (toks[i] != o[i]) return "request " + std::to_string(id) + " token " + std::to_string(i);
    if (toks.size() != o.size()) return "request " + std::to_string(id) + " length";
  }
  return "none";
}

struct EngineRun {
  Tokens tokens;
  std::vector<std::string> errors;  // contract breaches, see above
  int64_t steps = 0;
  int64_t max_running = 0;          // most requests with tokens and not yet finished after a step
  int64_t max_prefill_tokens = 0;   // most prompt tokens in one step
  // StepResult::counts summed over every step, and over the steps without prefill.
  std::map<std::string, int64_t> counts, decode_counts;
  // The recorded logits rows, one per token, of the requests with record_logits (none for the others).
  std::map<uint64_t, std::vector<std::vector<float>>> logits;
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
    for (const auto& [k, v] : r.counts) {
      run.counts[k] += v;
      if (r.prefill_tokens == 0) run.decode_counts[k] += v;
    }
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
      // Logits recording: a row with every token of a request that asked, nothing for the others.
      if (sent[t.request_id]->record_logits) {
        if (t.logits.empty())
          run.errors.push_back("request " + std::to_string(t.request_id) + ": record_logits but a token without logits");
        run.logits[t.request_id].push_back(t.logits);
      } else if (!t.logits.empty()) {
        run.errors.push_back("request " + std::to_string(t.request_id) + ": logits without record_logits");
      }
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

// The reference model's logits rows along a fed token stream: row 0 after the prompt, row i after the
// prompt and fed[0..i-1]; n rows (fed needs at least n - 1 tokens).
inline std::vector<std::vector<float>> reference_rows(const ModelWeights& w, const ReferenceKV& kv,
                                                       const std::vector<int32_t>& prompt,
                                                       const std::vector<int32_t>& fed, size_t n) {
  ReferenceModel m(w);
  m.set_kv_dtype(kv.dtype);
  if (kv.block_tokens > 0) m.set_kv_block_codec(kv.block_tokens, kv.codec);
  const int64_t s = m.add_sequence();
  std::vector<RefToken> batch;
  for (size_t t = 0; t < prompt.size(); ++t) batch.push_back({s, prompt[t], t + 1 == prompt.size()});
  std::vector<std::vector<float>> rows;
  for (size_t i = 0; i < n; ++i) {
    rows.push_back(m.forward(batch));
    if (i + 1 < n) batch = {{s, fed.at(i), true}};
  }
  return rows;
}

// Largest |a - b| over a row, relative to the largest |b|.
inline double row_error(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double err = 0, scale = 1e-30;
  for (size_t v = 0; v < b.size(); ++v) {
    err = std::max(err, std::fabs(double(a[v]) - double(b[v])));
    scale = std::max(scale, std::fabs(double(b[v])));
  }
  return err / scale;
}

struct ScoreCheck {
  size_t tokens = 0, rows = 0;
  size_t not_reference_pick = 0;  // admitted tokens that differ from the reference sampler's pick
  double worst_row_error = 0;     // over the recorded rows, relative to max |reference logit|
  std::vector<std::string> errors;
  bool ok() const { return errors.empty() && tokens > 0; }
  std::string describe() const {
    char b[200];
    std::snprintf(b, sizeof b, "%zu tokens, %zu logits rows (worst error %.2e of max |logit|); %zu not the reference's pick",
                  tokens, rows, worst_row_error, not_reference_pick);
    std::string s = b;
    if (tokens == 0) s += "; NO TOKENS";
    for (size_t i = 0; i < errors.size() && i < 12; ++i) s += "\n  " + errors[i];
    if (errors.size() > 12) s += "\n  ... " + std::to_string(errors.size() - 12) + " more";
    return s;
  }
};

// Judges a run with the per-request fields (issue 11), every request teacher-forced along the stream it
// really continued with: its forced tokens when it has them, else its own emitted tokens. At each step
// the emitted token must be the reference's pick from its logits row there (sample_token with the
// request's sampling, or run_sampling when unset, and (request id, step)); with near_tie > 0 a greedy
// pick may be a near-tie (as check_greedy_tokens), and a sampled pick may differ when the engine
// recorded its row, that row is within row_tol of the reference's, and the engine's pick is
// sample_token of its own row (the sampler right, the logits within tolerance). Every recorded row
// must be within row_tol (max |engine - reference| / max |reference|) of the reference row it scores.
// Each request must have exactly max_new_tokens tokens (or up to its first EOS when it stops there),
// and a recording request one row per token.
inline ScoreCheck check_scored_run(const ModelWeights& w, const ReferenceKV& kv, const std::vector<Request>& reqs,
                                   const SamplingParams& run_sampling, const EngineRun& run, double row_tol,
                                   double near_tie) {
  ScoreCheck c;
  const int64_t V = w.cfg.vocab_size;
  for (const Request& r : reqs) {
    const std::string who = "request " + std::to_string(r.id);
    const auto it = run.tokens.find(r.id);
    if (it == run.tokens.end()) {
      c.errors.push_back(who + ": no tokens");
      continue;
    }
    const std::vector<int32_t>& g = it->second;
    size_t expect_len = size_t(r.max_new_tokens);
    if (r.stop_at_eos)
      for (size_t i = 0; i < g.size(); ++i)
        if (g[i] == w.cfg.eos_token_id) {
          expect_len = std::min(expect_len, i + 1);
          break;
        }
    if (g.size() != expect_len) {
      c.errors.push_back(who + ": " + std::to_string(g.size()) + " tokens, expected " + std::to_string(expect_len));
      continue;
    }
    const std::vector<std::vector<float>>* rec = nullptr;
    if (const auto lt = run.logits.find(r.id); lt != run.logits.end()) rec = &lt->second;
    if (r.record_logits && (!rec || rec->size() != g.size())) {
      c.errors.push_back(who + ": " + std::to_string(rec ? rec->size() : 0) + " logits rows for " +
                         std::to_string(g.size()) + " tokens");
      continue;
    }
    const SamplingParams sp = r.sampling ? *r.sampling : run_sampling;
    const std::vector<int32_t>& fed = r.forced.empty() ? g : r.forced;
    const auto ref = reference_rows(w, kv, r.prompt, fed, g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      ++c.tokens;
      const std::vector<float>& R = ref[i];
      bool row_ok = false;
      if (rec) {
        ++c.rows;
        const double e = row_error((*rec)[i], R);
        c.worst_row_error = std::max(c.worst_row_error, e);
        row_ok = e <= row_tol;
        if (!row_ok) {
          char b[200];
          std::snprintf(b, sizeof b, "%s row %zu: logits differ from the reference by %.3e of max |logit| > %.1e",
                        who.c_str(), i, e, row_tol);
          c.errors.push_back(b);
        }
      }
      if (g[i] < 0 || g[i] >= V) {
        c.errors.push_back(who + " token " + std::to_string(i) + ": id " + std::to_string(g[i]) + " outside the vocabulary");
        continue;
      }
      const int32_t pick = sample_token(R.data(), V, sp, r.id, uint64_t(i));
      if (g[i] == pick) continue;
      bool admitted = false;
      if (near_tie > 0 && sp.greedy()) {
        double scale = 1e-30;
        for (float x : R) scale = std::max(scale, std::fabs(double(x)));
        admitted = (double(R[size_t(pick)]) - double(R[size_t(g[i])])) / scale <= near_tie;
      } else if (near_tie > 0 && rec && row_ok) {
        admitted = sample_token((*rec)[i].data(), V, sp, r.id, uint64_t(i)) == g[i];
      }
      if (admitted) {
        ++c.not_reference_pick;
      } else {
        c.errors.push_back(who + " token " + std::to_string(i) + ": " + std::to_string(g[i]) +
                           " where the reference picks " + std::to_string(pick) + (sp.greedy() ? " (greedy)" : " (sampled)"));
      }
    }
  }
  for (const auto& [id, toks] : run.tokens) {
    bool known = false;
    for (const Request& r : reqs) known |= r.id == id;
    if (!known) c.errors.push_back("tokens for request " + std::to_string(id) + ", which was not sent");
  }
  return c;
}

// A batch for the per-request fields (issue 11), ids 30..38: per-request sampling (the run's, greedy,
// top-k, top-p with two seeds, all three), teacher-forced requests (greedy, sampled, the run's) and logits
// recording on some (record_all: on every request, so a sampled pick can be judged against the engine's
// own row). Prompts of 3..19 tokens; 10..20 new tokens.
inline std::vector<Request> issue11_requests(const ModelConfig& c, bool record_all = false) {
  auto sp = [](double temperature, int64_t top_k, double top_p, uint64_t seed) {
    SamplingParams p;
    p.temperature = temperature, p.top_k = top_k, p.top_p = top_p, p.seed = seed;
    return p;
  };
  const int64_t gen[9] = {16, 16, 18, 14, 14, 20, 12, 12, 10};
  std::vector<Request> r;
  for (uint64_t i = 0; i < 9; ++i) {
    Request q;
    q.id = 30 + i;
    for (uint64_t t = 0; t < 3 + 2 * i; ++t) q.prompt.push_back(int32_t(3 + (i * 43 + t * 19) % uint64_t(c.vocab_size - 3)));
    q.max_new_tokens = gen[i];
    r.push_back(q);
  }
  r[1].sampling = sp(0, 0, 1, 0);  // greedy in a sampled run
  r[1].record_logits = true;
  r[2].sampling = sp(0.7, 8, 1, 11);
  r[3].sampling = sp(1.0, 0, 0.8, 11);
  r[3].record_logits = true;
  r[4].sampling = sp(1.0, 0, 0.8, 12);
  r[5].sampling = sp(1.3, 20, 0.9, 2);
  for (size_t k = 6; k < 9; ++k)
    for (int64_t i = 0; i < r[k].max_new_tokens; ++i)
      r[k].forced.push_back(int32_t(5 + (int64_t(k) * 61 + i * 37) % (c.vocab_size - 5)));
  r[6].sampling = sp(0, 0, 1, 0);  // forced, greedy picks
  r[6].record_logits = true;
  r[7].sampling = sp(1.0, 0, 1, 3);  // forced, sampled picks
  r[7].record_logits = true;
  if (record_all)
    for (Request& q : r) q.record_logits = true;
  return r;
}

}  // namespace fd::test
