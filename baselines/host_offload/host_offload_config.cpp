// HostOffloadConfig and the host-offload engine's memory arithmetic (built with and without CUDA).
#include "baselines/gpu_only/gpu_only_engine.h"
#include "baselines/host_offload/host_offload_engine.h"

namespace fd {

HostOffloadConfig HostOffloadConfig::parse(StrictObject& o) {
  HostOffloadConfig c;
  c.host_kv_gb = o.get_number("host_kv_gb", 1e-6, 1e6, 32);
  c.max_context = o.get_int("max_context", 0, 1 << 24, 0);  // 0 = the model's position limit
  c.prefill_tokens = o.get_int("prefill_tokens", 1, 1 << 24, 16384);
  c.dtype = o.get_enum("dtype", {"fp16", "bf16"}, std::string("fp16"));
  c.max_batch = o.get_int("max_batch", 0, 65535, 0);  // 0 = the slots; decode_attention takes at most 65535
  c.copy = o.get_enum("copy", {"per_sequence", "batched"}, std::string("batched"));
  return c;
}

json HostOffloadConfig::to_json() const {
  return {{"host_kv_gb", host_kv_gb}, {"max_context", max_context}, {"prefill_tokens", prefill_tokens},
          {"dtype", dtype},           {"max_batch", max_batch},     {"copy", copy}};
}

int64_t host_offload_slots(const ModelConfig& c, double host_bytes, int64_t max_context) {
  if (host_bytes <= 0 || max_context <= 0) return 0;
  const double per_seq = double(c.kv_bytes_per_token(2, true)) * double(max_context);  // fp16, full depth
  return int64_t(host_bytes / per_seq);
}

int64_t host_offload_gpu_rows(const ModelConfig& c, double gpu_bytes, int64_t max_context) {
  const double weights = double(with_layers(c, c.full_num_layers).num_params()) * 2;  // fp16, full depth
  const double reserve = double(1ull << 30);  // cuBLAS and attention workspaces, CUDA context
  const double free = gpu_bytes - weights - reserve;
  if (free <= 0 || max_context <= 0) return 0;
  // Two staging buffers (double-buffered layers) of one layer's K and V: 2 x 2 x max_context x kv_dim fp16.
  const double staging = 2.0 * 2.0 * double(max_context) * double(c.kv_dim()) * 2.0;
  return int64_t(free / (staging + gpu_only_row_bytes(c)));
}

}  // namespace fd
