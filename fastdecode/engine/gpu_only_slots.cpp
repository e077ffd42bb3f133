#include "fastdecode/engine/gpu_only_engine.h"

namespace fd {

int64_t gpu_only_slots(const ModelConfig& c, double memory_bytes, int64_t max_context) {
  const double weights = double(with_layers(c, c.full_num_layers).num_params()) * 2;  // fp16, full depth
  const double reserve = double(1ull << 30);  // activations, cuBLAS and attention workspaces
  const double free = memory_bytes - weights - reserve;
  if (free <= 0 || max_context <= 0) return 0;
  return int64_t(free / (double(c.kv_bytes_per_token(2, true)) * double(max_context)));
}

}  // namespace fd
