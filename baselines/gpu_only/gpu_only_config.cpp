#include "baselines/gpu_only/gpu_only_engine.h"

namespace fd {

GpuOnlyConfig GpuOnlyConfig::parse(StrictObject& o) {
  GpuOnlyConfig c;
  c.max_context = o.get_int("max_context", 1, 1 << 24, 0);
  c.cuda_graphs = o.get_bool("cuda_graphs", true);
  c.dtype = o.get_enum("dtype", {"fp16", "bf16"}, std::string("fp16"));
  c.prefill_tokens = o.get_int("prefill_tokens", 1, 1 << 24, 16384);
  return c;
}

json GpuOnlyConfig::to_json() const {
  return {{"max_context", max_context}, {"cuda_graphs", cuda_graphs}, {"dtype", dtype}, {"prefill_tokens", prefill_tokens}};
}

double gpu_only_row_bytes(const ModelConfig& c) {
  const double H = double(c.hidden_size), I = double(c.intermediate_size), qd = double(c.q_dim()),
               kvd = double(c.kv_dim()), V = double(c.vocab_size);
  // fp32: residual x, norm scratch, q, attention output, k, v, logits; fp16: normed x, o-proj output,
  // attention output, [q|k|v], q/k/v, [gate|up], the MLP's inner activation (CudaModel::ensure).
  return 4 * (2 * H + 2 * qd + 2 * kvd + V) + 2 * (2 * H + 2 * qd + 2 * kvd + (qd + 2 * kvd) + 3 * I);
}

int64_t gpu_only_slots(const ModelConfig& c, double memory_bytes, int64_t max_context) {
  const double weights = double(with_layers(c, c.full_num_layers).num_params()) * 2;  // fp16, full depth
  const double reserve = double(1ull << 30);  // cuBLAS and attention workspaces, CUDA context
  const double free = memory_bytes - weights - reserve;
  if (free <= 0 || max_context <= 0) return 0;
  const double per_seq = double(c.kv_bytes_per_token(2, true)) * double(max_context) + gpu_only_row_bytes(c);
  return int64_t(free / per_seq);
}

}  // namespace fd
