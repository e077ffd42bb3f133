// The recorders of a run: what harness/runner.cpp's step loop tells them, and what each writes into the run
// folder. The loop drives the engine and the scheduler; these keep the measurements and the files out of it
// (as vLLM's metrics and llm.c's logger are kept apart from their loops).
//
//   StepRecorder     steps.jsonl (a line per engine step, flushed), trace.json's events, and the per-step
//                    statistics of summary.json (step_ms, decode_only, steady, worker_kv_imbalance, the
//                    engine's breakdown and counts)
//   RequestRecorder  per-request arrival, admission and token times; requests.jsonl (a line per finished
//                    request as it finishes, rewritten in id order at the end) and the latency metrics
//                    (ttft, tpot, itl, e2e, queue, slo)
//   LogitsRecorder   the requests that record logits (output.logits, workload.score): per-token reduction
//                    (score, top-K), logits/request_ID.npy (all recorded requests or the first N),
//                    logits.jsonl, score.jsonl and summary.json's "score"
//   Progress         the progress line on stderr
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "fastdecode/core/json_util.h"
#include "fastdecode/engine/engine.h"
#include "harness/experiment.h"
#include "harness/step_stats.h"

namespace fd {

// Chrome Trace Event format (opens in Perfetto / chrome://tracing): complete events ("ph": "X") with
// microsecond timestamps from the run's start; one thread id per track.
class TraceWriter {
 public:
  explicit TraceWriter(int64_t t0_ns) : t0_(t0_ns) {}
  void event(const std::string& track, const std::string& name, int64_t start_ns, int64_t dur_ns, json args = {});
  json finish(const json& provenance, const std::string& process) const;

 private:
  int tid(const std::string& track);
  int64_t t0_;
  std::map<std::string, int> tids_;
  json events_ = json::array();
};

// Progress: steps, tokens/s, ETA. On a terminal one line, redrawn at most ~10 times a second; otherwise (a log file, a
// pipe) a line every FD_PROGRESS_INTERVAL_S seconds (default 10; 0: every step), so a run logged to a file shows it.
class Progress {
 public:
  Progress(bool enabled, int64_t total_tokens);
  void update(int64_t step, int64_t tokens, int64_t running, bool force = false);
  void done();

 private:
  bool on_, tty_;
  int64_t total_, t0_, last_ = 0, interval_ns_ = 100'000'000;
};

// What the loop saw of one engine step, besides the engine's StepResult. Times are fd::now_ns().
struct StepEvent {
  int64_t step = 0;        // engine steps before this one (steps.jsonl "step")
  int64_t sched_step = 0;  // the scheduler's step index (also advances over idle steps)
  int64_t start_ns = 0, end_ns = 0;
  size_t admitted = 0;     // requests the scheduler admitted at this step
  int64_t started = 0;     // sequences whose first token came this step
  int64_t finished = 0;    // sequences that finished this step
  int64_t queued = 0;      // submitted, not yet admitted, after the step
};

class StepRecorder {
 public:
  // Opens steps.jsonl in `dir` (a line per step, flushed, so a run that fails keeps what it did).
  explicit StepRecorder(const std::filesystem::path& dir);
  // Time 0 of steps.jsonl's start_ms and of the trace: the start of the first step.
  void start(int64_t t0_ns) { t0_ = t0_ns, trace_ = TraceWriter(t0_ns); }
  // One engine step: its steps.jsonl line, its trace events (the engine's spans, then the harness's step).
  void record(const StepResult& r, const StepEvent& ev);
  void close() { out_.close(); }
  // results.step_ms, decode_only, steady, worker_kv_imbalance, step_breakdown_ms_mean, counts_total and
  // steps_with_counts.
  void add_results(json& results) const;
  const TraceWriter& trace() const { return trace_; }

 private:
  std::ofstream out_;
  int64_t t0_ = 0;
  TraceWriter trace_{0};
  std::vector<double> step_ms_;
  std::vector<StepStat> stats_;     // for results.decode_only / steady (harness/step_stats.h)
  std::vector<double> imbalance_;   // per step, aligned with stats_: StepResult::worker_kv_imbalance (0: none)
  std::map<std::string, double> breakdown_total_;
  std::map<std::string, int64_t> counts_total_, steps_with_counts_;  // StepResult::counts: sum, steps where > 0
};

class RequestRecorder {
 public:
  // Every request of the run, in id order, with its arrival (seconds from time 0); opens requests.jsonl in `dir`.
  RequestRecorder(const std::filesystem::path& dir, const std::vector<Request>& requests,
                  const std::vector<double>& arrivals_s);
  void on_admit(uint64_t id, int64_t t_ns) { track_.at(id).admit_ns = t_ns; }
  // A token of request `id` produced at t_ns (from time 0); true when it is the request's first.
  bool on_token(uint64_t id, int32_t token, int64_t t_ns);
  // The request's last token came: its line is appended to requests.jsonl (and flushed).
  void on_finished(uint64_t id);
  const std::vector<int32_t>& tokens(uint64_t id) const { return track_.at(id).tokens; }
  // Closes the live file and rewrites requests.jsonl in id order; every request must have produced a token.
  // Then results.ttft_ms, tpot_ms, itl_ms, e2e_latency_ms, queue_ms and slo (over duration_s).
  void finish();
  void add_results(json& results, const SloLimits& slo, double duration_s) const;

 private:
  struct Track {
    std::vector<int32_t> prompt;
    int64_t arrival_ns = 0, admit_ns = 0;  // from time 0
    std::vector<int32_t> tokens;
    std::vector<int64_t> token_ns;  // time each token was produced (end of its step), from time 0
  };
  static json record(uint64_t id, const Track& t);
  std::filesystem::path dir_;
  std::ofstream live_;
  std::map<uint64_t, Track> track_;
  std::vector<double> ttft_, tpot_, itl_, e2e_, queue_;  // filled by finish()
  std::vector<RequestLatency> latencies_;                // for results.slo
};

class LogitsRecorder {
 public:
  // Marks the requests that record their logits (output.logits, or every request of a score run) in
  // `requests`, picks those whose full rows are written (output.logits.full: all, or the first N), and
  // makes `dir`/logits/ when any are.
  LogitsRecorder(const ExperimentConfig& e, std::vector<Request>& requests, const std::filesystem::path& dir);
  // A generated token: when its request records logits, its row is reduced as it comes (score, top-K) and kept
  // only for a .npy file, written when the request finishes. `engine` is named in errors.
  void on_token(const GeneratedToken& t, const Engine& engine);
  // logits.jsonl (output.logits given), then score.jsonl (score runs). Returns summary.json's "score" (null
  // when not a score run). `requests` gives each recorded request's tokens.
  json finish(const RequestRecorder& requests) const;

 private:
  // What the runner keeps of one request that records its logits.
  struct Track {
    std::vector<int32_t> forced;                               // score runs: the continuation
    std::vector<std::vector<std::pair<int32_t, double>>> top;  // per position: top-K [token, logprob]
    std::vector<float> rows;                                   // full: [positions, vocab], freed once written
    int64_t positions = 0;
    double nll_sum = 0;                                        // score: -sum log p(forced[i])
    bool npy = false;                                          // its full rows go to logits/request_ID.npy
  };
  void write_logits_jsonl(const RequestRecorder& requests) const;
  json write_score_jsonl() const;
  std::filesystem::path dir_;
  int64_t vocab_ = 0, top_k_ = 0;
  bool write_ = false, write_npy_ = false, score_ = false;
  std::map<uint64_t, Track> track_;
};

}  // namespace fd
