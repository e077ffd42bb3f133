#include "harness/experiment.h"

#include <filesystem>

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
    if (!e.weights.dir.empty() && !fs::exists(fs::path(e.weights.dir) / "model.safetensors"))
      m.fail("weights.dir", "no model.safetensors in " + e.weights.dir);
    m.finish();
  }

  // workload
  {
    StrictObject w = top.get_object("workload");
    e.workload.arrival = w.get_enum("arrival", {"offline", "poisson", "trace"}, std::string("offline"));
    if (e.workload.arrival == "trace") {
      // Requests, arrival times and lengths all come from the trace (fastdecode/sched/schedule.h format).
      for (const char* k : {"requests", "prompt_len", "gen_len", "rate"})
        if (w.has(k)) w.fail(k, "not allowed with \"arrival\": \"trace\" (the trace gives it)");
      e.workload.trace_file = resolve(path, w.get_string("trace"));
      e.workload.trace = load_trace_jsonl(e.workload.trace_file);
      if (e.workload.trace.empty()) w.fail("trace", e.workload.trace_file + " holds no request");
      e.workload.requests = int64_t(e.workload.trace.size());
      e.workload.prompt_len = {INT64_MAX, 0};
      e.workload.gen_len = {INT64_MAX, 0};
      for (const auto& t : e.workload.trace) {
        if (t.prompt_len < 1) w.fail("trace", e.workload.trace_file + ": every prompt needs >= 1 token");
        e.workload.prompt_len = {std::min(e.workload.prompt_len.min, t.prompt_len), std::max(e.workload.prompt_len.max, t.prompt_len)};
        e.workload.gen_len = {std::min(e.workload.gen_len.min, t.gen_len), std::max(e.workload.gen_len.max, t.max_gen_len)};
      }
    } else {
      e.workload.requests = w.get_int("requests", 1, 1 << 20);
      e.workload.prompt_len = parse_length(w, "prompt_len", 1, e.model.max_position_embeddings);
      e.workload.gen_len = parse_length(w, "gen_len", 1, e.model.max_position_embeddings);
      if (w.has("trace")) w.fail("trace", "only with \"arrival\": \"trace\"");
    }
    e.workload.seed = uint64_t(w.get_int("seed", 0, int64_t(1) << 53, 0));
    if (e.workload.arrival == "poisson") e.workload.rate = w.get_number("rate", 1e-6, 1e9);
    else if (w.has("rate")) w.fail("rate", "only with \"arrival\": \"poisson\"");
    e.workload.stop_at_eos = w.get_bool("stop_at_eos", false);
    w.finish();
    const int64_t need = e.workload.prompt_len.max + e.workload.gen_len.max - 1;
    if (need > e.model.max_position_embeddings)
      w.fail("gen_len", "prompt_len + gen_len - 1 = " + std::to_string(need) + " exceeds the model's " +
                            std::to_string(e.model.max_position_embeddings) + " positions");
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

  // schedule: SLS admission (docs/SCHEDULING.md). Default all-at-once with every request in one batch.
  e.schedule.mode = AdmitMode::AllAtOnce;
  e.schedule.batch = e.workload.requests;
  e.schedule.seq = e.workload.gen_len.max;
  if (top.has("schedule")) {
    StrictObject sc = top.get_object("schedule");
    e.schedule.mode = parse_admit_mode(sc.get_enum("mode", {"all-at-once", "fixed-interval", "load-control"}));
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

  if (top.has("hardware")) {
    StrictObject h = top.get_object("hardware");
    if (h.has("gpu")) {
      StrictObject g = h.get_object("gpu");
      e.hardware.gpu_memory_gb = g.get_number("memory_gb", 0.001, 1e6, 0.0);
      e.hardware.gpu_sm_count = g.get_int("sm_count", 1, 1 << 16, 0);
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
    h.finish();
  } else {
    top.get_raw("hardware");
  }

  if (top.has("output")) {
    StrictObject o = top.get_object("output");
    e.output_dir = o.get_string("dir", "results");
    if (e.output_dir.empty()) o.fail("dir", "must not be empty");
    o.finish();
  } else {
    top.get_raw("output");
  }
  top.finish();
  return e;
}

ExperimentConfig load_experiment(const std::string& path) { return parse_experiment(read_json_file(path), path); }

json ExperimentConfig::resolved() const {
  const auto len = [](const LengthDist& d) -> json {
    if (d.fixed()) return d.min;
    return json{{"dist", "uniform"}, {"min", d.min}, {"max", d.max}};
  };
  json w = weights.dir.empty() ? json{{"seed", weights.seed}, {"dtype", dtype_name(weights.dtype)}}
                               : json{{"dir", weights.dir}};
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
        {"stop_at_eos", workload.stop_at_eos}}},
      {"sampling",
       {{"temperature", sampling.temperature}, {"top_k", sampling.top_k}, {"top_p", sampling.top_p}, {"seed", sampling.seed}}},
      {"schedule",
       {{"mode", to_string(schedule.mode)}, {"batch", schedule.batch}, {"seq", schedule.seq},
        {"interval", schedule.interval}, {"micro_batch", schedule.micro_batch}, {"w_lim", schedule.w_lim},
        {"max_running", schedule.max_running}, {"min_gap", schedule.min_gap},
        {"kv_capacity_tokens", schedule.kv_capacity_tokens}}},
      {"engine", engine_spec_to_json(engine)},
      {"hardware",
       {{"gpu", {{"memory_gb", hardware.gpu_memory_gb}, {"sm_count", hardware.gpu_sm_count}}},
        {"rworkers", {{"count", hardware.rworkers}, {"threads", hardware.rworker_threads}}}}},
      {"output", {{"dir", output_dir}}},
  };
}

std::vector<Request> make_requests(const WorkloadConfig& w, const ModelConfig& m) {
  const int64_t lo_tok = std::max<int64_t>({m.bos_token_id, m.eos_token_id, 2}) + 1;
  const int64_t span = std::max<int64_t>(1, m.vocab_size - lo_tok);
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
    const bool traced = !w.trace.empty();
    const int64_t plen = traced ? w.trace[size_t(i)].prompt_len : length(w.prompt_len, 1);
    r.max_new_tokens = traced ? w.trace[size_t(i)].gen_len : length(w.gen_len, 2);
    r.stop_at_eos = w.stop_at_eos;
    for (int64_t t = 0; t < plen; ++t) r.prompt.push_back(int32_t(lo_tok + int64_t(draw(3, uint64_t(t)) % uint64_t(span))));
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<double> arrival_times(const WorkloadConfig& w) {
  if (w.arrival == "poisson") return poisson_arrivals(w.requests, w.rate, w.seed);
  if (w.arrival == "trace") {
    std::vector<double> t;
    for (const auto& r : w.trace) t.push_back(r.arrival_s);
    return t;
  }
  return std::vector<double>(size_t(w.requests), 0.0);
}

std::unique_ptr<TensorSource> open_weights(const ExperimentConfig& e) {
  if (!e.weights.dir.empty()) return open_safetensors_source((fs::path(e.weights.dir) / "model.safetensors").string());
  return make_random_source(e.weights.seed, e.weights.dtype);
}

}  // namespace fd
