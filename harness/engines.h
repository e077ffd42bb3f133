// The engines the harness can run, by name: harness/engines.cpp is the one place that names them. Each
// engine owns its config section (parse, echo) and its factory; this table only binds them to names.
#pragma once
#include <any>
#include <memory>
#include <string>
#include <vector>

#include "fastdecode/engine/engine.h"

namespace fd {

// The experiment's "engine" object: the type, the keys common to all engines, and the engine's own
// config (its type's XConfig, held by value).
struct EngineSpec {
  std::string type = "reference";
  int64_t threads = 0;  // OpenMP threads for the engine's own CPU compute; 0 = all cores
  std::any config;      // e.g. FastDecodeConfig for "fastdecode"
};

// Validates the "engine" object: unknown keys and bad values are ConfigErrors naming the key.
EngineSpec parse_engine_spec(StrictObject o);
// The section with defaults filled in (echoed in summary.json).
json engine_spec_to_json(const EngineSpec& spec);
// Names accepted by "engine.type".
std::vector<std::string> engine_types();
// ctx.hardware.gpu_gemm_table is resolved first (resolve_gemm_table): the engines get a file or "".
std::unique_ptr<Engine> make_engine(const EngineSpec& spec, const EngineContext& ctx);
// hardware.gpu.gemm_table as the engines take it: "none" -> ""; "auto" -> configs/gemm/<the first CUDA device's
// table file> (gemm_table_file_name) in the source tree when it exists, else ""; a file as it is.
std::string resolve_gemm_table(const std::string& spec);
// The sequences the gpu-only engine holds for a model, a GPU memory budget (bytes) and its slots' max_context, counted
// as that engine counts them (fd-bench predict --engine gpu-only).
int64_t gpu_only_capacity(const ModelConfig& model, double memory_bytes, int64_t max_context);
// The FastDecode engine's R-workers as fd-sim models them: processes (the endpoints given, else those spawned, or the
// hardware balance's count), compute threads each, KV dtype. ConfigError for another engine type.
struct RWorkerShape {
  int64_t processes = 0, threads = 0;
  std::string kv_dtype;
};
RWorkerShape fastdecode_rworkers(const EngineSpec& spec, const HardwareBalance& hardware);

}  // namespace fd
