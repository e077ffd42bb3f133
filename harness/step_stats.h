// Steady-state and decode-only statistics of a run from its per-step records: the one definition used
// by fd-bench (harness/runner.cpp) and fd-sim, so both write the same summary.json fields
// (docs/EXPERIMENTS.md, "Run folder").
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fastdecode/core/json_util.h"

namespace fd {

// One step as the statistics see it.
struct StepStat {
  int64_t step = 0;                // the program's step index (steps.jsonl "step")
  std::optional<double> step_ms;   // absent: the step's time is unknown (fd-sim without a cost model)
  int64_t prefill_tokens = 0;      // prompt tokens processed this step
  int64_t decode_tokens = 0;       // single-token decode inputs this step
  int64_t new_tokens = 0;          // tokens produced this step
  int64_t running = 0;             // sequences that ran this step
  int64_t total_context = 0;       // sum of the context lengths attended
  int64_t admitted = 0;            // sequences that joined the batch this step (their first token came now)
  int64_t finished = 0;            // sequences that finished this step
};

// A step is decode-only when it processed no prompt token and decoded at least one sequence (the rule
// of analysis/fd_runs.py decode_steps).
bool decode_only(const StepStat& s);

// The steady window: the steps strictly between the last admission and the first finish, whichever comes
// first (all-at-once: after the admission ramp, before the first finish; continuous arrivals: after the
// first finish, before the last admission). When that holds no step, the whole run (whole_run true).
struct SteadyWindow {
  size_t begin = 0, end = 0;  // [begin, end) indices into the steps
  int64_t first_step = -1, last_step = -1;  // step indices of the first and last step in it (-1: no step)
  bool whole_run = false;
  std::string rule;           // which of the above, with the steps that bound it
};
SteadyWindow steady_window(const std::vector<StepStat>& steps);

// results.decode_only: {steps, tokens (decode tokens), tokens_per_s, step_ms (distribution)} over the
// decode-only steps; tokens_per_s and step_ms are null when a step time is unknown.
json decode_only_stats(const std::vector<StepStat>& steps);

// results.steady: {first_step, last_step, steps, rule, tokens (new tokens), tokens_per_s (over the
// window's summed step time), step_ms, decode_step_ms (its decode-only steps), mean_batch (decode tokens
// per step), mean_total_context}; the time-based fields are null when a step time is unknown.
json steady_stats(const std::vector<StepStat>& steps);

// results.worker_kv_imbalance: {decode_only, steady}, the distributions of per-step values (the busiest R-worker's KV
// tokens over the mean; `per_step` aligned with `steps`, <= 0 where a step has none) over the decode-only steps and
// over those of the steady window. Null when no step has a value.
json worker_imbalance_stats(const std::vector<StepStat>& steps, const std::vector<double>& per_step);

// A finished request's latencies as the SLO sees them (requests.jsonl: ttft_ms, e2e_ms, output_len).
struct RequestLatency {
  double ttft_ms = 0, e2e_ms = 0;
  int64_t output_tokens = 0;
};
// results.slo (fd-bench, fd-sim): the limits given (ms; nullopt: none), how many requests met every one of them
// (TPOT = (e2e - ttft) / (output tokens - 1), 0 for a one-token request, as vLLM's bench serve takes it), the attainment
// (good / all), goodput (good requests / duration_s, vLLM's and AIPerf's "goodput") and the good requests' output
// tokens / duration_s. With no limit: {"limits": null} and the rest null.
json slo_stats(std::optional<double> ttft_ms, std::optional<double> tpot_ms, std::optional<double> e2e_ms,
               const std::vector<RequestLatency>& requests, double duration_s);

// results.full_depth_equivalent, from a reduced-depth run's results (output_throughput,
// decode_only.tokens_per_s, steady.tokens_per_s): each rate times layers / full_layers, assuming step time
// linear in the layer count with no fixed part (Fig. 8). Null when layers >= full_layers.
json full_depth_equivalent(int64_t layers, int64_t full_layers, const json& results);

}  // namespace fd
