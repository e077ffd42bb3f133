// The S-rank layout every engine with tensor and pipeline ranks builds on (docs/PARALLEL.md): T, P and G = T x P
// ranks (rank g = p*T + t: tensor part t of stage p), each stage's layers, each rank's GPU and each rank's weights.
// An engine makes it in its resolve step, before it starts anything, so each refusal here (fd::ConfigError, or the
// checkpoint's error) leaves nothing running. The FastDecode engine and the GPU-only baseline both use it.
//
// Why it is here, beside the S-Part: it needs the model's cuts (fastdecode/model/shard.h), the engine.parallel
// section (fastdecode/parallel/ranks.h) and the GPUs that answer (kernels/cuda/device_info.h). fastdecode_spart
// links all three, and both engines link it. fastdecode/parallel may include only core/, and fastdecode/engine
// (the interface) only core/ and model/.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fastdecode/model/model_config.h"
#include "fastdecode/model/weights.h"
#include "fastdecode/parallel/ranks.h"

namespace fd {

struct RankLayout {
  int64_t T = 1, P = 1, G = 1;
  std::vector<std::pair<int64_t, int64_t>> stages;  // per stage p: its global layers [begin, end)
  std::vector<int> devices;                         // per rank g: its GPU (place_ranks)
  int64_t tp_rank(size_t g) const { return int64_t(g) % T; }
  int64_t pp_rank(size_t g) const { return int64_t(g) / T; }
};

// T, P, G and each stage's layers. With G > 1 the model must split T ways (check_tensor_parallel) and its layers
// over P stages (stage_layers, engine.parallel.layers); with G = 1 there is one stage of every layer and no check.
// devices is left empty.
RankLayout rank_layout(const ModelConfig& model, const ParallelConfig& pc);

// Which ranks take the GPU rank_devices gives them; every other rank is on GPU 0.
enum class RankGpus {
  kNone,              // none: the ranks run on no GPU (the FastDecode engine's cpu backend)
  kParallel,          // every rank when G > 1 (the FastDecode engine's cuda backend: one S-rank is on GPU 0)
  kParallelOrListed,  // also a single rank when engine.parallel.devices lists its GPU (the GPU-only baseline)
};

// Sets layout.devices, G entries. n_gpus: the devices that answer; < 0: cuda_devices() is asked, and only when
// rank_devices runs. `engine` names the engine in rank_devices' refusals.
void place_ranks(RankLayout& layout, const ParallelConfig& pc, RankGpus which, int64_t n_gpus, const std::string& engine);

// Each rank's weights, rank g = p*T + t: load_model_weights when G = 1, else load_model_shards over the layout.
std::vector<ModelWeights> load_rank_weights(const RankLayout& layout, const ModelConfig& model, TensorSource& src);

// The notes of G > 1 ranks on GPUs (none when G = 1): ranks that share a GPU, stage hand-offs through pinned host
// memory, tensor collectives through pinned host copies.
std::vector<std::string> rank_notes(const RankLayout& layout, const RankComms& comms);

}  // namespace fd
