// The paper's performance model (§"负载均衡的硬件选择"): choose the batch B and the CPU (R-worker) count
// P from two micro-benchmarks, and predict throughput and which side binds.
//
// Symbols and units (as this code reads the paper)
//   N      layers of the model (full depth for a real deployment).
//   S      generated sequence length, steps (the paper's S; short prompts).
//   B      batch: sequences running together on the S-worker.
//   T(B)   seconds: S-Part time of ONE layer for the whole batch of B sequences on the GPU (both
//          mini-batches together). Measured at a few B; between points linear interpolation; below the
//          first point the first value (the weight-read floor); above the last, linear extrapolation of
//          the last two points (for the simulator; the planner never picks B outside the table).
//   R      seconds: R-Part time per context token per layer on ONE R-worker (CPU), for a KV dtype.
//   W      total context of a step, tokens (see schedule.h); with SLS its mean is ≈ B·S/2.
//   P      R-workers (CPUs); the R-Part of a layer takes W·R/P (work split evenly).
//   L      seconds: the latency the user accepts for generating a whole sequence.
//
// Formulas
//   E(B)            = B / T(B)                        sequences·layer steps per second of the GPU
//   latency bound:    2·N·S·T(B) <= L                 per token each of N layers costs its S-Part plus
//                                                     its R-Part, equal (≈ T(B)) at the balance point
//   B (with L)      = the largest integer B in [B_first, B_last] of the table meeting the bound
//   B (without L)   = the knee of E: the smallest integer B in [B_first, B_last] with
//                     E(B) >= knee_fraction · max E (default 0.9) — where extra batch stops paying
//   P               ≈ B·S·R / (2·T(B))                from (B·S/2)·R / P = T(B)
//   step time       = N · max(T(B), W·R/P)            two mini-batch pipeline, S and R overlapped
//   tokens/s S-bound = B / (N·T(B))
//   tokens/s R-bound = B / (N·(B·S/2)·R/P) = 2·P / (N·S·R)
//   predicted tokens/s = min of the two; "binds" names the smaller ("S" on a tie).
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fastdecode/core/json_util.h"

namespace fd {

// T(B): points (B, seconds per layer), B strictly increasing, seconds > 0.
class TTable {
 public:
  TTable() = default;
  explicit TTable(std::vector<std::pair<double, double>> points);  // ConfigError when malformed
  double at(double b) const;  // seconds per layer for batch b (interpolated, see above)
  double b_first() const { return pts_.front().first; }
  double b_last() const { return pts_.back().first; }
  bool empty() const { return pts_.empty(); }
  const std::vector<std::pair<double, double>>& points() const { return pts_; }

 private:
  std::vector<std::pair<double, double>> pts_;
};

// R of R-workers in service (fd-bench profile --service, harness/profile_service.h): per KV dtype, a layer's steady time
// (both mini-batches, pipelined as the engine issues them) and the first visit's latency at each (B, context) of a grid
// measured with `workers` R-workers of `threads` threads each.
struct ServiceTable {
  int64_t workers = 0, threads = 0, layers = 0;
  std::vector<double> batches, contexts;                       // the grid, increasing
  std::map<std::string, std::vector<double>> round_s, first_s;  // per KV dtype: [i_batch * contexts.size() + i_context]
  bool empty() const { return round_s.empty(); }
  // A layer's steady time for B sequences of mean context ctx: linear in (log B, log ctx) of the log of the time
  // between the grid's points; at the grid's edges held there, with *outside set (never extrapolated).
  double round_at(const std::string& dtype, double b, double ctx, bool* outside = nullptr) const;
};

// profile.json: {"t_b": [[B, seconds_per_layer], ...], "r_s_per_token_layer": {"fp16": x, ...},
//                "layers": n, "head_b": [[B, seconds], ...], "r_service": {...}}   (layers, head_b and r_service optional;
//                strict: unknown keys are errors)
struct Profile {
  TTable t;
  std::map<std::string, double> r_s_per_token_layer;
  int64_t layers = 0;  // 0 = not given
  TTable head;         // head_b: the step's norm + LM head + sampling of B rows, once a step (empty: not measured)
  ServiceTable service;
  int64_t sm_count = 0;  // the SMs T(B) was measured on (0: the whole GPU, or not a CUDA profile)
};

// One decode step of FastDecode, MODELLED from profiles alone (issue 41):
//   step = N · max(S, R) + fill + head
//   S    = 2·T(B/2): a layer's two mini-batches on the GPU (T from the profile's t_b)
//   R    = the service table's steady time of a layer at (B, context): the busiest R-worker's work, pipelined (the
//          table's workers hold equal shares; `busiest` > 1, the busiest worker's KV over the mean, scales it)
//   fill = T(B/2): the first mini-batch's S-Part before any R-worker has work
//   head = head_b(B): the final norm, LM head and sampling, once a step (0 when the profile has none)
struct StepPrediction {
  double s_layer_s = 0, r_layer_s = 0, fill_s = 0, head_s = 0, step_s = 0, tokens_per_s = 0;
  std::string binds;          // "S" or "R"
  bool outside_grid = false;  // (B, context) outside the service grid: R held at its edge
};
// `tb`: the profile of the GPU side (T(B), head_b); `svc`: a profile with r_service (may be the same).
StepPrediction predict_step(const Profile& tb, const Profile& svc, const std::string& kv_dtype, double batch, double context,
                            int64_t layers, double busiest = 1);
// One decode step of GPU-only (attention on the GPU, the same S-Part), MODELLED from the GPU profile and the GPU's
// decode-attention rate (issue 41's crossover: the GPU side predicted as FastDecode is):
//   step = N · (T(n) + n · context · a) + head(n),   n = min(B, slots): the sequences GPU memory holds
//   a    = seconds per context token per layer of decode attention (fp16 K and V read at the GPU's attention rate)
// fill_s is 0, r_layer_s the attention's share of a layer, binds "GPU".
StepPrediction predict_gpu_only_step(const Profile& tb, double attn_s_per_token_layer, double batch, double context,
                                     int64_t layers);
json to_json(const StepPrediction& p);
Profile parse_profile(const json& j, const std::string& file);
Profile load_profile(const std::string& path);

// A GPU described by its datasheet (fd-bench plan --gpu-hbm-gbps --gpu-tflops): T(B) of one layer for the whole batch
// (two mini-batches: the weights read twice) as a roofline,
//   T(B) = max(2·W / (HBM·hbm_efficiency), 2·p·B / (FLOP/s·gemm_efficiency))
// W = a layer's fp16 weight bytes (2 p), p its parameters. MODELLED: the datasheet's rates are upper bounds.
struct GpuDatasheet {
  double hbm_gbps = 0, dense_tflops = 0, hbm_efficiency = 1.0, gemm_efficiency = 0.7;
};
// The table at B = 1, 2, 4, ... up to b_max (enough points for the planner's interpolation to be the roofline's).
TTable datasheet_t_table(const GpuDatasheet& g, double layer_params, double b_max);
// Seconds per context token per layer of decode attention for one CPU socket that reads the KV at socket_gbps
// (kv_bytes_per_token_layer: K and V of one token at one layer in the R-workers' KV dtype).
double r_socket_s(double kv_bytes_per_token_layer, double socket_gbps);

struct PlanInput {
  TTable t;
  std::optional<int64_t> batch;    // B given (--batch): no latency or knee rule
  double r_socket = 0;             // > 0: also P in sockets judged by bandwidth (R of one socket, r_socket_s)
  double r_s_per_token_layer = 0;  // R
  int64_t layers = 1;              // N
  int64_t seq = 1;                 // S
  std::optional<double> latency_s;     // L
  std::optional<double> cpus_available;  // P available; default: the P the plan asks for, rounded up
  double knee_fraction = 0.9;
  int64_t socket_cores = 0;              // > 0: also report P as sockets of that many cores
  std::string socket_name = "socket";    // what a socket is, e.g. "AMD EPYC 7763"
};

struct Plan {
  int64_t batch = 0;              // B (0: no B in the table meets the latency bound)
  std::string batch_rule;         // "latency", "knee" or "given"
  double t_b_s = 0;               // T(B), s per layer
  double e_b = 0;                 // E(B) = B/T(B)
  double e_max = 0;               // max E over the table range
  double seq_latency_s = 0;       // 2·N·S·T(B)
  double cpus_needed = 0;         // P = B·S·R/(2·T(B))
  double cpus_used = 0;           // cpus_available or ceil(cpus_needed), at least 1
  std::string cpus_used_reason;   // why cpus_used differs from cpus_needed: "--cpus-available", "at least one
                                  // R-worker CPU", "rounded up to whole CPUs"; "" when equal
  int64_t socket_cores = 0;       // as PlanInput (0: no socket report)
  std::string socket_name;
  double sockets_needed = 0;      // cpus_needed / socket_cores (0 without socket_cores)
  double sockets_by_bandwidth = 0;  // B·S·R_socket/(2·T(B)) with PlanInput::r_socket (0 without it)
  double tokens_per_s_s_bound = 0;
  double tokens_per_s_r_bound = 0;
  double tokens_per_s = 0;        // min of the two
  std::string binds;              // "S" or "R"
};

double e_of_b(const TTable& t, double b);                        // B / T(B)
int64_t knee_batch(const TTable& t, double fraction);            // smallest B reaching fraction·max E
int64_t latency_batch(const TTable& t, int64_t layers, int64_t seq, double latency_s);  // 0 if none
double cpus_needed(double batch, double seq, double r, double t_b);                     // B·S·R/(2T)
double tokens_per_s_s_bound(double batch, int64_t layers, double t_b);                  // B/(N·T)
double tokens_per_s_r_bound(double cpus, int64_t layers, double seq, double r);         // 2P/(N·S·R)
Plan make_plan(const PlanInput& in);
// Keys as the Plan fields; socket_cores, socket_name and sockets_needed are null without socket_cores.
json to_json(const Plan& p);

// A positive count with 3 significant digits that never reads as 0 (%.3g below 100, whole numbers above:
// 0.00912, 3.69, 123).
std::string format_count(double x);
// fd-bench plan's P line: "CPUs needed P = B·S·R/(2·T(B)) = 3.69 cores[ = 0.0577 sockets of NAME (64 cores
// each)]; using 4 (rounded up to whole CPUs)".
std::string format_cpus_line(const Plan& p);

}  // namespace fd
