#include "baselines/paged_swap/paged_swap_engine.h"

namespace fd {

PagedSwapConfig PagedSwapConfig::parse(StrictObject& o) {
  PagedSwapConfig c;
  c.block_size = o.get_int("block_size", 1, 4096, 16);
  c.swap_space_gb = o.get_number("swap_space_gb", 0, 1 << 20, 4);
  c.preemption = o.get_enum("preemption", {"swap", "recompute"}, std::string("swap"));
  c.watermark = o.get_number("watermark", 0, 0.5, 0.01);
  c.max_num_seqs = o.get_int("max_num_seqs", 1, 65535, 256);
  c.max_num_batched_tokens = o.get_int("max_num_batched_tokens", 1, 1 << 24, 4096);
  c.num_gpu_blocks = o.get_int("num_gpu_blocks", 0, (int64_t(1) << 31) - 1, 0);
  c.dtype = o.get_enum("dtype", {"fp16", "bf16"}, std::string("fp16"));
  c.cuda_graphs = o.get_bool("cuda_graphs", false);
  if (c.cuda_graphs) o.fail("cuda_graphs", "is not built for paged-swap (it models vLLM v0.2 before its CUDA graphs, v0.2.7); use false");
  return c;
}

json PagedSwapConfig::to_json() const {
  return {{"block_size", block_size},       {"swap_space_gb", swap_space_gb},
          {"preemption", preemption},       {"watermark", watermark},
          {"max_num_seqs", max_num_seqs},   {"max_num_batched_tokens", max_num_batched_tokens},
          {"num_gpu_blocks", num_gpu_blocks}, {"dtype", dtype},
          {"cuda_graphs", cuda_graphs}};
}

double paged_swap_block_bytes(const ModelConfig& c, int64_t block_size) {
  return double(c.kv_bytes_per_token(2, true)) * double(block_size);
}

int64_t paged_swap_gpu_blocks(const ModelConfig& c, double memory_bytes, int64_t block_size) {
  const double weights = double(with_layers(c, c.full_num_layers).num_params()) * 2;  // fp16, full depth
  const double reserve = double(1ull << 30);  // cuBLAS and attention workspaces, activations, CUDA context
  const double free = memory_bytes - weights - reserve;
  if (free <= 0 || block_size <= 0) return 0;
  return int64_t(free / paged_swap_block_bytes(c, block_size));
}

}  // namespace fd
