#include "harness/run_recorders.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>

#include "fastdecode/core/clock.h"
#include "harness/runner.h"

namespace fd {

namespace fs = std::filesystem;

void TraceWriter::event(const std::string& track, const std::string& name, int64_t start_ns, int64_t dur_ns, json args) {
  json e = {{"name", name}, {"ph", "X"}, {"pid", 1}, {"tid", tid(track)},
            {"ts", double(start_ns - t0_) / 1e3}, {"dur", double(dur_ns) / 1e3}};
  if (!args.is_null()) e["args"] = std::move(args);
  events_.push_back(std::move(e));
}

json TraceWriter::finish(const json& provenance, const std::string& process) const {
  json all = json::array();
  all.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 1}, {"args", {{"name", process}}}});
  for (const auto& [track, id] : tids_)
    all.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", id}, {"args", {{"name", track}}}});
  for (const auto& e : events_) all.push_back(e);
  return {{"traceEvents", all}, {"displayTimeUnit", "ms"}, {"otherData", provenance}};
}

int TraceWriter::tid(const std::string& track) {
  auto it = tids_.find(track);
  if (it != tids_.end()) return it->second;
  const int id = int(tids_.size()) + 1;
  tids_[track] = id;
  return id;
}

Progress::Progress(bool enabled, int64_t total_tokens)
    : on_(enabled), tty_(isatty(fileno(stderr))), total_(total_tokens), t0_(now_ns()) {
  if (!tty_) {
    const char* e = std::getenv("FD_PROGRESS_INTERVAL_S");
    char* end = nullptr;
    const double v = e ? std::strtod(e, &end) : 10.0;
    interval_ns_ = int64_t(1e9 * (e && end != e && *end == '\0' && v >= 0 ? v : 10.0));
    last_ = t0_;  // the first line after one interval: a short run prints none
  }
}

void Progress::update(int64_t step, int64_t tokens, int64_t running, bool force) {
  if (!on_) return;
  const int64_t t = now_ns();
  if (!force && t - last_ < interval_ns_) return;
  if (!tty_ && force) return;  // the closing redraw: the summary follows
  last_ = t;
  const double s = double(t - t0_) / 1e9, rate = s > 0 ? double(tokens) / s : 0.0;
  const double eta = rate > 0 ? double(total_ - tokens) / rate : 0.0;
  std::fprintf(stderr, "%s  step %6lld | running %5lld | tokens %8lld / %lld | %9.1f tok/s | ETA %6.1f s  %s", tty_ ? "\r" : "",
               (long long)step, (long long)running, (long long)tokens, (long long)total_, rate, eta, tty_ ? "" : "\n");
  std::fflush(stderr);
}

void Progress::done() {
  if (on_ && tty_) std::fprintf(stderr, "\n");
}

// ---- StepRecorder

StepRecorder::StepRecorder(const fs::path& dir) : out_(dir / "steps.jsonl", std::ios::trunc) {
  if (!out_) FD_THROW((dir / "steps.jsonl").string() << ": cannot open for writing");
}

void StepRecorder::record(const StepResult& r, const StepEvent& ev) {
  const double ms = double(ev.end_ns - ev.start_ns) / 1e6;
  for (const auto& [k, v] : r.breakdown_ms) breakdown_total_[k] += v;
  for (const auto& [k, v] : r.counts) counts_total_[k] += v, steps_with_counts_[k] += v > 0;
  step_ms_.push_back(ms);
  stats_.push_back({ev.step, ms, r.prefill_tokens, r.decode_tokens, int64_t(r.tokens.size()), int64_t(r.tokens.size()),
                    r.total_context, ev.started, ev.finished});
  json phases = json::object();
  for (const auto& sp : r.spans) {
    trace_.event(sp.track, sp.name, sp.start_ns, sp.dur_ns);
    phases[sp.name] = phases.value(sp.name, 0.0) + double(sp.dur_ns) / 1e6;
  }
  // "step" counts engine steps (one line each); "sched_step" is the scheduler's step index, which
  // also advances over idle steps (nothing running, waiting for a slot or an arrival).
  json rec = {{"step", ev.step},
              {"sched_step", ev.sched_step},
              {"start_ms", double(ev.start_ns - t0_) / 1e6},
              {"step_ms", ms},
              {"running", r.tokens.size()},
              {"new_tokens", r.tokens.size()},
              {"finished", ev.finished},
              {"admitted", ev.admitted},
              {"started", ev.started},
              {"queued", ev.queued},
              {"prefill_tokens", r.prefill_tokens},
              {"decode_tokens", r.decode_tokens},
              {"total_context", r.total_context},
              {"phases_ms", phases},
              {"breakdown_ms", r.breakdown_ms}};
  if (!r.counts.empty()) rec["counts"] = r.counts;
  if (r.worker_kv_imbalance > 0) rec["worker_kv_imbalance"] = r.worker_kv_imbalance;
  imbalance_.push_back(r.worker_kv_imbalance);
  trace_.event("harness", "step " + std::to_string(ev.step), ev.start_ns, ev.end_ns - ev.start_ns,
               {{"tokens", r.tokens.size()}, {"total_context", r.total_context}});
  out_ << rec.dump() << "\n";
  out_.flush();
}

void StepRecorder::add_results(json& results) const {
  results["step_ms"] = distribution(step_ms_);
  // Decode-only steps and the steady window (harness/step_stats.h).
  results["decode_only"] = decode_only_stats(stats_);
  results["steady"] = steady_stats(stats_);
  // The busiest worker's KV tokens over the mean, per decode step (engines with workers): over the decode-only steps
  // and over the steady window's.
  if (json imb = worker_imbalance_stats(stats_, imbalance_); !imb.is_null()) results["worker_kv_imbalance"] = imb;
  // Mean per step of the engine's breakdown (e.g. S-Part compute, wait for R-workers, slowest R-worker).
  const int64_t steps = int64_t(stats_.size());
  json bd = json::object();
  for (const auto& [k, v] : breakdown_total_) bd[k] = steps > 0 ? v / double(steps) : 0.0;
  results["step_breakdown_ms_mean"] = bd;
  if (!counts_total_.empty()) {  // engine event counts (StepResult::counts), when the engine reports any
    results["counts_total"] = counts_total_;
    results["steps_with_counts"] = steps_with_counts_;
  }
}

// ---- RequestRecorder

RequestRecorder::RequestRecorder(const fs::path& dir, const std::vector<Request>& requests,
                                 const std::vector<double>& arrivals_s)
    : dir_(dir), live_(dir / "requests.jsonl", std::ios::trunc) {
  if (!live_) FD_THROW((dir / "requests.jsonl").string() << ": cannot open for writing");
  for (size_t i = 0; i < requests.size(); ++i) {
    Track& t = track_[requests[i].id];
    t.prompt = requests[i].prompt;
    t.arrival_ns = int64_t(arrivals_s[i] * 1e9);
  }
}

bool RequestRecorder::on_token(uint64_t id, int32_t token, int64_t t_ns) {
  Track& t = track_.at(id);
  const bool first = t.tokens.empty();
  t.tokens.push_back(token);
  t.token_ns.push_back(t_ns);
  return first;
}

void RequestRecorder::on_finished(uint64_t id) {
  live_ << record(id, track_.at(id)).dump() << "\n";
  live_.flush();
}

// One line of requests.jsonl (vLLM's metric names): TTFT from arrival to the first token; e2e = arrival to
// the last token; queueing = arrival to the step that admitted it.
json RequestRecorder::record(uint64_t id, const Track& t) {
  const double arrive = double(t.arrival_ns) / 1e6;
  const double first = double(t.token_ns.front()) / 1e6 - arrive, last = double(t.token_ns.back()) / 1e6 - arrive;
  return {{"id", id}, {"prompt_len", int64_t(t.prompt.size())}, {"output_len", t.tokens.size()}, {"arrival_ms", arrive},
          {"queue_ms", std::max(0.0, double(t.admit_ns) / 1e6 - arrive)}, {"ttft_ms", first}, {"e2e_ms", last},
          {"prompt", t.prompt}, {"tokens", t.tokens}};
}

// Per-request latency metrics (vLLM's names): TTFT from arrival to the first token; TPOT =
// (last - first) / (n - 1); ITL = every gap between consecutive tokens; queueing = arrival to the
// step that admitted it; e2e = arrival to the last token.
void RequestRecorder::finish() {
  live_.close();
  std::ofstream out(dir_ / "requests.jsonl", std::ios::trunc);
  for (const auto& [id, t] : track_) {
    FD_CHECK(!t.tokens.empty(), "request " << id << " produced no token");
    const json rec = record(id, t);
    const double first = rec["ttft_ms"].get<double>(), last = rec["e2e_ms"].get<double>();
    ttft_.push_back(first);
    e2e_.push_back(last);
    queue_.push_back(rec["queue_ms"].get<double>());
    const size_t n = t.tokens.size();
    if (n > 1) tpot_.push_back((last - first) / double(n - 1));
    latencies_.push_back({first, last, int64_t(n)});
    for (size_t i = 1; i < n; ++i) itl_.push_back(double(t.token_ns[i] - t.token_ns[i - 1]) / 1e6);
    out << rec.dump() << "\n";
  }
}

void RequestRecorder::add_results(json& results, const SloLimits& slo, double duration_s) const {
  results["ttft_ms"] = distribution(ttft_);
  results["tpot_ms"] = distribution(tpot_);
  results["itl_ms"] = distribution(itl_);
  results["e2e_latency_ms"] = distribution(e2e_);
  results["queue_ms"] = distribution(queue_);
  results["slo"] = slo_stats(slo.ttft_ms, slo.tpot_ms, slo.e2e_ms, latencies_, duration_s);
}

// ---- LogitsRecorder

namespace {

// logsumexp of one logits row, in double: log_softmax(row)[i] = row[i] - log_sum_exp(row).
double log_sum_exp(const std::vector<float>& row) {
  double m = -INFINITY;
  for (float x : row) m = std::max(m, double(x));
  double s = 0;
  for (float x : row) s += std::exp(double(x) - m);
  return m + std::log(s);
}

// The k largest entries of a row, larger first (ties: the smaller index first), as [token, logprob].
std::vector<std::pair<int32_t, double>> top_k_row(const std::vector<float>& logits, size_t k, double lse) {
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + std::ptrdiff_t(k), idx.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  });
  std::vector<std::pair<int32_t, double>> row;
  for (size_t q = 0; q < k; ++q) row.emplace_back(idx[q], double(logits[size_t(idx[q])]) - lse);
  return row;
}

}  // namespace

LogitsRecorder::LogitsRecorder(const ExperimentConfig& e, std::vector<Request>& requests, const fs::path& dir)
    : dir_(dir), vocab_(e.model.vocab_size), top_k_(e.logits.top_k), write_(e.logits.write),
      write_npy_(e.logits.write && e.logits.full), score_(e.workload.source == "score") {
  for (uint64_t id : e.logits.requests) {
    FD_CHECK(id < requests.size(), "output.logits names request " << id);
    requests[size_t(id)].record_logits = true;
    track_[id].forced = requests[size_t(id)].forced;
  }
  int64_t full = write_npy_ ? (e.logits.full_requests < 0 ? int64_t(track_.size()) : e.logits.full_requests) : 0;
  for (auto& [id, L] : track_) L.npy = full-- > 0;  // all recorded requests, or the first N (output.logits.full)
  if (write_npy_) fs::create_directories(dir / "logits");
}

void LogitsRecorder::on_token(const GeneratedToken& t, const Engine& engine) {
  auto it = track_.find(t.request_id);
  if (it == track_.end()) return;
  Track& L = it->second;
  if (int64_t(t.logits.size()) != vocab_)
    FD_THROW("engine " << engine.name() << " returned " << t.logits.size() << " logits for request " << t.request_id
                       << " (record_logits asks for " << vocab_ << " per token): this engine does not record logits");
  const size_t pos = size_t(L.positions++);
  const double lse = log_sum_exp(t.logits);
  if (!L.forced.empty()) {
    FD_CHECK(pos < L.forced.size(), "request " << t.request_id << " generated past its forced continuation");
    L.nll_sum -= double(t.logits[size_t(L.forced[pos])]) - lse;
  }
  if (write_ && top_k_ > 0) L.top.push_back(top_k_row(t.logits, size_t(top_k_), lse));
  if (L.npy) L.rows.insert(L.rows.end(), t.logits.begin(), t.logits.end());
  if (t.finished && L.npy) {  // written as soon as the request is done: rows do not pile up
    write_npy_f32((dir_ / "logits" / ("request_" + std::to_string(t.request_id) + ".npy")).string(), L.rows.data(),
                  L.positions, vocab_);
    std::vector<float>().swap(L.rows);
  }
}

json LogitsRecorder::finish(const RequestRecorder& requests) const {
  if (write_) write_logits_jsonl(requests);
  return score_ ? write_score_jsonl() : json();
}

// logits.jsonl: one line per recorded request.
void LogitsRecorder::write_logits_jsonl(const RequestRecorder& requests) const {
  std::ofstream lo(dir_ / "logits.jsonl", std::ios::trunc);
  if (!lo) FD_THROW((dir_ / "logits.jsonl").string() << ": cannot open for writing");
  for (const auto& [id, L] : track_) {
    json rec = {{"request", id}, {"tokens", requests.tokens(id)}};
    if (!L.forced.empty()) rec["forced"] = L.forced;
    if (write_npy_ && !L.npy) rec["full"] = false;  // no logits/request_ID.npy for it
    if (top_k_ > 0) {
      json top = json::array();
      for (const auto& row : L.top) {
        json r = json::array();
        for (const auto& [tok, lp] : row) r.push_back({tok, lp});
        top.push_back(std::move(r));
      }
      rec["top"] = std::move(top);
    }
    lo << rec.dump() << "\n";
  }
}

// score.jsonl: one line per scored request; returns the run's score.
json LogitsRecorder::write_score_jsonl() const {
  std::ofstream so(dir_ / "score.jsonl", std::ios::trunc);
  if (!so) FD_THROW((dir_ / "score.jsonl").string() << ": cannot open for writing");
  double nll = 0;
  int64_t n = 0;
  for (const auto& [id, L] : track_) {
    FD_CHECK(L.positions == int64_t(L.forced.size()),
             "request " << id << ": " << L.positions << " scored positions for " << L.forced.size() << " forced tokens");
    const double mean = L.nll_sum / double(L.positions);
    so << json{{"request", id}, {"tokens", L.positions}, {"nll_sum", L.nll_sum}, {"nll_mean", mean}, {"ppl", std::exp(mean)}}.dump()
       << "\n";
    nll += L.nll_sum;
    n += L.positions;
  }
  return {{"requests", track_.size()}, {"tokens", n}, {"nll_sum", nll},
          {"mean_nll", n ? nll / double(n) : 0.0}, {"perplexity", n ? std::exp(nll / double(n)) : 0.0}};
}

}  // namespace fd
