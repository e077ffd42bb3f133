// The GPU-only baseline: the same S-Part stages (CudaModel) with attention on the GPU over a contiguous
// fp16 KV-cache in device memory, as a conventional serving system runs. Each sequence reserves
// `max_context` tokens of cache (a slot); the number of slots, so the batch, is bounded by GPU memory:
// (memory - full-depth weights - 1 GiB of workspaces) / (max_context x full-depth KV per token + one
// decode row's activations and logits). In a reduced-layer run the cache holds only the layers run but the capacity is the full
// model's (hardware balance, docs/EXPERIMENTS.md). Requests beyond the slots wait in the engine's queue.
#pragma once
#include <memory>

#include "fastdecode/engine/engine.h"
#include "fastdecode/parallel/ranks.h"

namespace fd {

// The GPU-only engine's sequence capacity for a model, memory budget (bytes) and max_context.
int64_t gpu_only_slots(const ModelConfig& model, double memory_bytes, int64_t max_context);
// Device memory one decode row (one running sequence) takes besides its KV-cache: activations and logits.
double gpu_only_row_bytes(const ModelConfig& model);

// What one S-rank of a parallel run holds at full depth (tensor part t of T of pipeline stage p of P, the stage
// running `stage_layers` of the run's model.num_layers): its weights (1/T of its stage's share of the full
// model's layers; 1/T of the embedding on the first stage and of the LM head on the last; with one stage 1/T of
// all of it), and per sequence its KV-cache (its KV heads, its stage's full-depth layers, max_context tokens)
// plus one decode row's activations at its widths. T = P = 1 gives gpu_only_slots' terms.
struct GpuOnlyRankMemory {
  double weights = 0, per_seq = 0;
};
GpuOnlyRankMemory gpu_only_rank_memory(const ModelConfig& model, int64_t T, int64_t P, int64_t p, int64_t stage_layers,
                                       int64_t max_context);
// The slots of T x P ranks (rank g = p*T + t on GPU devices[g], stage p running stages[p] of the run's layers)
// with memory_bytes per GPU: on each GPU, what its ranks' weights and 1 GiB of workspaces per rank leave, over
// the sum of its ranks' per-sequence bytes; the least over the GPUs. 0 when the weights alone do not fit.
int64_t gpu_only_parallel_slots(const ModelConfig& model, int64_t T, const std::vector<std::pair<int64_t, int64_t>>& stages,
                                const std::vector<int>& devices, double memory_bytes, int64_t max_context);

// The "engine" section with type "gpu-only". GPU memory and SMs come from the run's HardwareBalance.
struct GpuOnlyConfig {
  // Prompt tokens prefilled per step at most (whole prompts, at least one); the rest start later.
  int64_t prefill_tokens = 16384;
  int64_t max_context = 0;  // cache positions reserved per sequence (0 = the model's max_position_embeddings)
  // Greedy decode steps of at most 128 rows replayed from one CUDA graph per batch size (padded to a
  // power of two).
  bool cuda_graphs = true;
  // Asynchronous stepping with the graphs: each greedy decode step is launched before the host reads the step
  // before's tokens, which feed it on the device (gpu_only_engine.cpp says when it applies).
  bool async_steps = true;
  std::string dtype = "fp16";  // 16-bit weights and activations: fp16 | bf16 (fp32 accumulation)
  // Tensor and pipeline parallelism (docs/PARALLEL.md): T x P S-ranks, threads of the engine's process, rank
  // (t, p) on its own GPU with the KV-cache of its heads and layers. CUDA graphs only without it.
  ParallelConfig parallel;
  static GpuOnlyConfig parse(StrictObject& o);  // the section's own keys (not type / threads)
  json to_json() const;
};

std::unique_ptr<Engine> make_gpu_only_engine(const GpuOnlyConfig& c, const EngineContext& ctx);

}  // namespace fd
