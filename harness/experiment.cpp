#include "harness/experiment.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace fd {

namespace fs = std::filesystem;

static std::string resolve(const std::string& base_file, const std::string& p) {
  if (p.empty() || fs::path(p).is_absolute()) return p;
  return (fs::path(base_file).parent_path() / p).lexically_normal().string();
}

static LengthDist parse_length(StrictObject& o, const std::string& key, int64_t lo, int64_t hi) {
  const json& v = o.get_raw(key);
  LengthDist d;
  if (v.is_null()) o.fail(key, "required key is missing");
  if (v.is_object()) {
    StrictObject u = o.get_object(key);
    d.min = u.get_int("min", lo, hi);
    d.max = u.get_int("max", lo, hi);
    u.get_enum("dist", {"uniform"}, std::string("uniform"));
    u.finish();
    if (d.max < d.min) o.fail(key, "max < min");
  } else {
    d.min = d.max = o.get_int(key, lo, hi);
  }
  return d;
}


[[noreturn]] static void line_fail(const std::string& where, const std::string& what) {
  throw ConfigError(where + ": " + what);
}

std::vector<FileRequest> load_workload_file(const std::string& path, const std::string& kind, bool with_arrivals) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot open " + kind + " file");
  std::set<std::string> keys;
  if (kind == "prompts") keys = {"prompt", "gen_len", "max_gen_len", "arrival_s", "temperature", "top_k", "top_p", "seed"};
  else if (kind == "score") keys = {"prompt", "continuation", "arrival_s"};
  else if (kind == "trace") keys = {"arrival_s", "prompt", "prompt_len", "gen_len", "max_gen_len", "temperature", "top_k", "top_p", "seed"};
  else FD_THROW("load_workload_file: unknown kind " << kind);
  std::string key_list;
  for (const auto& k : keys) key_list += (key_list.empty() ? "" : ", ") + k;
  std::vector<FileRequest> out;
  std::string line;
  int64_t lineno = 0;
  double prev = 0.0;
  // Every bad line is reported (the first kMaxReported of them), not only the first: fixing a file takes one pass.
  constexpr size_t kMaxReported = 20;
  std::vector<std::string> bad;
  size_t n_bad = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      FileRequest r;
      r.where = path + ":" + std::to_string(lineno);
      const std::string& w = r.where;
      json j;
      try {
        j = json::parse(line);
      } catch (const json::parse_error& e) {
        line_fail(w, std::string("not JSON: ") + e.what());
      }
      if (!j.is_object()) line_fail(w, "expected a JSON object");
      for (const auto& [k, v] : j.items())
        if (!keys.count(k)) line_fail(w, "unknown key '" + k + "' (a " + kind + " line has " + key_list + ")");
      const auto get_int = [&](const char* k, int64_t lo) -> std::optional<int64_t> {
        if (!j.contains(k)) return std::nullopt;
        const json& v = j[k];
        if (!v.is_number_integer()) line_fail(w, std::string("'") + k + "' must be an integer");
        const int64_t x = v.get<int64_t>();
        if (x < lo) line_fail(w, std::string("'") + k + "' = " + std::to_string(x) + " must be >= " + std::to_string(lo));
        return x;
      };
      const auto get_num = [&](const char* k) -> std::optional<double> {
        if (!j.contains(k)) return std::nullopt;
        if (!j[k].is_number()) line_fail(w, std::string("'") + k + "' must be a number");
        const double x = j[k].get<double>();
        if (!std::isfinite(x)) line_fail(w, std::string("'") + k + "' must be finite");
        return x;
      };
      const auto get_tokens = [&](const char* k) {
        std::vector<int32_t> t;
        const json& v = j[k];
        if (!v.is_array()) line_fail(w, std::string("'") + k + "' must be a list of token ids");
        for (const json& x : v) {
          // Range against the model's vocabulary: parse_experiment (validate_request).
          if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT32_MAX)
            line_fail(w, std::string("'") + k + "': " + x.dump() + " is not a token id (an integer >= 0)");
          t.push_back(int32_t(x.get<int64_t>()));
        }
        if (t.empty()) line_fail(w, std::string("'") + k + "' is empty");
        return t;
      };
      // arrival_s
      if (with_arrivals) {
        const auto a = get_num("arrival_s");
        if (!a) line_fail(w, "missing key 'arrival_s' (\"arrival\": \"trace\")");
        if (*a < 0) line_fail(w, "'arrival_s' must be >= 0");
        if (*a < prev) line_fail(w, "'arrival_s' decreases (the file must be sorted by arrival)");
        prev = r.arrival_s = *a;
      } else if (j.contains("arrival_s")) {
        line_fail(w, "'arrival_s' only with \"arrival\": \"trace\" in the workload");
      }
      // prompt
      if (j.contains("prompt")) {
        if (j.contains("prompt_len")) line_fail(w, "give 'prompt' or 'prompt_len', not both");
        r.prompt = get_tokens("prompt");
        r.prompt_len = int64_t(r.prompt.size());
      } else if (kind == "trace" && j.contains("prompt_len")) {
        r.prompt_len = *get_int("prompt_len", 1);
      } else {
        line_fail(w, kind == "trace" ? "missing key 'prompt_len' (or 'prompt')" : "missing key 'prompt'");
      }
      // lengths
      if (kind == "score") {
        if (!j.contains("continuation")) line_fail(w, "missing key 'continuation'");
        r.forced = get_tokens("continuation");
        r.gen_len = r.max_gen_len = int64_t(r.forced.size());
      } else {
        const auto g = get_int("gen_len", 1);
        if (!g) line_fail(w, "missing key 'gen_len'");
        r.gen_len = *g;
        r.max_gen_len = get_int("max_gen_len", 1).value_or(r.gen_len);
        if (r.max_gen_len < r.gen_len) line_fail(w, "'max_gen_len' < 'gen_len'");
        r.temperature = get_num("temperature");
        if (r.temperature && *r.temperature < 0) line_fail(w, "'temperature' must be >= 0");
        if (const auto k = get_int("top_k", 0)) r.top_k = *k;
        r.top_p = get_num("top_p");
        if (r.top_p && !(*r.top_p > 0 && *r.top_p <= 1)) line_fail(w, "'top_p' must be in (0, 1]");
        if (const auto sd = get_int("seed", 0)) r.seed = uint64_t(*sd);
      }
      out.push_back(std::move(r));
    } catch (const ConfigError& e) {
      if (++n_bad <= kMaxReported) bad.push_back(e.what());
    }
  }
  if (!bad.empty()) {
    std::string msg;
    for (const std::string& b : bad) msg += (msg.empty() ? "" : "\n") + b;
    if (n_bad > bad.size()) msg += "\n" + path + ": and " + std::to_string(n_bad - bad.size()) + " more bad line(s)";
    if (n_bad > 1) msg += "\n" + path + ": " + std::to_string(n_bad) + " bad line(s) in all";
    throw ConfigError(msg);
  }
  return out;
}

void apply_override(json& config, const std::string& a) {
  const auto fail = [&](const std::string& what) { throw ConfigError("--set " + a + ": " + what); };
  const size_t eq = a.find('=');
  if (eq == std::string::npos) fail("expected KEY=VALUE (e.g. workload.requests=64)");
  const std::string key = a.substr(0, eq), text = a.substr(eq + 1);
  std::vector<std::string> parts;
  for (size_t b = 0;;) {
    const size_t d = key.find('.', b);
    parts.push_back(key.substr(b, d == std::string::npos ? std::string::npos : d - b));
    if (parts.back().empty()) fail("empty key in '" + key + "'");
    if (d == std::string::npos) break;
    b = d + 1;
  }
  json value;
  try {
    value = json::parse(text);
  } catch (const json::parse_error&) {
    value = text;  // not JSON: a string (e.g. int8)
  }
  if (!config.is_object()) fail("the config is not a JSON object");
  json* cur = &config;
  std::string path;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    path += (path.empty() ? "" : ".") + parts[i];
    json& next = (*cur)[parts[i]];
    if (next.is_null()) next = json::object();
    if (!next.is_object()) fail(path + " is not an object (it is " + next.dump() + ")");
    cur = &next;
  }
  (*cur)[parts.back()] = std::move(value);
}

ExperimentConfig parse_experiment(const json& j, const std::string& path) {
  ExperimentConfig e;
  e.file = path;
  e.raw = j;
  StrictObject top(j, path, "");
  e.name = top.get_string("name", fs::path(path).stem().string());
  e.description = top.get_string("description", "");

  // model: {config, layers, weights: {seed, dtype} | {dir}}
  {
    StrictObject m = top.get_object("model");
    std::string cfg_path = resolve(path, m.get_string("config", ""));
    StrictObject w = m.get_object("weights");
    e.weights.dir = resolve(path, w.get_string("dir", ""));
    if (e.weights.dir.empty()) {
      e.weights.seed = uint64_t(w.get_int("seed", 0, int64_t(1) << 53));
      e.weights.dtype = dtype_from_name(w.get_enum("dtype", {"fp32", "fp16", "bf16"}, std::string("fp16")));
    } else if (w.has("seed") || w.has("dtype")) {
      w.fail("dir", "give either dir or seed/dtype, not both");
    }
    w.finish();
    if (cfg_path.empty()) {
      if (e.weights.dir.empty()) m.fail("config", "required unless weights.dir is given");
      cfg_path = (fs::path(e.weights.dir) / "config.json").string();
    }
    e.model_config_path = cfg_path;
    e.model = load_model_config(cfg_path);
    if (m.has("layers")) {
      const int64_t layers = m.get_int("layers", 1, e.model.full_num_layers);
      e.model = with_layers(e.model, layers);
    } else {
      m.get_raw("layers");
    }
    // The checkpoint's headers (every shard's) and its tensor set against the model, before any work.
    if (!e.weights.dir.empty()) check_tensor_source(e.model, *open_safetensors_source(e.weights.dir));
    m.finish();
  }

  // workload
  {
    StrictObject w = top.get_object("workload");
    e.workload.arrival = w.get_enum("arrival", {"offline", "poisson", "trace"}, std::string("offline"));
    std::vector<std::string> files;
    for (const char* k : {"trace", "prompts", "score"})
      if (w.has(k)) files.push_back(k);
    if (files.size() > 1) w.fail(files[1], "give one of workload.trace, workload.prompts, workload.score, not " + files[0] + " and " + files[1]);
    if (e.workload.arrival == "trace" && files.empty())
      w.fail("trace", "required with \"arrival\": \"trace\" (or workload.prompts / workload.score with arrival_s per line)");
    if (!files.empty()) {
      // Requests and lengths come from the file: one request a line.
      const std::string kind = files[0];
      e.workload.source = kind;
      const std::string file = resolve(path, w.get_string(kind));
      (kind == "trace" ? e.workload.trace_file : kind == "prompts" ? e.workload.prompts_file : e.workload.score_file) = file;
      if (kind == "trace" && e.workload.arrival != "trace") w.fail("trace", "only with \"arrival\": \"trace\"");
      for (const char* k : {"prompt_len", "gen_len"})
        if (w.has(k)) w.fail(k, std::string("not allowed with workload.") + kind + " (each line of " + file + " gives the request's lengths)");
      if (kind == "trace" && w.has("requests")) w.fail("requests", "not allowed with \"arrival\": \"trace\" (the trace gives it)");
      auto reqs = load_workload_file(file, kind, e.workload.arrival == "trace");
      if (reqs.empty()) w.fail(kind, file + " holds no request");
      // requests: default all the file's lines; fewer = the first N lines; more is an error.
      e.workload.requests = w.get_int("requests", 1, 1 << 20, int64_t(reqs.size()));
      if (e.workload.requests > int64_t(reqs.size()))
        w.fail("requests", std::to_string(e.workload.requests) + " but " + file + " holds " + std::to_string(reqs.size()) +
                               " requests (give at most that many, or leave requests out for all of them)");
      reqs.resize(size_t(e.workload.requests));
      e.workload.file_requests = std::move(reqs);
      e.workload.prompt_len = {INT64_MAX, 0};
      e.workload.gen_len = {INT64_MAX, 0};
      for (const auto& t : e.workload.file_requests) {
        e.workload.prompt_len = {std::min(e.workload.prompt_len.min, t.prompt_len), std::max(e.workload.prompt_len.max, t.prompt_len)};
        e.workload.gen_len = {std::min(e.workload.gen_len.min, t.gen_len), std::max(e.workload.gen_len.max, t.max_gen_len)};
      }
    } else {
      e.workload.requests = w.get_int("requests", 1, 1 << 20);
      e.workload.prompt_len = parse_length(w, "prompt_len", 1, e.model.position_limit());
      e.workload.gen_len = parse_length(w, "gen_len", 1, e.model.position_limit());
    }
    e.workload.seed = uint64_t(w.get_int("seed", 0, int64_t(1) << 53, 0));
    if (e.workload.arrival == "poisson") e.workload.rate = w.get_number("rate", 1e-6, 1e9);
    else if (w.has("rate")) w.fail("rate", "only with \"arrival\": \"poisson\"");
    e.workload.stop_at_eos = w.get_bool("stop_at_eos", false);
    if (w.has("slo")) {
      StrictObject so = w.get_object("slo");
      const auto limit = [&](const char* k) -> std::optional<double> {
        if (!so.has(k)) return (so.accept({k}), std::nullopt);
        return so.get_number(k, 1e-6, 1e12);
      };
      e.workload.slo = {limit("ttft_ms"), limit("tpot_ms"), limit("e2e_ms")};
      so.finish();
      if (!e.workload.slo.any()) so.fail("ttft_ms", "workload.slo gives no limit (ttft_ms, tpot_ms, e2e_ms)");
    }
    if (e.workload.stop_at_eos && e.workload.source == "score")
      w.fail("stop_at_eos", "not with workload.score (a scored request runs its whole continuation)");
    w.finish();
    // Per-request checks of file requests (token ids, positions) come after "sampling", below.
    const int64_t need = e.workload.prompt_len.max + e.workload.gen_len.max - 1;
    if (e.workload.source == "random" && need > e.model.position_limit())
      w.fail("gen_len", "prompt_len + gen_len - 1 = " + std::to_string(need) + " exceeds the model's " +
                            std::to_string(e.model.position_limit()) + " positions" +
                            (e.model.position_limit_why.empty() ? "" : " (" + e.model.position_limit_why + ")"));
  }

  // sampling (optional: greedy by default)
  if (top.has("sampling")) {
    StrictObject s = top.get_object("sampling");
    e.sampling.temperature = s.get_number("temperature", 0.0, 100.0, 0.0);
    e.sampling.top_k = s.get_int("top_k", 0, e.model.vocab_size, 0);
    e.sampling.top_p = s.get_number("top_p", 1e-9, 1.0, 1.0);
    e.sampling.seed = uint64_t(s.get_int("seed", 0, int64_t(1) << 53, 0));
    s.finish();
  } else {
    top.get_raw("sampling");
  }

  // Every request of a workload file, checked as the engines will check it, named by FILE:LINE.
  if (!e.workload.file_requests.empty()) {
    const std::vector<Request> reqs = make_requests(e.workload, e.model, e.sampling);
    for (size_t i = 0; i < reqs.size(); ++i) {
      try {
        validate_request(reqs[i], e.model);
      } catch (const Error& err) {
        throw ConfigError(e.workload.file_requests[i].where + ": " + err.what());
      }
    }
  }

  // schedule: SLS admission (docs/SCHEDULING.md). Default all-at-once with every request in one batch.
  e.schedule.mode = AdmitMode::AllAtOnce;
  e.schedule.batch = e.workload.requests;
  e.schedule.seq = e.workload.gen_len.max;
  if (top.has("schedule")) {
    StrictObject sc = top.get_object("schedule");
    e.schedule.mode = parse_admit_mode(sc.get_enum("mode", {"all-at-once", "fixed-interval", "load-control"}, std::string("all-at-once")));
    e.schedule.batch = sc.get_int("batch", 1, 1 << 24, e.workload.requests);
    e.schedule.seq = sc.get_int("seq", 1, 1 << 24, e.workload.gen_len.max);
    e.schedule.interval = sc.get_int("interval", 1, 1 << 24, 1);
    e.schedule.micro_batch = sc.get_int("micro_batch", 0, 1 << 24, 0);
    e.schedule.w_lim = sc.get_int("w_lim", 0, int64_t(1) << 50, 0);
    e.schedule.max_running = sc.get_int("max_running", 0, 1 << 24, 0);
    e.schedule.min_gap = sc.get_int("min_gap", 0, 1 << 24, 0);
    e.schedule.kv_capacity_tokens = sc.get_int("kv_capacity_tokens", 0, int64_t(1) << 50, 0);
    if (e.schedule.mode == AdmitMode::LoadControl && e.schedule.w_lim <= 0) sc.fail("w_lim", "required (> 0) for load-control");
    try {
      validate(e.schedule);
    } catch (const ConfigError& err) {
      throw ConfigError(path + ": schedule: " + err.what());
    }
    sc.finish();
  } else {
    top.get_raw("schedule");
  }

  e.engine = parse_engine_spec(top.get_object("engine"));

  e.hardware.gpu_gemm_table = "auto";
  if (top.has("hardware")) {
    StrictObject h = top.get_object("hardware");
    if (h.has("gpu")) {
      StrictObject g = h.get_object("gpu");
      // 0 (the default) = the device's own: a resolved config (summary.json, run --check) loads again as written.
      e.hardware.gpu_memory_gb = g.get_number("memory_gb", 0.0, 1e6, 0.0);
      e.hardware.gpu_sm_count = g.get_int("sm_count", 0, 1 << 16, 0);
      // "auto": the device's table in configs/gemm/ if there is one (make_engine resolves it); "none"; or a file.
      const std::string table = g.get_string("gemm_table", "auto");
      if (table.empty()) g.fail("gemm_table", "\"auto\", \"none\" or a GEMM table file");
      e.hardware.gpu_gemm_table = table == "auto" || table == "none" ? table : resolve(path, table);
      g.finish();
    } else {
      h.get_raw("gpu");
    }
    if (h.has("rworkers")) {
      StrictObject r = h.get_object("rworkers");
      e.hardware.rworkers = r.get_int("count", 1, 4096, 0);
      e.hardware.rworker_threads = r.get_int("threads", 1, 4096, 0);
      r.finish();
    } else {
      h.get_raw("rworkers");
    }
    // The S-worker <-> R-worker link: a named preset or {rate_gbit, delay_ms} (docs/RELIABILITY.md, multi-host).
    const json& net = h.get_raw("network");
    NetworkLink& link = e.hardware.network;
    if (net.is_string()) {
      static const std::map<std::string, double> presets = {{"loopback", 0}, {"10gbe", 10}, {"25gbe", 25}, {"100gbe", 100},
                                                            {"ib-hdr", 200}};
      const auto it = presets.find(net.get<std::string>());
      if (it == presets.end()) h.fail("network", "one of loopback, 10gbe, 25gbe, 100gbe, ib-hdr, or {rate_gbit, delay_ms}");
      link.name = it->first;
      link.rate_gbit = it->second;
    } else if (net.is_object()) {
      StrictObject n(net, h.file(), "hardware.network");
      link.name = "custom";
      link.rate_gbit = n.get_number("rate_gbit", 0.0, 10000.0, 0.0);
      link.delay_ms = n.get_number("delay_ms", 0.0, 10000.0, 0.0);
      n.finish();
    } else if (!net.is_null()) {
      h.fail("network", "a preset name or an object {rate_gbit, delay_ms}");
    }
    h.finish();
  } else {
    top.get_raw("hardware");
  }

  if (top.has("output")) {
    StrictObject o = top.get_object("output");
    e.output_dir = o.get_string("dir", "results");
    if (e.output_dir.empty()) o.fail("dir", "must not be empty");
    if (o.has("logits")) {
      e.logits.spec = o.get_raw("logits");
      StrictObject l = o.get_object("logits");
      const json& r = l.get_raw("requests");
      const int64_t n = e.workload.requests;
      std::set<uint64_t> ids;
      if (r.is_null()) {  // default: every request
        for (int64_t i = 0; i < n; ++i) ids.insert(uint64_t(i));
      } else if (r.is_array()) {
        if (r.empty()) l.fail("requests", "the list is empty");
        for (const json& x : r) {
          if (!x.is_number_integer()) l.fail("requests", x.dump() + " is not a request id (an integer)");
          const int64_t id = x.get<int64_t>();
          if (id < 0 || id >= n)
            l.fail("requests", "request " + std::to_string(id) + " is not in the workload (ids 0.." + std::to_string(n - 1) + ")");
          if (!ids.insert(uint64_t(id)).second) l.fail("requests", "request " + std::to_string(id) + " is listed twice");
        }
      } else {
        const int64_t count = l.get_int("requests", 1, 1 << 20);
        if (count > n)
          l.fail("requests", "the first " + std::to_string(count) + " requests, but the workload has " + std::to_string(n) +
                                 " (ids 0.." + std::to_string(n - 1) + ")");
        for (int64_t i = 0; i < count; ++i) ids.insert(uint64_t(i));
      }
      e.logits.write = true;
      e.logits.requests.assign(ids.begin(), ids.end());
      e.logits.top_k = l.get_int("top_k", 0, e.model.vocab_size, 0);
      const bool full_n = l.has("full") && l.get_raw("full").is_number_integer();  // an int N: the first N recorded
      e.logits.full_requests = full_n ? l.get_int("full", 0, int64_t(e.logits.requests.size())) : -1;
      e.logits.full = full_n ? e.logits.full_requests > 0 : l.get_bool("full", true);
      l.finish();
    } else {
      o.get_raw("logits");
    }
    o.finish();
  } else {
    top.get_raw("output");
  }
  // A score run records (and scores) every request unless output.logits narrows it.
  if (e.workload.source == "score" && !e.logits.write)
    for (int64_t i = 0; i < e.workload.requests; ++i) e.logits.requests.push_back(uint64_t(i));
  top.finish();
  return e;
}

SloLimits parse_slo_flag(const std::string& spec) {
  SloLimits l;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t c = item.find(':');
    const std::string k = item.substr(0, c);
    std::optional<double>* slot = k == "ttft" ? &l.ttft_ms : k == "tpot" ? &l.tpot_ms : k == "e2e" ? &l.e2e_ms : nullptr;
    if (c == std::string::npos || !slot)
      throw ConfigError("--slo " + spec + ": expected ttft:MS, tpot:MS and / or e2e:MS separated by commas, got '" + item + "'");
    char* end = nullptr;
    const double v = std::strtod(item.c_str() + c + 1, &end);
    if (end == item.c_str() + c + 1 || *end != '\0' || !(v > 0))
      throw ConfigError("--slo " + spec + ": '" + item.substr(c + 1) + "' is not a positive number of ms");
    *slot = v;
  }
  return l;
}

ExperimentConfig load_experiment(const std::string& path, const std::vector<std::string>& overrides) {
  json j = read_json_file(path);
  for (const std::string& o : overrides) apply_override(j, o);
  try {
    ExperimentConfig e = parse_experiment(j, path);
    e.overrides = overrides;
    return e;
  } catch (const ConfigError& err) {
    // An error at a key an override set (or inside it) names the override: the file does not hold that value.
    const std::string msg = err.what(), head = path + ": ";
    if (msg.rfind(head, 0) == 0) {
      const std::string rest = msg.substr(head.size());
      for (auto it = overrides.rbegin(); it != overrides.rend(); ++it) {
        const std::string key = it->substr(0, it->find('='));
        if (!key.empty() && rest.rfind(key, 0) == 0 && (rest.size() == key.size() || rest[key.size()] == '.' || rest[key.size()] == ':'))
          throw ConfigError(msg + " (from --set " + *it + ")");
      }
    }
    throw;
  }
}

namespace {
// hardware.network as a config writes it: the preset's name, or the custom rate and delay.
json network_json(const NetworkLink& n) {
  if (n.name.empty() || n.name == "loopback") return "loopback";
  if (n.name != "custom") return n.name;
  return {{"rate_gbit", n.rate_gbit}, {"delay_ms", n.delay_ms}};
}
}  // namespace

json ExperimentConfig::resolved() const {
  const auto len = [](const LengthDist& d) -> json {
    if (d.fixed()) return d.min;
    return json{{"dist", "uniform"}, {"min", d.min}, {"max", d.max}};
  };
  json w = weights.dir.empty() ? json{{"seed", weights.seed}, {"dtype", dtype_name(weights.dtype)}}
                               : json{{"dir", weights.dir}};
  json out = {{"dir", output_dir}};
  if (logits.write) {
    json r = logits.spec.is_object() && logits.spec.contains("requests") && !logits.spec["requests"].is_null()
                 ? logits.spec["requests"]
                 : json(workload.requests);  // the default: all of them
    out["logits"] = {{"requests", r}, {"top_k", logits.top_k},
                     {"full", logits.full_requests >= 0 ? json(logits.full_requests) : json(logits.full)}};
  }
  return {
      {"name", name},
      {"description", description},
      {"model", {{"config", model_config_path}, {"layers", model.num_layers}, {"weights", w}}},
      {"workload",
       {{"requests", workload.requests},
        {"prompt_len", len(workload.prompt_len)},
        {"gen_len", len(workload.gen_len)},
        {"seed", workload.seed},
        {"arrival", workload.arrival},
        {"rate", workload.rate},
        {"trace", workload.trace_file},
        {"prompts", workload.prompts_file},
        {"score", workload.score_file},
        {"stop_at_eos", workload.stop_at_eos},
        {"slo", workload.slo.any() ? json{{"ttft_ms", workload.slo.ttft_ms ? json(*workload.slo.ttft_ms) : json(nullptr)},
                                           {"tpot_ms", workload.slo.tpot_ms ? json(*workload.slo.tpot_ms) : json(nullptr)},
                                           {"e2e_ms", workload.slo.e2e_ms ? json(*workload.slo.e2e_ms) : json(nullptr)}}
                                     : json(nullptr)}}},
      {"sampling",
       {{"temperature", sampling.temperature}, {"top_k", sampling.top_k}, {"top_p", sampling.top_p}, {"seed", sampling.seed}}},
      {"schedule",
       {{"mode", to_string(schedule.mode)}, {"batch", schedule.batch}, {"seq", schedule.seq},
        {"interval", schedule.interval}, {"micro_batch", schedule.micro_batch}, {"w_lim", schedule.w_lim},
        {"max_running", schedule.max_running}, {"min_gap", schedule.min_gap},
        {"kv_capacity_tokens", schedule.kv_capacity_tokens}}},
      {"engine", engine_spec_to_json(engine)},
      {"hardware",
       {{"gpu", {{"memory_gb", hardware.gpu_memory_gb}, {"sm_count", hardware.gpu_sm_count},
                 {"gemm_table", hardware.gpu_gemm_table}}},
        {"rworkers", {{"count", hardware.rworkers}, {"threads", hardware.rworker_threads}}},
        {"network", network_json(hardware.network)}}},
      {"output", out},
  };
}

std::vector<Request> make_requests(const WorkloadConfig& w, const ModelConfig& m, const SamplingParams& run_sampling) {
  const int64_t lo_tok = std::max<int64_t>({m.bos_token_id, m.eos_token_id, 2}) + 1;
  const int64_t span = std::max<int64_t>(1, m.vocab_size - lo_tok);
  const bool from_file = w.source != "random";
  std::vector<Request> out;
  for (int64_t i = 0; i < w.requests; ++i) {
    // Every draw is a hash of (seed, request, purpose, index): independent of the request count.
    const uint64_t rs = splitmix64(splitmix64(w.seed) ^ uint64_t(i));
    const auto draw = [&](uint64_t purpose, uint64_t idx) { return splitmix64(rs ^ splitmix64(purpose * 0x100000000ull + idx)); };
    const auto length = [&](const LengthDist& d, uint64_t purpose) {
      return d.min + int64_t(draw(purpose, 0) % uint64_t(d.max - d.min + 1));
    };
    Request r;
    r.id = uint64_t(i);
    r.stop_at_eos = w.stop_at_eos;
    if (from_file) {
      const FileRequest& f = w.file_requests.at(size_t(i));
      r.max_new_tokens = f.gen_len;
      r.prompt = f.prompt;
      r.forced = f.forced;
      if (!f.forced.empty()) r.stop_at_eos = false;
      if (f.has_sampling()) {
        SamplingParams sp = run_sampling;
        if (f.temperature) sp.temperature = *f.temperature;
        if (f.top_k) sp.top_k = *f.top_k;
        if (f.top_p) sp.top_p = *f.top_p;
        if (f.seed) sp.seed = *f.seed;
        r.sampling = sp;
      }
    } else {
      r.max_new_tokens = length(w.gen_len, 2);
    }
    if (r.prompt.empty()) {  // seeded tokens (a trace line with prompt_len, or a random workload)
      const int64_t plen = from_file ? w.file_requests[size_t(i)].prompt_len : length(w.prompt_len, 1);
      for (int64_t t = 0; t < plen; ++t) r.prompt.push_back(int32_t(lo_tok + int64_t(draw(3, uint64_t(t)) % uint64_t(span))));
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<double> arrival_times(const WorkloadConfig& w) {
  if (w.arrival == "poisson") return poisson_arrivals(w.requests, w.rate, w.seed);
  if (w.arrival == "trace") {
    std::vector<double> t;
    for (const auto& r : w.file_requests) t.push_back(r.arrival_s);
    return t;
  }
  return std::vector<double>(size_t(w.requests), 0.0);
}

std::unique_ptr<TensorSource> open_weights(const ExperimentConfig& e) {
  // model.safetensors or a sharded checkpoint (index + shards): checked at parse time, and by load_model_weights.
  if (!e.weights.dir.empty()) return open_safetensors_source(e.weights.dir);
  return make_random_source(e.weights.seed, e.weights.dtype);
}

}  // namespace fd
