// The one place that names every engine: a table of {name, parse, to_json, make}, each entry bound to
// the engine's own config type and factory.
#include "harness/engines.h"

#include <omp.h>

#include <filesystem>
#include <functional>
#include <set>

#include "baselines/gpu_only/gpu_only_engine.h"
#include "extensions/hybrid/hybrid_engine.h"
#include "baselines/host_offload/host_offload_engine.h"
#include "baselines/paged_swap/paged_swap_engine.h"
#include "baselines/reference/reference_engine.h"
#include "baselines/vanilla/vanilla_engine.h"
#include "fastdecode/spart/gemm_table.h"
#include "fastdecode/sworker/fastdecode_engine.h"
#include "kernels/cuda/device_info.h"

namespace fd {

namespace {

struct EngineEntry {
  std::string name;
  std::function<std::any(StrictObject&)> parse;
  std::function<json(const std::any&)> to_json;
  std::function<std::unique_ptr<Engine>(const std::any&, const EngineContext&)> make;
};

template <typename Config>
EngineEntry entry(std::string name, std::unique_ptr<Engine> (*make)(const Config&, const EngineContext&)) {
  return {std::move(name), [](StrictObject& o) { return std::any(Config::parse(o)); },
          [](const std::any& c) { return std::any_cast<const Config&>(c).to_json(); },
          [make](const std::any& c, const EngineContext& ctx) { return make(std::any_cast<const Config&>(c), ctx); }};
}

const std::vector<EngineEntry>& engines() {
  static const std::vector<EngineEntry> table = {
      entry<ReferenceEngineConfig>("reference", make_reference_engine),
      entry<FastDecodeConfig>("fastdecode", make_fastdecode_engine),
      entry<GpuOnlyConfig>("gpu-only", make_gpu_only_engine),
      entry<PagedSwapConfig>("paged-swap", make_paged_swap_engine),
      entry<VanillaConfig>("vanilla", make_vanilla_engine),
      entry<HostOffloadConfig>("host-offload", make_host_offload_engine),
      entry<HybridConfig>("hybrid", make_hybrid_engine),
  };
  return table;
}

const EngineEntry& find(const std::string& type) {
  for (const auto& e : engines())
    if (e.name == type) return e;
  FD_THROW("unknown engine type '" << type << "'");
}

}  // namespace

std::vector<std::string> engine_types() {
  std::vector<std::string> names;
  for (const auto& e : engines()) names.push_back(e.name);
  return names;
}

EngineSpec parse_engine_spec(StrictObject o) {
  EngineSpec spec;
  const auto types = engine_types();
  spec.type = o.get_enum("type", std::set<std::string>(types.begin(), types.end()));
  spec.threads = o.get_int("threads", 0, 4096, 0);
  spec.config = find(spec.type).parse(o);
  o.finish();
  return spec;
}

json engine_spec_to_json(const EngineSpec& spec) {
  json j = {{"type", spec.type}, {"threads", spec.threads}};
  j.update(find(spec.type).to_json(spec.config));
  return j;
}

std::string resolve_gemm_table(const std::string& spec) {
  if (spec == "none" || spec.empty()) return "";
  if (spec != "auto") return spec;
  const auto devs = cuda_devices();
  if (devs.empty()) return "";
  const std::string p = std::string(FD_SOURCE_DIR) + "/configs/gemm/" + gemm_table_file_name(devs[0].name);
  return std::filesystem::exists(p) ? p : "";
}

std::unique_ptr<Engine> make_engine(const EngineSpec& spec, const EngineContext& ctx) {
  if (spec.threads > 0) omp_set_num_threads(int(spec.threads));
  EngineContext c = ctx;
  c.hardware.gpu_gemm_table = resolve_gemm_table(ctx.hardware.gpu_gemm_table);
  return find(spec.type).make(spec.config, c);
}

int64_t gpu_only_capacity(const ModelConfig& model, double memory_bytes, int64_t max_context) {
  return gpu_only_slots(model, memory_bytes, max_context);
}

RWorkerShape fastdecode_rworkers(const EngineSpec& spec, const HardwareBalance& hardware) {
  if (spec.type != "fastdecode") throw ConfigError("engine.type is '" + spec.type + "': fd-sim models the fastdecode engine");
  const FastDecodeConfig& c = std::any_cast<const FastDecodeConfig&>(spec.config);
  RWorkerShape r;
  r.processes = !c.rworkers.endpoints.empty() ? int64_t(c.rworkers.endpoints.size())
                : hardware.rworkers > 0       ? hardware.rworkers
                                              : c.rworkers.spawn;
  r.threads = hardware.rworker_threads > 0 ? hardware.rworker_threads : c.rworkers.threads;
  r.kv_dtype = c.rworkers.kv_dtype;
  return r;
}

}  // namespace fd
