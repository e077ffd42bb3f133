// The one place that names every engine: parsing each engine's config section, echoing it, making it.
#include "harness/engines.h"

#include <omp.h>

#include "baselines/gpu_only/gpu_only_engine.h"
#include "baselines/reference/reference_engine.h"
#include "fastdecode/sworker/fastdecode_engine.h"
#include "kernels/cuda/device_info.h"

namespace fd {

std::vector<std::string> engine_types() { return {"reference", "fastdecode", "gpu-only"}; }

EngineConfig parse_engine_config(StrictObject o) {
  EngineConfig ec;
  const auto types = engine_types();
  ec.type = o.get_enum("type", std::set<std::string>(types.begin(), types.end()));
  ec.threads = o.get_int("threads", 0, 4096, 0);
  if (ec.type == "reference") ec.kv_dtype = o.get_enum("kv_dtype", {"fp32", "fp16", "bf16"}, std::string("fp32"));
  if (ec.type == "fastdecode") {
    ec.backend = o.get_enum("backend", {"cpu", "cuda", "auto"}, std::string("cpu"));
    if (ec.backend == "auto") ec.backend = cuda_devices().empty() ? "cpu" : "cuda";
    ec.mini_batches = o.get_int("mini_batches", 1, 2, 2);
    ec.wire_dtype = o.get_enum("wire_dtype", {"fp32", "fp16"}, std::string(ec.backend == "cuda" ? "fp16" : "fp32"));
    for (const char* k : {"dtype", "cuda_graphs"})
      if (o.has(k) && (!o.has("backend") || o.get_raw("backend") == "cpu"))
        o.fail(k, "applies to the cuda (or auto) backend; the cpu backend runs the S-Part in fp32 on the CPU");
    ec.dtype = o.get_enum("dtype", {"fp16", "bf16"}, std::string("fp16"));
    ec.cuda_graphs = o.get_bool("cuda_graphs", true);
    if (o.has("rworkers")) {
      StrictObject r = o.get_object("rworkers");
      RWorkersConfig& rw = ec.rworkers;
      const json& eps = r.get_raw("endpoints");
      if (!eps.is_null()) {
        if (!eps.is_array() || eps.empty()) r.fail("endpoints", "expected a non-empty list of endpoints");
        for (const auto& e : eps) {
          if (!e.is_string() || e.get<std::string>().empty()) r.fail("endpoints", "every endpoint must be a string");
          rw.endpoints.push_back(e.get<std::string>());
        }
        for (const char* k : {"spawn", "threads", "kv_dtype", "memory_gb", "binary", "pin"})
          if (r.has(k)) r.fail(k, "applies to spawned R-workers; not allowed with endpoints");
      }
      rw.spawn = r.get_int("spawn", 1, 256, 2);
      rw.threads = r.get_int("threads", 1, 4096, 1);
      rw.kv_dtype = r.get_enum("kv_dtype", {"fp16", "int8", "int4"}, std::string("fp16"));
      rw.memory_gb = r.get_number("memory_gb", 0.001, 1e6, 1.0);
      rw.timeout_ms = r.get_int("timeout_ms", 10, 3600000, 60000);
      rw.binary = r.get_string("binary", "");
      rw.pin = r.get_bool("pin", false);
      r.finish();
    } else {
      o.get_raw("rworkers");
    }
  }
  if (ec.type == "gpu-only") {
    ec.max_context = o.get_int("max_context", 1, 1 << 24, 0);
    ec.cuda_graphs = o.get_bool("cuda_graphs", true);
    ec.dtype = o.get_enum("dtype", {"fp16", "bf16"}, std::string("fp16"));
  }
  if (ec.type != "reference") ec.prefill_tokens = o.get_int("prefill_tokens", 1, 1 << 24, 16384);
  o.finish();
  return ec;
}

json engine_config_to_json(const EngineConfig& ec) {
  json j = {{"type", ec.type}, {"threads", ec.threads}};
  if (ec.type == "reference") j["kv_dtype"] = ec.kv_dtype;
  if (ec.type == "fastdecode") {
    j["backend"] = ec.backend;
    j["mini_batches"] = ec.mini_batches;
    j["wire_dtype"] = ec.wire_dtype;
    if (ec.backend == "cuda") j["dtype"] = ec.dtype, j["cuda_graphs"] = ec.cuda_graphs;
    const RWorkersConfig& r = ec.rworkers;
    j["rworkers"] = r.endpoints.empty()
                        ? json{{"spawn", r.spawn}, {"threads", r.threads}, {"kv_dtype", r.kv_dtype},
                               {"memory_gb", r.memory_gb}, {"timeout_ms", r.timeout_ms}, {"binary", r.binary}, {"pin", r.pin}}
                        : json{{"endpoints", r.endpoints}, {"timeout_ms", r.timeout_ms}};
  }
  if (ec.type == "gpu-only") j["max_context"] = ec.max_context, j["cuda_graphs"] = ec.cuda_graphs, j["dtype"] = ec.dtype;
  if (ec.type != "reference") j["prefill_tokens"] = ec.prefill_tokens;
  return j;
}

std::unique_ptr<Engine> make_engine(const EngineConfig& ec, const ModelConfig& model, TensorSource& weights,
                                    const SamplingParams& sampling) {
  if (ec.threads > 0) omp_set_num_threads(int(ec.threads));
  if (ec.type == "reference")
    return std::make_unique<ReferenceEngine>(model, weights, sampling, dtype_from_name(ec.kv_dtype));
  if (ec.type == "fastdecode") return make_fastdecode_engine(ec, model, weights, sampling);
  if (ec.type == "gpu-only") return make_gpu_only_engine(ec, model, weights, sampling);
  FD_THROW("unknown engine type '" << ec.type << "'");
}

}  // namespace fd
