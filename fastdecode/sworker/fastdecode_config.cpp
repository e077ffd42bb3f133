// The FastDecode engine's config section: strict parsing and the echo in summary.json.
#include "fastdecode/sworker/fastdecode_config.h"

#include "fastdecode/core/affinity.h"

namespace fd {

// Why an R-worker endpoint cannot be one ("" when it can): tcp://HOST:PORT with a port 1..65535, or ipc://PATH.
std::string endpoint_problem(const std::string& ep) {
  if (ep.rfind("ipc://", 0) == 0) return ep.size() > 6 ? "" : "'" + ep + "': an ipc:// endpoint needs a path";
  if (ep.rfind("tcp://", 0) != 0) return "'" + ep + "' is not an R-worker endpoint (tcp://HOST:PORT or ipc://PATH)";
  const size_t colon = ep.rfind(':');
  if (colon <= 6 || colon + 1 >= ep.size()) return "'" + ep + "': expected tcp://HOST:PORT";
  const std::string port = ep.substr(colon + 1);
  if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 || std::stoi(port) < 1 ||
      std::stoi(port) > 65535)
    return "'" + ep + "': the port must be a number from 1 to 65535";
  return "";
}

namespace {

// The "endpoints" list of `o` (`eps`, not null): non-empty, each a string that endpoint_problem() accepts; a
// failure names the key in `o`.
std::vector<std::string> endpoint_list(StrictObject& o, const json& eps) {
  if (!eps.is_array() || eps.empty()) o.fail("endpoints", "expected a non-empty list of endpoints");
  std::vector<std::string> out;
  for (const auto& e : eps) {
    if (!e.is_string() || e.get<std::string>().empty()) o.fail("endpoints", "every endpoint must be a string");
    const std::string why = endpoint_problem(e.get<std::string>());
    if (!why.empty()) o.fail("endpoints", why);
    out.push_back(e.get<std::string>());
  }
  return out;
}

}  // namespace

std::vector<std::string> RWorkersConfig::spawn_args(const std::string& name, int64_t first_cpu) const {
  std::vector<std::string> a = {"--threads", std::to_string(threads), "--kv-dtype", kv_dtype,
                                "--memory-gb", std::to_string(memory_gb), "--name", name};
  if (query != "auto") a.insert(a.end(), {"--query", query});
  if (spin_us > 0) a.insert(a.end(), {"--spin-us", std::to_string(spin_us)});
  if (pin) a.insert(a.end(), {"--cpus", std::to_string(first_cpu) + "-" + std::to_string(first_cpu + threads - 1)});
  return a;
}

RWorkersConfig RWorkersConfig::parse(StrictObject& r, int64_t ranks) {
  RWorkersConfig rw;
  const json& eps = r.get_raw("endpoints");
  if (!eps.is_null()) {
    rw.endpoints = endpoint_list(r, eps);
    for (const char* k : {"spawn", "threads", "kv_dtype", "query", "memory_gb", "binary", "pin"})
      if (r.has(k)) r.fail(k, "applies to spawned R-workers; not allowed with endpoints");
  }
  rw.on_failure = r.get_enum("on_failure", {"recover", "fail"}, std::string("recover"));
  rw.heartbeat_ms = r.get_int("heartbeat_ms", 0, 3600000, 500);
  rw.heartbeat_timeout_ms = r.get_int("heartbeat_timeout_ms", 1, 3600000, 3000);
  rw.shm = r.get_bool("shm", true);
  rw.shm_in_place = r.get_bool("shm_in_place", true);
  rw.spin_us = r.get_int("spin_us", 0, 1000000, 0);
  rw.append_chunk_kb = r.get_int("append_chunk_kb", 1, int64_t(1) << 22, 8192);
  if (rw.heartbeat_ms > 0 && rw.heartbeat_timeout_ms < rw.heartbeat_ms)
    r.fail("heartbeat_timeout_ms", "must be at least heartbeat_ms (" + std::to_string(rw.heartbeat_ms) + ")");
  if (r.has("curve")) {
    StrictObject cv = r.get_object("curve");
    rw.curve_server_public = cv.get_string("server_public");
    rw.curve_client_secret = cv.get_string("client_secret");
    cv.finish();
  } else {
    r.get_raw("curve");
  }
  rw.register_endpoint = r.get_string("register", "");
  rw.expect = r.get_int("expect", 1, 4096, 0);
  rw.register_timeout_ms = r.get_int("register_timeout_ms", 100, 86400000, 120000);
  if (!rw.register_endpoint.empty()) {
    if (rw.expect < 1) r.fail("expect", "needed with register: how many R-workers to wait for");
    if (rw.register_endpoint.rfind("tcp://", 0) != 0) r.fail("register", "a tcp://HOST:PORT endpoint to listen on");
    for (const char* k : {"endpoints", "spawn", "threads", "kv_dtype", "query", "memory_gb", "binary", "pin", "groups"})
      if (r.has(k)) r.fail(k, "not allowed with register (the registered workers are the R-workers)");
  } else if (rw.expect > 0) {
    r.fail("expect", "applies with register (the endpoint registering workers announce themselves to)");
  }
  if (!rw.register_endpoint.empty() && ranks > 1)
    r.fail("register", "not with engine.parallel (list each group's endpoints in engine.rworkers.groups)");
  rw.spawn = r.get_int("spawn", 1, 256, 2);
  rw.threads = r.get_int("threads", 1, 4096, 1);
  rw.kv_dtype = r.get_enum("kv_dtype", {"fp16", "int8", "int4"}, std::string("fp16"));
  rw.query = r.get_enum("query", {"auto", "fp32", "int8"}, std::string("auto"));
  rw.memory_gb = r.get_number("memory_gb", 0.001, 1e6, 1.0);
  rw.timeout_ms = r.get_int("timeout_ms", 10, 3600000, 60000);
  rw.binary = r.get_string("binary", "");
  rw.pin = r.get_bool("pin", false);
  const json& gs = r.get_raw("groups");
  if (!gs.is_null()) {
    if (!gs.is_array() || int64_t(gs.size()) != ranks || ranks < 2)
      r.fail("groups", "expected a list of " + std::to_string(ranks) +
                           " objects, one per S-rank's R-worker group (rank p*T + t), with engine.parallel of 2 or more ranks");
    for (size_t g = 0; g < gs.size(); ++g) {
      if (!gs[g].is_object()) r.fail("groups", "entry " + std::to_string(g) + " is not an object");
      StrictObject go(gs[g], r.file(), "engine.rworkers.groups[" + std::to_string(g) + "]");
      RWorkersConfig::Group grp;
      const json& ge = go.get_raw("endpoints");
      if (!ge.is_null()) {
        grp.endpoints = endpoint_list(go, ge);
        for (const char* k : {"threads", "kv_dtype", "memory_gb", "pin", "first_cpu"})
          if (go.has(k)) go.fail(k, "applies to a spawned group; not allowed with endpoints");
      }
      grp.threads = go.get_int("threads", 1, 4096, -1);
      grp.kv_dtype = go.get_enum("kv_dtype", {"fp16", "int8", "int4"}, std::string());
      grp.memory_gb = go.get_number("memory_gb", 0.001, 1e6, -1);
      if (go.has("pin")) grp.pin = go.get_bool("pin") ? 1 : 0;
      grp.first_cpu = go.get_int("first_cpu", 0, 1 << 20, -1);
      go.finish();
      rw.groups.push_back(std::move(grp));
    }
    size_t n = 0;  // every group's worker count must be the same
    for (const auto& grp : rw.groups) {
      const size_t k = grp.endpoints.empty() ? size_t(rw.spawn) : grp.endpoints.size();
      if (n && k != n)
        r.fail("groups", "every group needs the same number of R-workers (a sequence sits at the same worker index in "
                         "every group): " + std::to_string(n) + " and " + std::to_string(k) +
                         " (spawned groups have engine.rworkers.spawn)");
      n = k;
    }
  }
  r.finish();
  return rw;
}

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
  c.sworker_cpus = o.get_string("sworker_cpus", "");
  if (!c.sworker_cpus.empty() && c.sworker_cpus != "rest") {
    try {
      parse_cpu_list(c.sworker_cpus, "engine.sworker_cpus");
    } catch (const ConfigError&) {
      o.fail("sworker_cpus", "'" + c.sworker_cpus + "' is neither \"rest\" (the CPUs the pinned R-workers leave "
                             "free) nor a CPU list (e.g. 12-15,20)");
    }
  }
  if (o.has("parallel")) {
    StrictObject p = o.get_object("parallel");
    // Slots: 16 per S-Part, the prefill one after the decode mini-batches (waves x mini_batches of them).
    c.parallel = ParallelConfig::parse(p, c.backend != "cpu", 15 / c.mini_batches);
  } else {
    o.get_raw("parallel");
  }
  if (o.has("rworkers")) {
    StrictObject r = o.get_object("rworkers");
    c.rworkers = RWorkersConfig::parse(r, c.parallel.ranks());
  } else {
    o.get_raw("rworkers");
  }
  if (c.parallel.ranks() > 1 && !c.rworkers.endpoints.empty())
    o.fail("parallel", "tensor/pipeline parallelism has one R-worker group per rank: list each group's endpoints in "
                       "engine.rworkers.groups[g].endpoints (engine.rworkers.endpoints is not allowed with it)");
  return c;
}

RWorkersConfig RWorkersConfig::group(size_t g) const {
  RWorkersConfig c = *this;
  c.groups.clear();
  if (groups.empty()) return c;
  const Group& o = groups[g];
  c.endpoints = o.endpoints;
  if (o.threads > 0) c.threads = o.threads;
  if (!o.kv_dtype.empty()) c.kv_dtype = o.kv_dtype;
  if (o.memory_gb > 0) c.memory_gb = o.memory_gb;
  if (o.pin >= 0) c.pin = o.pin == 1;
  return c;
}

json RWorkersConfig::to_json() const {
  const RWorkersConfig& r = *this;
  json j = !r.register_endpoint.empty()
                      ? json{{"register", r.register_endpoint}, {"expect", r.expect}, {"register_timeout_ms", r.register_timeout_ms},
                             {"timeout_ms", r.timeout_ms}}
                  : r.endpoints.empty()
                      ? json{{"spawn", r.spawn}, {"threads", r.threads}, {"kv_dtype", r.kv_dtype}, {"query", r.query}, {"memory_gb", r.memory_gb},
                             {"timeout_ms", r.timeout_ms}, {"binary", r.binary}, {"pin", r.pin}}
                      : json{{"endpoints", r.endpoints}, {"timeout_ms", r.timeout_ms}};
  j["on_failure"] = r.on_failure;
  j["heartbeat_ms"] = r.heartbeat_ms;
  j["heartbeat_timeout_ms"] = r.heartbeat_timeout_ms;
  j["shm"] = r.shm;
  j["shm_in_place"] = r.shm_in_place;
  j["spin_us"] = r.spin_us;
  j["append_chunk_kb"] = r.append_chunk_kb;
  if (!r.curve_server_public.empty())
    j["curve"] = {{"server_public", r.curve_server_public}, {"client_secret", r.curve_client_secret}};
  if (!r.groups.empty()) {
    json gs = json::array();
    for (const auto& g : r.groups) {
      json e = json::object();
      if (!g.endpoints.empty()) e["endpoints"] = g.endpoints;
      if (g.threads > 0) e["threads"] = g.threads;
      if (!g.kv_dtype.empty()) e["kv_dtype"] = g.kv_dtype;
      if (g.memory_gb > 0) e["memory_gb"] = g.memory_gb;
      if (g.pin >= 0) e["pin"] = g.pin == 1;
      if (g.first_cpu >= 0) e["first_cpu"] = g.first_cpu;
      gs.push_back(e);
    }
    j["groups"] = gs;
  }
  return j;
}

json FastDecodeConfig::to_json() const {
  json j = {{"backend", backend}, {"mini_batches", mini_batches},
            {"wire_dtype", wire_dtype.empty() ? (backend == "cpu" ? "fp32" : backend == "cuda" ? "fp16" : "auto") : wire_dtype},
            {"prefill_tokens", prefill_tokens}};
  if (!sworker_cpus.empty()) j["sworker_cpus"] = sworker_cpus;
  if (backend != "cpu") j["dtype"] = dtype, j["cuda_graphs"] = cuda_graphs;
  if (parallel.ranks() > 1 || parallel.waves > 0) j["parallel"] = parallel.to_json();
  j["rworkers"] = rworkers.to_json();
  return j;
}

}  // namespace fd
