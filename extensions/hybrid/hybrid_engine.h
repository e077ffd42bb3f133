// The hybrid engine (issue 17, beyond the paper; the idea after NEO, MLSys'25; docs/HYBRID.md): every running
// sequence's KV lives on one side — the GPU's KV pool (the GPU-only baseline's contiguous fp16 slots, attended on the
// GPU) or one R-worker (attended on the CPUs, as FastDecode) — and the S-Part runs over all of them as one batch.
// A controller (fastdecode/sched/hybrid.h) places each new sequence from measured rates so that a step takes about
// max(GPU side, CPU side); with nothing to gain it places nothing on the CPUs and the engine runs as GPU-only does
// (the same kernels, the same CUDA graphs). With sequences on both sides each step runs in two mini-batches, so one's
// CPU attention overlaps the other's GPU work. Admission uses the combined capacity (GPU slots at full depth and the
// R-workers' memory at full depth), so the batch can exceed GPU-only's.
#pragma once
#include <memory>
#include <string>

#include "fastdecode/engine/engine.h"
#include "fastdecode/sched/hybrid.h"
#include "fastdecode/sworker/fastdecode_config.h"

namespace fd {

// The "engine" section with type "hybrid". GPU memory and SMs come from the run's HardwareBalance, as for gpu-only.
struct HybridConfig {
  int64_t max_context = 0;     // GPU cache positions per sequence (0 = the model's positions), as gpu-only
  int64_t prefill_tokens = 16384;
  bool cuda_graphs = true;     // while every sequence is on the GPU: gpu-only's decode graphs
  std::string dtype = "fp16";  // 16-bit weights and activations (fp16 | bf16)
  int64_t mini_batches = 2;    // with sequences on the CPUs: 2 overlaps one's CPU attention with the other's GPU work
  RWorkersConfig rworkers;     // the CPU side (spawned or listed, as the fastdecode engine's)
  HybridControllerConfig controller;  // placement: auto (from measured rates), all-gpu, all-cpu, fixed-fraction
  static HybridConfig parse(StrictObject& o);
  json to_json() const;
};

std::unique_ptr<Engine> make_hybrid_engine(const HybridConfig& c, const EngineContext& ctx);

}  // namespace fd
