// fd-bench profile --service: the R-Part as R-workers serve it, not the kernel alone (issue 41, step 1).
//
// P fd-rworker processes are spawned as the FastDecode engine spawns them (the same program, threads, pinning,
// shared-memory lane), a client (RWorkerClient, as an S-rank uses it) places B sequences of `context` tokens on them
// evenly (sequence i on worker i mod P, in mini-batch (i / P) mod 2), appends their prompt KV at every layer, then runs
// decode steps the way the engine issues them: per layer and mini-batch one ATTEND to every worker with its share (q,
// k, v of one new token a sequence: the append included), two in flight a worker (a layer's two mini-batches), a
// mini-batch's next visit sent as soon as its replies are in (as its S-Part would), the layers visited 2 L times a
// step. Per (KV dtype, context, B) it records a layer's steady time after the first visit (what a step spends per
// layer when the R-Part binds), the first visit's latency (the pipeline's fill) and the busiest worker's compute (the
// replies' compute_ns), medians over `reps` steps after one warm-up step.
//
// A fit per KV dtype over the grid, relative least squares of the round per layer:
//   t(B, S) = a + c · (B / P) + b · (B · S / P)
// a: the fixed cost of a layer's two rounds (message, wake-up, reply); c: per sequence on the busiest worker (its
// bookkeeping, the append, the query); b: per context token on a worker of `threads` threads. R per CPU is b · threads,
// the unit of the kernel profile's r_s_per_token_layer.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "fastdecode/core/json_util.h"
#include "fastdecode/model/model_config.h"

namespace fd {

struct ServiceProfileOptions {
  int workers = 4;                 // R-workers spawned
  int threads = 3;                 // compute threads each
  bool pin = true;                 // pinned to disjoint cores from first_cpu on, as the engine pins them
  int first_cpu = 0;
  std::vector<int64_t> batches = {16, 64, 256, 1024};  // B: sequences over all workers
  std::vector<int64_t> contexts = {128, 512, 1024};    // prompt tokens a sequence
  std::vector<std::string> kv_dtypes = {"fp16"};
  int layers = 2;                  // layers each sequence holds (the runs' reduced depth): the working set
  int reps = 5;                    // decode steps measured (after one warm-up)
  bool shm = true;                 // the shared-memory lane (the engine's default)
  std::string binary;              // fd-rworker (default: next to the running program)
};

// The r_service section of profile.json: the options, a row per grid point, and the fit per KV dtype. Bad options
// are ConfigErrors naming the flag, raised before any worker is spawned.
json measure_service_profile(const ModelConfig& model, const ServiceProfileOptions& o);
void check_service_options(const ServiceProfileOptions& o);  // ConfigError naming the flag

// The kernel alone on the bytes and cores a service grid point gives each worker (issue 43: what service adds to it):
// P threads of this process, each pinned as worker w's threads are, holding worker w's share of B sequences of
// `context` tokens at every layer, running decode_attention over the visits of reps + 1 steps (the first a warm-up)
// as the worker does; seconds a visit of the busiest and of the mean worker.
struct KernelAlone {
  double busiest_s_per_layer = 0, mean_s_per_layer = 0;
  int64_t busiest_tokens = 0;  // the tokens (sequences x context, one layer) of the worker holding the most
};
KernelAlone replay_kernel_alone(const ModelConfig& model, const ServiceProfileOptions& o, const std::string& dtype,
                                int64_t batch, int64_t context);

// Relative least squares of y = a + c·x1 + b·x2 over the points (x1, x2, y) (minimises the sum of ((fit - y) / y)²):
// {a, c, b, R², the largest |fit/y - 1|}.
struct ServiceFit {
  double a = 0, c = 0, b = 0, r2 = 0, max_rel_err = 0;
};
ServiceFit fit_service(const std::vector<double>& x1, const std::vector<double>& x2, const std::vector<double>& y);

}  // namespace fd
