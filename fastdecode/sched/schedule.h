// Sequence-level admission (SLS / load control, paper §"序列级负载稳定调度", Algorithm 1) as pure logic
// over a step counter. No engine, no clock of its own: the caller says which step it is about to run and
// what time it is; the scheduler answers which requests start at that step.
//
// Shapes and units
//   step        int64, 0-based index of an engine iteration (one token per running sequence).
//   now_s       double, seconds since the run started (simulated or wall clock; only compared with
//               arrival_s).
//   lengths     tokens (int64). prompt_len p >= 0; max_gen_len g >= 1 = tokens the request may generate
//               (its max_new_tokens: the only length the scheduler knows in advance).
//   loads       tokens (int64): "total context".
//
// Life of a sequence (the convention every mode, test and fd-sim uses)
//   A request admitted at step a runs at steps a, a+1, ..., a+g-1 and produces its k-th token at step
//   a+k-1 (k = 1..g; step a is its prefill + first token, as the Engine's add()/step() do). It finishes
//   at step a+g-1, or earlier (EOS): the caller reports that with on_finished().
//   Context of the sequence at step t (life step k = t-a+1):  ctx(t) = p + k
//     = prompt + tokens generated so far, counted after the step's append. (The KV actually stored is
//     p + k - 1 — the newest token is appended on the next step — so ctx is an upper bound, by one token
//     per sequence, of KV memory: memory checks on ctx are safe.)
//   Total context at step t:  W(t) = sum over sequences running at t of ctx(t).
//   With p = 0 and g = S for all, B sequences started together peak at W = B·S on their last step.
//
// Projection: for a running sequence the scheduler assumes it runs to its max length (finish step
// e = a + g_max - 1). An early finish (on_finished before e) removes its future load at once, so a later
// admission can come earlier than projected. Projected load is therefore never below the actual load.
//
// Modes (SchedulerConfig::mode)
//   all-at-once     static batching: when nothing is running, start up to B arrived requests together;
//                   the next batch starts only after every sequence of this one has finished.
//   fixed-interval  SLS: micro-batches every F steps. Slot j gets M_j = floor((j+1)·B·F/S) -
//                   floor(j·B·F/S) requests (cumulative rounding: every slot gets floor(B·F/S) or
//                   ceil(B·F/S), the long-run mean is exactly B·F/S, and S/F consecutive slots start
//                   exactly B sequences when S/F is an integer). Slot j is taken at the first step
//                   >= next_slot at which at least one request has arrived (offline: steps 0, F, 2F, ..);
//                   then next_slot = that step + F. Fewer arrived than M_j: the slot starts what there is.
//   load-control    Algorithm 1 by its definition: the next micro-batch (up to m arrived requests,
//                   FIFO) starts at the current step s iff, with its projected load added,
//                       for every step t >= s:  W_proj(t) <= W_lim
//                   where W_proj counts running sequences to their max length and the candidates as
//                   admitted at s. Several micro-batches may start at the same step. Called at every
//                   step, this admits each micro-batch at the earliest feasible step at or after the step
//                   it reached the head of the queue (no off-by-one: the check is the definition itself,
//                   evaluated over the whole future, not the paper's closed form). When nothing is
//                   running and a whole micro-batch still exceeds W_lim, its longest FIFO prefix that
//                   fits starts instead (progress guarantee). Optional pacing min_gap: at most one
//                   micro-batch per step and >= min_gap steps between them (then the earliest step is
//                   max(previous + min_gap, earliest feasible)). Without pacing, the greedy rule started
//                   with a full queue admits W_lim/(m·S) micro-batches in phase at step 0 and keeps
//                   that clumped pattern (see docs/SCHEDULING.md); min_gap = F with W_lim = B(S+F)/2
//                   reproduces fixed-interval exactly. Optional cap on the
//                   number of running sequences (max_running, e.g. the B the GPU batch is sized for).
//   Memory (all modes, optional): kv_capacity_tokens C. Nothing is admitted whose projected load would
//   make W_proj(t) > C at any future step t — as the projection is an upper bound of the actual KV, an
//   R-worker never runs out of memory. In all-at-once / fixed-interval the longest FIFO prefix that fits
//   starts (the rest waits for the next batch / slot; a slot that admits nothing is not consumed).
//   C is the aggregate over R-workers: it assumes placement keeps workers balanced (pass
//   sum(per-worker capacity) - P·(max sequence length) to be safe against imbalance).
//
// A request whose own peak p + g exceeds W_lim (load-control) or C can never start: submit() refuses it
// (ConfigError) rather than let the queue block forever.
//
// How a harness drives it (engine-agnostic):
//   Scheduler s(cfg); for each request: s.submit({id, arrival_s, prompt_len, max_gen_len});
//   for (step = 0; !s.done(); ++step) {
//     for (id : s.admit(step, now_s)) engine.add(request id);    // they start in this step
//     result = engine.step();
//     for (each finished token) s.on_finished(id, step);          // frees its load at once
//   }
//   When nothing runs and nothing has arrived, wait until next_arrival_s() (the step counter need not
//   advance during idle time).
#pragma once
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace fd {

using RequestId = uint64_t;

struct SchedRequest {
  RequestId id = 0;
  double arrival_s = 0.0;    // seconds since the run started
  int64_t prompt_len = 0;    // tokens, >= 0
  int64_t max_gen_len = 1;   // tokens, >= 1 (what the scheduler projects with)
};

enum class AdmitMode { AllAtOnce, FixedInterval, LoadControl };
// "all-at-once" | "fixed-interval" | "load-control"; ConfigError otherwise.
AdmitMode parse_admit_mode(const std::string& s);
std::string to_string(AdmitMode m);

struct SchedulerConfig {
  AdmitMode mode = AdmitMode::AllAtOnce;
  int64_t batch = 1;               // B: sequences started together (all-at-once); target batch (others)
  int64_t seq = 1;                 // S: steps a sequence lives (generation length), for M = B·F/S
  int64_t interval = 1;            // F: steps between micro-batches (fixed-interval; default m)
  int64_t micro_batch = 0;         // load-control m; 0 = ceil(B·F/S)
  int64_t w_lim = 0;               // load-control limit on W_proj(t), tokens (required, > 0)
  int64_t max_running = 0;         // load-control: at most this many running; 0 = no cap
  int64_t min_gap = 0;             // load-control: >= this many steps between micro-batches; 0 = none
  int64_t kv_capacity_tokens = 0;  // memory cap on W_proj(t), tokens; 0 = unlimited
  // An engine may start an admitted request later than the step that admitted it (its prefill budget
  // per step, or no free cache slot): then its projected life slides with time until on_started()
  // fixes it. fd-bench sets this; fd-sim (no engine) leaves it off: admitted = started.
  bool deferred_starts = false;
};
// Throws ConfigError naming the field for out-of-range values.
void validate(const SchedulerConfig& c);

// Size of fixed-interval slot j: floor((j+1)·B·F/S) - floor(j·B·F/S).
int64_t fixed_interval_slot_size(int64_t batch, int64_t interval, int64_t seq, int64_t slot);

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& cfg);

  // Queues a request. Arrival times must be non-decreasing in submission order (FIFO = arrival order).
  void submit(const SchedRequest& r);
  // Requests that start at `step` (call once per step, steps increasing; now_s non-decreasing). Only
  // requests with arrival_s <= now_s are considered.
  std::vector<RequestId> admit(int64_t step, double now_s);
  // The sequence produced its last token at `step` (EOS or max length): its load is gone from step+1.
  void on_finished(RequestId id, int64_t step);
  // (deferred_starts) The engine started the admitted request at `step` (its first token).
  void on_started(RequestId id, int64_t step);
  // After a step: `advanced` are the sequences that produced a token in it. Every started sequence that did
  // not (an engine that pauses sequences: paged-swap's prefill-only steps, its preempted or swapped-out
  // sequences) has its projected life slid by one step, so the projection keeps matching what runs.
  void on_step_done(const std::vector<RequestId>& advanced);

  const SchedulerConfig& config() const { return cfg_; }
  int64_t running() const { return int64_t(running_.size()); }
  int64_t queued() const { return int64_t(queue_.size()); }       // submitted, not yet admitted
  int64_t arrived(double now_s) const;                              // of those, arrived by now_s
  std::optional<double> next_arrival_s() const;                     // head of queue's arrival
  bool done() const { return queue_.empty() && running_.empty(); }

  // Projected total context of the running sequences at step t (each to its max length).
  int64_t projected_load(int64_t t) const;
  // Projected W(t) for t = from .. from+n-1 of the running sequences plus `batch` admitted at `from`.
  std::vector<int64_t> projected_profile(int64_t from, int64_t n, const std::vector<SchedRequest>& batch) const;
  // The limit admissions respect: min(W_lim (load-control), C); INT64_MAX when neither applies.
  int64_t load_limit() const;
  // True iff `batch` started at step s keeps W_proj(t) <= load_limit() for every t >= s.
  bool fits(int64_t s, const std::vector<SchedRequest>& batch) const;
  // Smallest s >= from with fits(s, batch) (scans; the running set as it is now). For analysis/tests.
  int64_t earliest_feasible_step(int64_t from, const std::vector<SchedRequest>& batch) const;

 private:
  struct Running {
    int64_t admit_step, prompt_len, max_gen_len;
    bool started = true;  // false while an engine has not started it (deferred_starts)
    int64_t last_step() const { return admit_step + max_gen_len - 1; }
  };
  void start(const SchedRequest& r, int64_t step, std::vector<RequestId>& out);
  void retire_past(int64_t step);
  // Largest FIFO prefix (of at most `limit` arrived requests) that fits at `step`.
  int64_t fitting_prefix(int64_t step, double now_s, int64_t limit) const;

  SchedulerConfig cfg_;
  std::deque<SchedRequest> queue_;
  std::unordered_map<RequestId, Running> running_;
  int64_t last_step_ = -1;
  double last_arrival_ = 0.0;
  // fixed-interval state
  int64_t slot_ = 0, next_slot_ = 0;
  // load-control pacing
  int64_t last_lc_admit_ = -1;
};

// ---- workloads for the scheduler: online arrivals -------------------------------------------------

// n Poisson arrival times (seconds, increasing) with the given mean rate (requests/s): exponential
// inter-arrival gaps by inverse CDF, -ln(1-U)/rate, U uniform in [0,1) from fd::splitmix64 of
// (seed, index). Same (n, rate, seed) -> same times on every machine (up to std::log's last ulp).
std::vector<double> poisson_arrivals(int64_t n, double rate_per_s, uint64_t seed);

// One request of a trace file.
struct TraceRequest {
  double arrival_s = 0.0;
  int64_t prompt_len = 0;
  int64_t gen_len = 1;      // tokens it actually generates
  int64_t max_gen_len = 1;  // what the scheduler is told (optional key; default gen_len)
};
// JSONL, one object per line: {"arrival_s": s, "prompt_len": p, "gen_len": g[, "max_gen_len": G]};
// blank lines are skipped. Strict: unknown keys, missing keys, wrong types, negative or non-finite
// times, p < 0, g < 1, G < g, arrival times decreasing -> ConfigError "FILE:LINE: what".
std::vector<TraceRequest> load_trace_jsonl(const std::string& path);

}  // namespace fd
