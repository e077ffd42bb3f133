#include "baselines/gpu_only/gpu_only_engine.h"

#include <algorithm>
#include <limits>
#include <map>

#include "fastdecode/model/shard.h"

namespace fd {

GpuOnlyConfig GpuOnlyConfig::parse(StrictObject& o) {
  GpuOnlyConfig c;
  c.max_context = o.get_int("max_context", 1, 1 << 24, 0);
  c.cuda_graphs = o.get_bool("cuda_graphs", true);
  c.async_steps = o.get_bool("async_steps", true);
  c.dtype = o.get_enum("dtype", {"fp16", "bf16"}, std::string("fp16"));
  c.prefill_tokens = o.get_int("prefill_tokens", 1, 1 << 24, 16384);
  if (o.has("parallel")) {
    StrictObject p = o.get_object("parallel");
    c.parallel = ParallelConfig::parse(p, true, 15);  // at most 15 waves: batches 0..14, the prefill's after them
  } else {
    o.get_raw("parallel");
  }
  return c;
}

json GpuOnlyConfig::to_json() const {
  json j = {{"max_context", max_context}, {"cuda_graphs", cuda_graphs}, {"async_steps", async_steps}, {"dtype", dtype}, {"prefill_tokens", prefill_tokens}};
  if (parallel.ranks() > 1 || parallel.waves > 0) j["parallel"] = parallel.to_json();
  return j;
}

double gpu_only_row_bytes(const ModelConfig& c) {
  const double H = double(c.hidden_size), I = double(c.intermediate_size), qd = double(c.q_dim()),
               kvd = double(c.kv_dim()), V = double(c.vocab_size);
  // fp32: residual x, q, attention output, k, v, logits; fp16: normed x, o-proj output, attention output,
  // [q|k|v], q/k/v, [gate|up], the MLP's inner activation (CudaModel::ensure).
  return 4 * (H + 2 * qd + 2 * kvd + V) + 2 * (2 * H + 2 * qd + 2 * kvd + (qd + 2 * kvd) + 3 * I);
}

GpuOnlyRankMemory gpu_only_rank_memory(const ModelConfig& c, int64_t T, int64_t P, int64_t p, int64_t stage_layers,
                                       int64_t max_context) {
  const double full = double(c.full_num_layers), share = double(stage_layers) / double(c.num_layers);
  const double all = double(with_layers(c, c.full_num_layers).num_params());
  GpuOnlyRankMemory m;
  if (P == 1) {
    m.weights = all * 2 / double(T);  // fp16, full depth
  } else {
    // Outside the layers: the vocabulary matrices (the embedding on the first stage; the LM head on the last, a
    // tied one stored there again) split over T, and the small rest (positions, norms, projections) whole.
    const double per_layer = (all - double(with_layers(c, 1).num_params())) / (full - 1);  // P > 1: full >= 2
    const double outside = all - per_layer * full;
    const double vocab = double(c.vocab_size) * double(c.arch == Arch::Llama ? c.hidden_size : c.embed_dim());
    const double rest = outside - vocab * (c.tie_word_embeddings ? 1 : 2);
    double w = per_layer * full * share / double(T);
    if (p == 0) w += vocab / double(T) + rest;
    if (p == P - 1) w += vocab / double(T);
    m.weights = w * 2;
  }
  const ModelConfig rank_cfg = T == 1 && P == 1 ? c : shard_config(c, T, stage_layers);
  m.per_seq = double(c.kv_bytes_per_token(2, true)) * share / double(T) * double(max_context) + gpu_only_row_bytes(rank_cfg);
  return m;
}

int64_t gpu_only_parallel_slots(const ModelConfig& c, int64_t T, const std::vector<std::pair<int64_t, int64_t>>& stages,
                                const std::vector<int>& devices, double memory_bytes, int64_t max_context) {
  if (max_context <= 0) return 0;
  const int64_t P = int64_t(stages.size());
  const double reserve = double(1ull << 30);  // per rank: cuBLAS and attention workspaces, its share of the context
  std::map<int, std::pair<double, double>> per_device;  // GPU -> (fixed bytes, bytes per sequence)
  for (int64_t g = 0; g < T * P; ++g) {
    const int64_t p = g / T;
    const GpuOnlyRankMemory m =
        gpu_only_rank_memory(c, T, P, p, stages[size_t(p)].second - stages[size_t(p)].first, max_context);
    auto& d = per_device[devices.at(size_t(g))];
    d.first += m.weights + reserve;
    d.second += m.per_seq;
  }
  int64_t slots = std::numeric_limits<int64_t>::max();
  for (const auto& [dev, d] : per_device) {
    const double free = memory_bytes - d.first;
    slots = std::min<int64_t>(slots, free <= 0 ? 0 : int64_t(free / d.second));
  }
  return slots;
}

int64_t gpu_only_slots(const ModelConfig& c, double memory_bytes, int64_t max_context) {
  return gpu_only_parallel_slots(c, 1, {{0, c.num_layers}}, {0}, memory_bytes, max_context);
}

}  // namespace fd
