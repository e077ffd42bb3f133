// The FastDecode engine: the S-Part (here on the CPU backend) batched over all running sequences,
// the R-Part on R-worker processes that hold the KV-cache, in the two mini-batch pipeline.
#pragma once
#include <memory>

#include "fastdecode/engine/engine.h"

namespace fd {

std::unique_ptr<Engine> make_fastdecode_engine(const EngineConfig& ec, const ModelConfig& model, TensorSource& weights,
                                               const SamplingParams& sampling);

}  // namespace fd
