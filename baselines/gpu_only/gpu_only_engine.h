// The GPU-only baseline: the same S-Part stages (CudaModel) with attention on the GPU over a contiguous
// fp16 KV-cache in device memory, as a conventional serving system runs. Each sequence reserves
// `max_context` tokens of cache (a slot); the number of slots, so the batch, is bounded by GPU memory:
// (memory - full-depth weights - 1 GiB of workspaces) / (max_context x full-depth KV per token + one
// decode row's activations and logits). In a reduced-layer run the cache holds only the layers run but the capacity is the full
// model's (hardware balance, docs/EXPERIMENTS.md). Requests beyond the slots wait in the engine's queue.
#pragma once
#include <memory>

#include "fastdecode/engine/engine.h"

namespace fd {

// The GPU-only engine's sequence capacity for a model, memory budget (bytes) and max_context.
int64_t gpu_only_slots(const ModelConfig& model, double memory_bytes, int64_t max_context);
// Device memory one decode row (one running sequence) takes besides its KV-cache: activations and logits.
double gpu_only_row_bytes(const ModelConfig& model);

// The "engine" section with type "gpu-only". GPU memory and SMs come from the run's HardwareBalance.
struct GpuOnlyConfig {
  // Prompt tokens prefilled per step at most (whole prompts, at least one); the rest start later.
  int64_t prefill_tokens = 16384;
  int64_t max_context = 0;  // cache positions reserved per sequence (0 = the model's max_position_embeddings)
  // Greedy decode steps of at most 128 rows replayed from one CUDA graph per batch size (padded to a
  // power of two).
  bool cuda_graphs = true;
  std::string dtype = "fp16";  // 16-bit weights and activations: fp16 | bf16 (fp32 accumulation)
  static GpuOnlyConfig parse(StrictObject& o);  // the section's own keys (not type / threads)
  json to_json() const;
};

std::unique_ptr<Engine> make_gpu_only_engine(const GpuOnlyConfig& c, const EngineContext& ctx);

}  // namespace fd
