// The FastDecode engine's config section: strict parsing and the echo in summary.json.
#include "fastdecode/sworker/fastdecode_engine.h"

namespace fd {

FastDecodeConfig FastDecodeConfig::parse(StrictObject& o) {
  FastDecodeConfig c;
  c.backend = o.get_enum("backend", {"cpu", "cuda", "auto"}, std::string("cpu"));
  c.mini_batches = o.get_int("mini_batches", 1, 2, 2);
  c.wire_dtype = o.has("wire_dtype") ? o.get_enum("wire_dtype", {"fp32", "fp16"}, std::string()) : std::string();
  for (const char* k : {"dtype", "cuda_graphs"})
    if (o.has(k) && c.backend == "cpu")
      o.fail(k, "applies to the cuda (or auto) backend; the cpu backend runs the S-Part in fp32 on the CPU");
  c.dtype = o.get_enum("dtype", {"fp16", "bf16"}, std::string("fp16"));
  c.cuda_graphs = o.get_bool("cuda_graphs", true);
  c.prefill_tokens = o.get_int("prefill_tokens", 1, 1 << 24, 16384);
  if (o.has("parallel")) {
    StrictObject p = o.get_object("parallel");
    ParallelConfig& pc = c.parallel;
    pc.tensor = p.get_int("tensor", 1, 64, 1);
    pc.pipeline = p.get_int("pipeline", 1, 64, 1);
    const json& ls = p.get_raw("layers");
    if (!ls.is_null()) {
      if (!ls.is_array() || int64_t(ls.size()) != pc.pipeline)
        p.fail("layers", "expected a list of " + std::to_string(pc.pipeline) + " layer counts, one per pipeline stage");
      for (const auto& n : ls) {
        if (!n.is_number_integer() || n.get<int64_t>() < 1) p.fail("layers", "every stage needs at least 1 layer");
        pc.layers.push_back(n.get<int64_t>());
      }
    }
    pc.timeout_ms = p.get_int("timeout_ms", 100, 3600000, 60000);
    pc.comm = p.get_enum("comm", {"auto", "gloo", "nccl"}, std::string("auto"));
    const json& ds = p.get_raw("devices");
    if (!ds.is_null()) {
      if (c.backend == "cpu") p.fail("devices", "applies to the cuda backend (the GPU of each rank)");
      if (!ds.is_array() || int64_t(ds.size()) != pc.ranks())
        p.fail("devices", "expected a list of " + std::to_string(pc.ranks()) + " GPU indices, one per rank (rank p*T + t)");
      for (const auto& d : ds) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0) p.fail("devices", "every entry must be a GPU index >= 0");
        pc.devices.push_back(d.get<int64_t>());
      }
    }
    if (pc.comm == "nccl" && c.backend == "cpu") p.fail("comm", "nccl moves GPU buffers; the cpu backend uses gloo");
    p.finish();
  } else {
    o.get_raw("parallel");
  }
  if (o.has("rworkers")) {
    StrictObject r = o.get_object("rworkers");
    RWorkersConfig& rw = c.rworkers;
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
  if (c.parallel.ranks() > 1 && !c.rworkers.endpoints.empty())
    o.fail("parallel", "tensor/pipeline parallelism spawns one R-worker group per rank (engine.rworkers.spawn each); "
                       "engine.rworkers.endpoints is not allowed with it");
  return c;
}

json FastDecodeConfig::to_json() const {
  json j = {{"backend", backend}, {"mini_batches", mini_batches},
            {"wire_dtype", wire_dtype.empty() ? (backend == "cpu" ? "fp32" : backend == "cuda" ? "fp16" : "auto") : wire_dtype},
            {"prefill_tokens", prefill_tokens}};
  if (backend != "cpu") j["dtype"] = dtype, j["cuda_graphs"] = cuda_graphs;
  if (parallel.ranks() > 1)
    j["parallel"] = {{"tensor", parallel.tensor}, {"pipeline", parallel.pipeline}, {"layers", parallel.layers},
                     {"timeout_ms", parallel.timeout_ms}, {"comm", parallel.comm}, {"devices", parallel.devices}};
  const RWorkersConfig& r = rworkers;
  j["rworkers"] = r.endpoints.empty()
                      ? json{{"spawn", r.spawn}, {"threads", r.threads}, {"kv_dtype", r.kv_dtype}, {"memory_gb", r.memory_gb},
                             {"timeout_ms", r.timeout_ms}, {"binary", r.binary}, {"pin", r.pin}}
                      : json{{"endpoints", r.endpoints}, {"timeout_ms", r.timeout_ms}};
  return j;
}

}  // namespace fd
