#include "fastdecode/spart/rank_layout.h"

#include "fastdecode/core/json_util.h"
#include "fastdecode/model/shard.h"
#include "kernels/cuda/device_info.h"

namespace fd {

RankLayout rank_layout(const ModelConfig& model, const ParallelConfig& pc) {
  RankLayout l;
  l.T = pc.tensor, l.P = pc.pipeline, l.G = l.T * l.P;
  l.stages = {{0, model.num_layers}};
  if (l.G > 1) {
    check_tensor_parallel(model, l.T);
    l.stages = stage_layers(model.num_layers, l.P, pc.layers);
  }
  return l;
}

void place_ranks(RankLayout& l, const ParallelConfig& pc, RankGpus which, int64_t n_gpus, const std::string& engine) {
  const bool own = which == RankGpus::kParallel ? l.G > 1
                   : which == RankGpus::kParallelOrListed ? l.G > 1 || !pc.devices.empty()
                                                          : false;
  if (!own) {
    l.devices.assign(size_t(l.G), 0);
    return;
  }
  if (n_gpus < 0) n_gpus = int64_t(cuda_devices().size());
  l.devices = rank_devices(pc, n_gpus, engine);
}

std::vector<ModelWeights> load_rank_weights(const RankLayout& l, const ModelConfig& model, TensorSource& src) {
  std::vector<ModelWeights> weights;
  if (l.G == 1) weights.push_back(load_model_weights(model, src));
  else weights = load_model_shards(model, src, l.T, l.stages);
  return weights;
}

std::vector<std::string> rank_notes(const RankLayout& l, const RankComms& comms) {
  std::vector<std::string> notes;
  if (l.G == 1) return notes;
  bool shared = false;
  for (int64_t g = 1; g < l.G; ++g) shared = shared || l.devices[size_t(g)] == l.devices[0];
  if (shared)
    notes.push_back("engine.parallel: S-ranks share a GPU (devices " + json(l.devices).dump() + "): a correctness run; "
                    "its times say nothing about one GPU per rank");
  if (l.P > 1)
    notes.push_back("engine.parallel: pipeline hand-offs go through pinned host memory (an in-process mailbox), "
                    "not GPU to GPU");
  if (l.T > 1 && !comms.tensor_device_buffers())
    notes.push_back("engine.parallel: tensor collectives go through pinned host copies (" + comms.tensor_describe() + ")");
  return notes;
}

}  // namespace fd
