// What every engine with tensor and pipeline parallelism shares (docs/PARALLEL.md): the `engine.parallel`
// config section, the GPU of each rank, the communicators of T x P ranks, and running one step's work on
// one thread per rank with the first failure reported. The FastDecode engine and the GPU-only baseline
// both build on it; each engine owns its config section and embeds a ParallelConfig in it.
//
// Rank g = p * T + t is tensor part t of pipeline stage p. The ranks are threads of the engine's process.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fastdecode/core/json_util.h"
#include "fastdecode/parallel/comm.h"

namespace fd {

struct ParallelConfig {
  int64_t tensor = 1;                // T: heads and MLP columns split over T ranks (all-reduce per branch)
  int64_t pipeline = 1;              // P: contiguous layer runs over P stages (residual handed stage to stage)
  // W: each step's batch is cut into W waves that follow each other through the stages, so stage p works on
  // wave w while stage p + 1 works on wave w - 1 (each stage busy W / (W + P - 1) of a decode step).
  // 0 = the default: P (1 without pipeline parallelism).
  int64_t waves = 0;
  std::vector<int64_t> layers;       // layers per stage (P entries summing to model.layers); empty: even split
  int64_t timeout_ms = 60000;        // deadline of every collective and stage hand-off (gloo, local)
  std::string comm = "auto";         // tensor collectives: auto | gloo | nccl (auto: nccl on distinct GPUs, else gloo)
  std::vector<int64_t> devices;      // cuda: GPU of each rank (T*P entries); empty: the default (rank_devices)
  int64_t ranks() const { return tensor * pipeline; }
  int64_t wave_count() const { return waves > 0 ? waves : pipeline; }
  // Reads the "parallel" object of an engine section. cuda_possible: the engine may run on a GPU (devices and
  // comm nccl are refused otherwise). max_waves: the most waves the engine can hold in one step.
  static ParallelConfig parse(StrictObject& p, bool cuda_possible, int64_t max_waves);
  json to_json() const;
};

// The GPU of each rank (rank g = p*T + t) of an engine running on CUDA with n_gpus devices answering:
// parallel.devices, else GPU g; with T = 1 and fewer GPUs than stages every stage shares GPU 0 (stages need no
// collective). T > 1 with fewer GPUs than ranks is refused (fd::ConfigError naming the GPUs needed) unless the
// devices are listed (ranks then share GPUs: a correctness run). `engine` names the engine in messages.
std::vector<int> rank_devices(const ParallelConfig& pc, int64_t n_gpus, const std::string& engine);

// The communicators of T x P ranks: per stage, its T tensor ranks' group (nccl for GPU ranks on distinct
// devices when built and comm allows, else gloo; none when T = 1); per tensor index, its P stages' hand-off
// group (the in-process mailbox; none when P = 1). devices: each rank's GPU (empty on the CPU).
class RankComms {
 public:
  RankComms() = default;
  RankComms(const ParallelConfig& pc, const std::vector<int>& devices);
  Communicator* tp(size_t g) const;  // rank g's tensor group handle, or null
  Communicator* pp(size_t g) const;  // rank g's stage hand-off handle, or null
  void abort(size_t g);              // wakes rank g's peers (its groups) with an error
  std::string tensor_describe() const;    // "nccl 2.28.9" | "gloo 0.5.0 ..." | "none"
  std::string pipeline_describe() const;  // "local mailbox 8" | "none"
  bool tensor_device_buffers() const;     // the tensor collectives take device buffers (nccl)
  void clear() { tp_.clear(), pp_.clear(); }

 private:
  size_t T_ = 1;
  std::vector<CommGroup> tp_;  // per stage p: its T tensor ranks
  std::vector<CommGroup> pp_;  // per tensor index t: its P stages
};

// Runs work(g) for every rank g < G: inline when G = 1, else on one thread each. A rank that throws calls
// on_fail(g) (abort its communicators: that wakes its peers blocked in a collective or a hand-off); once every
// thread has ended, the first failure is thrown as fd::Error "<engine>: rank t<t> p<p> (<what(g)>): <error>".
void run_on_ranks(size_t G, size_t T, const std::string& engine, const std::function<void(size_t)>& work,
                  const std::function<void(size_t)>& on_fail, const std::function<std::string(size_t)>& what = nullptr);

// The W waves of n rows: wave w takes rows [begins[w], begins[w + 1]) of a batch cut as evenly as possible
// (the first n % W waves one row more); fewer waves than W when n < W (no empty wave).
std::vector<size_t> wave_bounds(size_t n, int64_t W);

}  // namespace fd
