// Hybrid GPU + CPU attention placement (issue 17; the idea after NEO, MLSys'25): every running sequence's
// KV lives on one side, the GPU's KV pool or one R-worker; the S-Part runs over all of them as one batch.
// This file is the placement controller the hybrid engine (extensions/hybrid) calls and the static model
// fd-bench plan prints (docs/SCHEDULING.md, "Hybrid placement"; docs/HYBRID.md).
//
// Cost model, per layer, in seconds (n running, W_g / n_g context tokens / sequences on the GPU,
// W_w / n_w on R-worker w, M tokens of KV moved between sides in this step):
//   GPU side  G = k_s·T(n) + k_g·(a·W_g + a_s·n_g)       S-Part of the whole batch + GPU attention
//   CPU side  C = e + max_w k_w·(f_w + r_w·W_w + o_w·n_w) (0 when no sequence is on the CPUs; e = the
//                                                        fixed cost of engaging them, per layer; f_w a
//                                                        worker's fixed cost per ATTEND, counted when n_w > 0)
//   step      = max(G, C) + m·M                           CPU attention hidden behind GPU work; a KV
//                                                        move is serial, counted in the step it costs
// k_s, k_g, k_w, k_m are measured / modelled ratios learned online (EWMA over steps) starting at 1
// (the profile's prior rates).
#pragma once
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "fastdecode/core/json_util.h"
#include "fastdecode/sched/perf_model.h"

namespace fd {

struct WorkerCost {
  double s_per_token = 0;  // r_w: attention seconds per context token per layer
  double s_per_seq = 0;    // o_w: per sequence per layer (request framing, q/k/v and output transfer)
  double s_per_call = 0;   // f_w: per ATTEND (one layer), whatever it holds: waking the worker's threads
  // f_w + r_w·tokens + o_w·seqs, or 0 for a worker with no sequence.
  double cost(int64_t tokens, int64_t seqs) const {
    return seqs > 0 ? s_per_call + s_per_token * double(tokens) + s_per_seq * double(seqs) : 0;
  }
};

struct HybridRates {
  TTable s_part;                // T(n), seconds per layer for the whole batch
  double gpu_s_per_token = 0;   // a
  double gpu_s_per_seq = 0;     // a_s
  std::vector<WorkerCost> workers;
  double engage_s = 0;          // e
  double move_s_per_token = 0;  // m: moving one token of KV of one layer between the sides
  void validate() const;        // ConfigError naming the field
};

// What a step runs: sequences and context tokens per side.
struct HybridLoad {
  int64_t gpu_seqs = 0, gpu_tokens = 0;
  std::vector<int64_t> w_seqs, w_tokens;  // one entry per R-worker
  int64_t move_tokens = 0;
  int64_t batch() const;
};

struct StepCost {  // per layer, seconds
  double s_part = 0, gpu_attn = 0, gpu_side = 0, cpu_side = 0, move = 0, step = 0;
  std::string binds;  // "gpu" or "cpu" (the larger side; "gpu" on a tie)
};
// scale: k_s, k_g, k_m and one k_w per worker (empty = all 1).
struct RateScale {
  double s_part = 1, gpu = 1, move = 1;
  std::vector<double> workers;
};
StepCost step_cost(const HybridRates& r, const RateScale& k, const HybridLoad& l);
json to_json(const StepCost& c);

// ---- the controller ----
enum class HybridMode { Auto, AllGpu, AllCpu, FixedFraction };

struct HybridControllerConfig {
  HybridMode mode = HybridMode::Auto;
  double cpu_fraction = 0;  // fixed-fraction: round(f·n) of the n running sequences on the CPUs
  double min_gain = 0.02;   // auto: the CPUs are used only when the best split's modelled step is below
                            // (1 - min_gain) x GPU-only's (nothing to gain -> nothing on the CPUs)
  double ewma = 0.8;        // weight of the old ratio when a measured step updates it
  int64_t max_moves_per_step = 4;
  double payback = 2;       // a move must repay payback x its cost over the sequence's remaining steps
  // JSON keys: mode ("auto" | "all-gpu" | "all-cpu" | "fixed-fraction"), cpu_fraction, min_gain, ewma,
  // max_moves_per_step, payback.
  static HybridControllerConfig parse(StrictObject& o);
  json to_json() const;
};

struct KvPool {
  int64_t blocks = 0;
  int64_t block_tokens = 1;  // a contiguous cache of max_context slots: block_tokens = max_context
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_tokens - 1) / block_tokens; }
};

struct Placement {
  bool on_gpu = true;
  int worker = -1;  // the R-worker when !on_gpu
  bool operator==(const Placement& o) const { return on_gpu == o.on_gpu && worker == o.worker; }
};
struct Admission {
  bool admitted = false;
  Placement where;
  std::string reason;  // why it waits (no room, or it would lower tokens/s)
};
struct Move {
  int64_t id = 0;
  Placement from, to;
  int64_t tokens = 0;  // context moved (every layer of it)
};

// What the engine measured in one step: totals over the `layers` layers it ran; < 0 = not measured.
struct WorkerMeasure {
  double compute_s = -1;
  int64_t tokens = 0, seqs = 0;
};
struct StepMeasure {
  int64_t layers = 1;
  int64_t batch = 0;
  double s_part_s = -1;
  double gpu_attn_s = -1;
  int64_t gpu_tokens = 0, gpu_seqs = 0;
  std::vector<WorkerMeasure> workers;  // empty or one per R-worker
  double move_s = -1;
  int64_t move_tokens = 0;
};

// Reservations are by projected peak (prompt + max_new_tokens), as the scheduler projects: a pool never
// overflows, so no move is forced; moves happen when they pay (or to hold a forced fraction).
class HybridController {
 public:
  HybridController(HybridControllerConfig cfg, HybridRates prior, KvPool gpu, std::vector<KvPool> workers);

  // A new sequence: `context` tokens of KV after its prefill (on the GPU; placing it on a CPU moves
  // them, counted in this step), `peak` its projected maximum. Not admitted: the engine keeps it queued.
  Admission admit(int64_t id, int64_t context, int64_t peak);
  void finish(int64_t id);
  // Migrations for the coming step, already applied to the placement; their KV is counted in predict().
  std::vector<Move> plan_moves();
  StepCost predict() const;              // the coming step as placed (with this step's moves)
  void observe(const StepMeasure& m);    // learn the ratios from a measured step
  void advance();                        // after a step: each running context +1; move count reset

  Placement where(int64_t id) const;     // ConfigError-free: FD_CHECK that id runs
  int64_t running() const { return int64_t(seqs_.size()); }
  int64_t cpu_running() const;
  int64_t combined_capacity_tokens() const;  // GPU pool + every R-worker pool (the scheduler's C)
  const HybridLoad& load() const { return load_; }
  const RateScale& scale() const { return k_; }
  HybridRates learned_rates() const;     // the prior rates times the learned ratios
  bool cpu_engaged() const { return engaged_; }  // the last auto decision
  int64_t moves_total() const { return moves_total_; }

 private:
  struct Seq {
    int64_t ctx = 0, peak = 0;
    Placement at;
  };
  int64_t blocks_on(const Placement& p, int64_t peak) const;
  bool room(const Placement& p, int64_t peak) const;
  void place(int64_t id, Seq s);           // add to the loads
  Seq unplace(int64_t id);                 // remove from the loads
  double cost_now() const;                 // modelled step per layer, moves not counted
  double cost_if(const Placement& p, int64_t ctx, int delta) const;  // with one sequence added (+1) / removed (-1)
  int best_worker(int64_t ctx, int64_t peak) const;  // least loaded after adding, with room; -1 if none
  bool decide_engaged() const;             // longest-first prefixes: does some split beat GPU-only?
  void move(int64_t id, const Placement& to, std::vector<Move>& out);

  HybridControllerConfig cfg_;
  HybridRates r_;
  RateScale k_;
  KvPool gpu_;
  std::vector<KvPool> pools_;
  int64_t gpu_used_ = 0;
  std::vector<int64_t> pool_used_;
  HybridLoad load_;
  std::map<int64_t, Seq> seqs_;
  bool engaged_ = false;
  int64_t moves_total_ = 0;
};

// ---- the static model (fd-bench plan), MODELLED ----
struct HybridModelInput {
  TTable t;
  int64_t layers = 1;
  int64_t batch = 1;           // sequences wanted
  double context = 0;          // mean context per sequence
  double reserve_tokens = 0;   // tokens reserved per sequence (its peak)
  double gpu_s_per_token = 0;  // a
  double cpu_s_per_token = 0;  // R / P: all R-worker CPUs together
  double cpu_s_per_seq = 0;
  double cpu_s_per_call = 0;   // f: a worker's fixed cost per ATTEND (the workers run in parallel: once per layer)
  // > 0: the CPU side is this many equal workers and a sequence lives whole on one of them, so k sequences cost
  // a worker's share of ceil(k / W) (W x the side's per-token and per-sequence rates each); 0: a fluid CPU side.
  int64_t cpu_workers = 0;
  double gpu_s_per_seq = 0;    // a_s
  double engage_s = 0;
  double gpu_capacity_tokens = std::numeric_limits<double>::infinity();
  double cpu_capacity_tokens = std::numeric_limits<double>::infinity();
  double min_gain = 0.02;
};
struct HybridModelPoint {
  int64_t batch = 0, cpu_seqs = 0;
  double step_s = 0;        // N layers
  double tokens_per_s = 0;
  std::string binds;
};
struct HybridPlan {
  HybridModelPoint hybrid, gpu_only, fastdecode;
};
HybridPlan model_hybrid(const HybridModelInput& in);
// The static model's rates from measured ones (the hybrid engine's engine_info.prior): T(n), a, a_s and e as
// they are; the R-workers as one CPU side that spreads whole sequences evenly (per token 1 / sum 1/r_w, per
// sequence 1 / sum 1/o_w, per call the largest f_w, cpu_workers their count). Layers, batch, context and capacities
// are left to the caller.
HybridModelInput hybrid_model_input(const HybridRates& r);
// Rates from JSON: a hybrid run's summary.json, its engine_info, or engine_info.prior itself
// ({s_part_per_layer: [[n, s], ...], gpu_s_per_token, gpu_s_per_seq, engage_s, move_s_per_token,
// workers: [{s_per_token, s_per_seq, s_per_call}, ...]}). ConfigError naming `what` and the key.
HybridRates hybrid_rates_from_json(const json& j, const std::string& what);
json to_json(const HybridPlan& p);
std::string format_hybrid_line(const HybridPlan& p);

}  // namespace fd
