// The host-offload baseline (FlexGen-like): the S-Part on the GPU as the GPU-only engine runs it
// (CudaModel), but every KV byte lives in pinned host memory and is streamed to the GPU layer by layer
// over PCIe, then attended there: the PCIe wall of the paper's introduction, measured.
//
// Host cache: per layer run, K and V of [slot][max_context][kv_dim] fp16 in pinned, mapped, portable
// host memory (cudaHostAlloc). New tokens' K/V are written straight into it by cuda::append_kv through
// the mapped device pointer (zero-copy writes of the step's rows). A decode step copies, per layer, each
// sequence's rows 0..len-1 into a GPU staging buffer [B][stride][kv_dim] (row b = the batch's b-th
// sequence, stride = the longest context of the batch) on a copy stream; the staging is double-buffered,
// so layer l+1's copy overlaps layer l's compute (events between the streams). The new token's row is
// appended to the staging buffer as well as to host memory, then cuda::decode_attention runs over it.
//
// Capacity: slots = host_kv_gb / (max_context x full-depth fp16 KV per token), the same full-depth
// accounting as gpu_only_slots (a reduced-layer run allocates only the layers it runs, for at most
// max_batch slots). The decode batch is further bounded by GPU memory: the full-depth weights, 1 GiB of
// workspaces and, per row, two staging buffers of one layer's K and V at max_context plus the row's
// activations (host_offload_gpu_rows).
#pragma once
#include <memory>
#include <string>

#include "fastdecode/engine/engine.h"

namespace fd {

// Sequences whose full-depth fp16 KV-cache of max_context positions fits in host_bytes of host memory.
int64_t host_offload_slots(const ModelConfig& model, double host_bytes, int64_t max_context);
// Decode rows the GPU holds for a model, memory budget (bytes) and max_context: (memory - full-depth fp16
// weights - 1 GiB) / (2 staging buffers x one layer's K and V of max_context fp16 rows + the row's
// activations and logits, gpu_only_row_bytes). 0 when the weights alone do not fit.
int64_t host_offload_gpu_rows(const ModelConfig& model, double gpu_bytes, int64_t max_context);

// The "engine" section with type "host-offload". GPU memory and SMs come from the run's HardwareBalance.
struct HostOffloadConfig {
  double host_kv_gb = 32;      // pinned host memory (GB = 1e9 bytes) for the KV-cache, full-depth accounting
  int64_t max_context = 0;     // positions reserved per sequence (0 = the model's position limit)
  int64_t prefill_tokens = 16384;  // prompt tokens prefilled per step at most (whole prompts, at least one)
  std::string dtype = "fp16";  // 16-bit weights and activations: fp16 | bf16 (the KV-cache is fp16)
  int64_t max_batch = 0;       // sequences running at once at most (0 = the slots)
  // How a layer's K/V rows reach the GPU: "batched" (one cudaMemcpyBatchAsync per layer for all of them)
  // or "per_sequence" (one cudaMemcpyAsync per sequence and K/V). Batched is the default: on the H200 it
  // kept the copy stream busy 0.13 ms a step against 0.28 ms per sequence (experiments/baselines/
  // smoke-host-offload.json: 8 sequences of 16 to 111 positions), for the same bytes.
  std::string copy = "batched";
  static HostOffloadConfig parse(StrictObject& o);  // the section's own keys (not type / threads)
  json to_json() const;
};

std::unique_ptr<Engine> make_host_offload_engine(const HostOffloadConfig& c, const EngineContext& ctx);

}  // namespace fd
