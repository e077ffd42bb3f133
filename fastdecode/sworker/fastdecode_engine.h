// The FastDecode engine: the S-Part (CPU or CUDA backend) batched over all running sequences, the R-Part
// on R-worker processes that hold the KV-cache, in the two mini-batch pipeline; and its config, the
// experiment's "engine" section with type "fastdecode" (docs/EXPERIMENTS.md).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "fastdecode/engine/engine.h"

namespace fd {

// R-workers of the FastDecode engine: spawned locally, or reached at endpoints started by the user.
struct RWorkersConfig {
  std::vector<std::string> endpoints;  // when set, use these and spawn nothing
  int64_t spawn = 2;                   // local fd-rworker processes otherwise
  int64_t threads = 1;                 // compute threads per spawned worker
  std::string kv_dtype = "fp16";       // fp16 | int8 | int4 (spawned workers)
  double memory_gb = 1.0;              // KV memory per spawned worker
  bool pin = false;                    // pin spawned worker i to CPUs [i*threads, (i+1)*threads)
  int64_t timeout_ms = 60000;          // per-step deadline of every R-worker reply
  std::string binary;                  // fd-rworker to spawn; default: next to the running program
};

// Tensor and pipeline parallelism (docs/PARALLEL.md): T x P S-ranks, threads of the engine's process; rank
// (t, p) holds tensor part t of stage p's layers (fastdecode/model/shard.h) and has its own group of
// R-workers (rworkers.spawn of them, each with rworkers.threads; pinned groups take consecutive cores),
// which hold the KV of that rank's heads and layers only. On the cuda backend rank g = p*T + t runs on GPU
// devices[g] (default g; with T = 1 and fewer GPUs, every stage on GPU 0).
struct ParallelConfig {
  int64_t tensor = 1;                // T: heads and MLP columns split over T ranks (all-reduce per branch)
  int64_t pipeline = 1;              // P: contiguous layer runs over P stages (residual handed stage to stage)
  std::vector<int64_t> layers;       // layers per stage (P entries summing to model.layers); empty: even split
  int64_t timeout_ms = 60000;        // deadline of every collective and stage hand-off (gloo, local)
  std::string comm = "auto";         // tensor collectives: auto | gloo | nccl (auto: nccl on distinct GPUs, else gloo)
  std::vector<int64_t> devices;      // cuda: GPU of each rank (T*P entries); empty: the default above
  int64_t ranks() const { return tensor * pipeline; }
};

struct FastDecodeConfig {
  // S-Part backend: cpu | cuda | auto (cuda when a GPU answers, decided when the engine is made).
  std::string backend = "cpu";
  int64_t mini_batches = 2;   // 2 = the two mini-batch pipeline; 1 = no overlap
  std::string wire_dtype;     // q/k/v and attention output on the wire: fp32 | fp16; "" = fp16 with cuda, fp32 with cpu
  // cuda backend: 16-bit weights and activations (fp16 | bf16) and decode stages of at most 128 rows
  // replayed from CUDA graphs (one per stage between R-Part round trips and padded batch size)
  std::string dtype = "fp16";
  bool cuda_graphs = true;
  // Prompt tokens prefilled per step at most (whole prompts, at least one); the rest start later.
  int64_t prefill_tokens = 16384;
  RWorkersConfig rworkers;
  ParallelConfig parallel;
  static FastDecodeConfig parse(StrictObject& o);  // the section's own keys (not type / threads)
  json to_json() const;
};

// Applies the run's hardware balance: R-worker count and threads (pinned) for spawned workers, SMs for the
// CUDA S-Part.
std::unique_ptr<Engine> make_fastdecode_engine(const FastDecodeConfig& c, const EngineContext& ctx);

}  // namespace fd
