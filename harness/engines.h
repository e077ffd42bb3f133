// The engines the harness can run, by name: the one place that names them (harness/engines.cpp).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "fastdecode/engine/engine.h"

namespace fd {

// Validates the "engine" object (unknown keys and bad values are ConfigErrors naming the key).
EngineConfig parse_engine_config(StrictObject o);
// The config with defaults filled in (echoed in summary.json).
json engine_config_to_json(const EngineConfig& ec);
// Names accepted by "engine.type".
std::vector<std::string> engine_types();
std::unique_ptr<Engine> make_engine(const EngineConfig& ec, const ModelConfig& model, TensorSource& weights,
                                    const SamplingParams& sampling);

}  // namespace fd
