// The paged-swap baseline: vLLM v0.2's policy (PagedAttention over a block-paged fp16 KV-cache in GPU
// memory, iteration-level scheduling, preemption by swapping to a pinned CPU pool or by recomputation)
// on this project's S-Part (CudaModel), as the FastDecode paper ran vLLM. block_manager.h and
// scheduler.h hold the policy (pure C++); the engine runs each PagedStepPlan: swaps, then a prefill step or a
// decode step (never both, as vLLM v0.2). Block COUNTS come from full-depth accounting: GPU blocks =
// (memory - full-depth fp16 weights - 1 GiB) / full-depth KV bytes per block, CPU blocks = swap_space_gb
// GiB / the same; a reduced-layer run allocates (device and pinned host) only the layers it runs.
#pragma once
#include <memory>
#include <string>

#include "fastdecode/engine/engine.h"

namespace fd {

// The "engine" section with type "paged-swap". GPU memory and SMs come from the run's HardwareBalance.
struct PagedSwapConfig {
  int64_t block_size = 16;      // tokens per KV block
  double swap_space_gb = 4;     // CPU swap pool, GiB (2^30 bytes, vLLM's unit) of full-depth fp16 KV
  std::string preemption = "swap";  // swap | recompute
  double watermark = 0.01;      // admit only while free GPU blocks after allocation >= watermark x total
  int64_t max_num_seqs = 256;   // sequences running at once
  int64_t max_num_batched_tokens = 4096;  // prompt tokens per prefill step (the first prompt always fits)
  int64_t num_gpu_blocks = 0;   // 0 = from the GPU memory budget; > 0 = exactly this many (tests, Fig. 10)
  std::string dtype = "fp16";   // 16-bit weights and activations: fp16 | bf16 (fp32 accumulation)
  bool cuda_graphs = false;     // vLLM v0.2 had none; true is refused (not built)
  static PagedSwapConfig parse(StrictObject& o);  // the section's own keys (not type / threads)
  json to_json() const;
};

// GPU KV blocks for a memory budget (bytes): (budget - full-depth fp16 weights - 1 GiB) / full-depth fp16
// KV bytes of one block (K and V, every layer of the full model); 0 when nothing is left.
int64_t paged_swap_gpu_blocks(const ModelConfig& model, double memory_bytes, int64_t block_size);
// Full-depth fp16 KV bytes of one block.
double paged_swap_block_bytes(const ModelConfig& model, int64_t block_size);

std::unique_ptr<Engine> make_paged_swap_engine(const PagedSwapConfig& c, const EngineContext& ctx);

}  // namespace fd
