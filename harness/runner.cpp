// The run loop: requests, engine, admission schedule and recorders set up; the step loop (StepLoop) drives the
// engine and tells the recorders (harness/run_recorders.h) what happened; then the summary.
#include "harness/runner.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <thread>

#include "fastdecode/core/clock.h"
#include "fastdecode/core/stats.h"
#include "harness/engines.h"
#include "harness/provenance.h"
#include "harness/run_recorders.h"
#include "harness/step_stats.h"

namespace fd {

namespace fs = std::filesystem;

json distribution(const std::vector<double>& v) {
  const double mean = v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  return {{"mean", mean},
          {"p1", percentile(v, 1)},
          {"p50", percentile(v, 50)},
          {"p90", percentile(v, 90)},
          {"p99", percentile(v, 99)},
          {"max", v.empty() ? 0.0 : *std::max_element(v.begin(), v.end())},
          {"count", v.size()}};
}

// NPY format v1.0 (numpy.lib.format): magic, version, little-endian u16 header length, a Python dict
// literal padded with spaces and ended by '\n' so the data starts on a 64-byte boundary, then the data.
void write_npy_f32(const std::string& path, const float* data, int64_t rows, int64_t cols) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", " +
                       std::to_string(cols) + "), }";
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) FD_THROW(path << ": cannot open for writing");
  const uint16_t len = uint16_t(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  const unsigned char le[2] = {static_cast<unsigned char>(len & 0xff), static_cast<unsigned char>(len >> 8)};
  f.write(reinterpret_cast<const char*>(le), 2);
  f.write(header.data(), std::streamsize(header.size()));
  f.write(reinterpret_cast<const char*>(data), std::streamsize(sizeof(float) * size_t(rows * cols)));
  if (!f) FD_THROW(path << ": write failed");
}

namespace {

// What a run has done so far, for the summary of a run that fails (run_experiment).
struct RunState {
  bool created_dir = false, loop_started = false;
  json provenance;
  int64_t steps = 0, output_tokens = 0, finished = 0, requests = 0;
};

// The run's requests as the scheduler sees them, each checked before any work.
struct PlannedRequests {
  std::vector<double> arrivals;      // seconds from time 0, per request
  std::vector<SchedRequest> sched;   // what the scheduler is told
  int64_t total_gen = 0, prompt_tokens = 0;
};

PlannedRequests plan_requests(const ExperimentConfig& e, const std::vector<Request>& requests) {
  PlannedRequests p;
  p.arrivals = arrival_times(e.workload);
  for (size_t i = 0; i < requests.size(); ++i) {
    const Request& r = requests[i];
    validate_request(r, e.model);
    p.total_gen += r.max_new_tokens;
    p.prompt_tokens += int64_t(r.prompt.size());
    // The scheduler projects with the trace's max_gen_len when there is one (early finish otherwise).
    const int64_t projected = e.workload.file_requests.empty() ? r.max_new_tokens : e.workload.file_requests[i].max_gen_len;
    p.sched.push_back({r.id, p.arrivals[i], int64_t(r.prompt.size()), projected});
  }
  return p;
}

// The admission schedule decides at which step each request starts (all at the first step unless the config asks
// for SLS / load control), never beyond the R-workers' KV memory: the engine's capacity when the config leaves
// kv_capacity_tokens at 0 (how it was derived goes to `capacity_note`).
SchedulerConfig admission_config(const ExperimentConfig& e, const Engine& engine, const std::vector<SchedRequest>& requests,
                                 std::string& capacity_note) {
  SchedulerConfig sc = e.schedule;
  sc.deferred_starts = true;  // the engine may start an admitted request later (prefill budget, slots)
  if (sc.kv_capacity_tokens == 0 && !requests.empty()) {  // what the engine can hold (0: not bounded)
    int64_t min_prompt = INT64_MAX, max_len = 0;
    for (const auto& r : requests)
      min_prompt = std::min(min_prompt, r.prompt_len), max_len = std::max(max_len, r.prompt_len + r.max_gen_len);
    const EngineCapacity cap = engine.capacity(min_prompt, max_len);
    if (!cap.error.empty()) throw ConfigError(e.file + ": " + cap.error);
    sc.kv_capacity_tokens = cap.kv_tokens;
    capacity_note = cap.note;
  }
  return sc;
}

// What a folder says while its run goes on, and after a kill -9 that lets nothing else be written: status
// "incomplete" with the process that ran it; the run's end writes ok or failed over it.
void write_incomplete_summary(const ExperimentConfig& e, const fs::path& dir, const RunState& st) {
  write_json_file((dir / "summary.json").string(),
                  {{"name", e.name}, {"status", "incomplete"}, {"pid", int64_t(getpid())}, {"config_file", e.file},
                   {"config", e.resolved()}, {"provenance", st.provenance},
                   {"note", "written as the run started: steps.jsonl and requests.jsonl hold what it did; a run that "
                            "ends replaces this with status ok or failed, so incomplete means it is still running (pid) "
                            "or was killed"}});
}

// What the step loop did, for the summary.
struct LoopTotals {
  int64_t t0 = 0, t_end = 0;  // time 0 (the start of the first step) and the end of the last
  int64_t engine_steps = 0, out_tokens = 0;
};

// The pipeline: the scheduler admits, the engine steps, and the recorders are told what came of it.
class StepLoop {
 public:
  StepLoop(Engine& engine, Scheduler& sched, const std::vector<Request>& requests, StepRecorder& steps,
           RequestRecorder& reqs, LogitsRecorder& logits, RunState& st)
      : engine_(engine), sched_(sched), steps_(steps), reqs_(reqs), logits_(logits), st_(st) {
    for (const auto& r : requests) by_id_[r.id] = &r;
  }

  // Until the scheduler is done; progress on stderr when `show_progress`.
  LoopTotals run(bool show_progress, int64_t total_gen) {
    LoopTotals n;
    // Time 0 is the start of the first step; request i arrives at arrivals[i] seconds.
    n.t0 = t0_ = now_ns();
    steps_.start(t0_);
    Progress progress(show_progress, total_gen);
    for (int64_t step = 0; !sched_.done(); ++step) {
      wait_for_arrival();
      StepEvent ev;
      ev.step = n.engine_steps, ev.sched_step = step, ev.start_ns = now_ns();
      ev.admitted = admit(step, ev.start_ns);
      if (engine_.done()) continue;  // nothing admitted and nothing running (waiting for a slot or an arrival)
      const StepResult r = engine_.step();
      ev.end_ns = now_ns();
      take_tokens(r, ev);
      ev.queued = sched_.queued();
      n.out_tokens += int64_t(r.tokens.size());
      steps_.record(r, ev);
      st_.steps = ++n.engine_steps;
      st_.output_tokens += int64_t(r.tokens.size());
      progress.update(n.engine_steps, n.out_tokens, int64_t(r.tokens.size()) - ev.finished);
    }
    n.t_end = now_ns();
    progress.update(n.engine_steps, n.out_tokens, 0, true);
    progress.done();
    return n;
  }

 private:
  // Nothing running and nothing arrived yet: wait (wall clock) for the next arrival.
  void wait_for_arrival() const {
    if (sched_.running() != 0 || sched_.arrived(double(now_ns() - t0_) / 1e9) != 0) return;
    if (auto next = sched_.next_arrival_s()) {
      const double wait_s = *next - double(now_ns() - t0_) / 1e9;
      if (wait_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait_s));
    }
  }

  // The requests the scheduler admits at this step go to the engine; returns how many.
  size_t admit(int64_t step, int64_t s0) {
    std::vector<Request> start;
    for (uint64_t id : sched_.admit(step, double(s0 - t0_) / 1e9)) {
      start.push_back(*by_id_.at(id));
      reqs_.on_admit(id, s0 - t0_);
    }
    if (!start.empty()) engine_.add(start);
    return start.size();
  }

  // The step's tokens: to the scheduler (advanced, started, finished) and to the request and logits recorders.
  void take_tokens(const StepResult& r, StepEvent& ev) {
    std::vector<uint64_t> advanced;
    for (const auto& t : r.tokens) advanced.push_back(t.request_id);
    sched_.on_step_done(advanced);  // before on_started: a sequence's first token starts its life this step
    for (const auto& t : r.tokens) {
      if (reqs_.on_token(t.request_id, t.token, ev.end_ns - t0_)) {
        sched_.on_started(t.request_id, ev.sched_step);
        ++ev.started;
      }
      logits_.on_token(t, engine_);
      if (t.finished) {
        ++ev.finished;
        ++st_.finished;
        sched_.on_finished(t.request_id, ev.sched_step);
        reqs_.on_finished(t.request_id);
      }
    }
  }

  Engine& engine_;
  Scheduler& sched_;
  StepRecorder& steps_;
  RequestRecorder& reqs_;
  LogitsRecorder& logits_;
  RunState& st_;
  std::map<uint64_t, const Request*> by_id_;
  int64_t t0_ = 0;
};

// summary.json's "results": the run's totals and rates, then what the step and request recorders measured; at
// reduced depth, the full-depth equivalents of the rates (extrapolated, labelled so).
json run_results(const ExperimentConfig& e, size_t num_requests, const PlannedRequests& plan, const LoopTotals& n,
                 double load_s, const StepRecorder& steps, const RequestRecorder& reqs) {
  const double dur_s = double(n.t_end - n.t0) / 1e9;
  json results = {{"num_requests", num_requests},
                  {"prompt_tokens", plan.prompt_tokens},
                  {"output_tokens", n.out_tokens},
                  {"steps", n.engine_steps},
                  {"duration_s", dur_s},
                  {"weights_load_s", load_s},
                  {"output_throughput", double(n.out_tokens) / dur_s},
                  {"total_token_throughput", double(n.out_tokens + plan.prompt_tokens) / dur_s},
                  {"request_throughput", double(num_requests) / dur_s}};
  steps.add_results(results);
  reqs.add_results(results, e.workload.slo, dur_s);
  if (e.model.num_layers < e.model.full_num_layers)
    results["full_depth_equivalent"] = full_depth_equivalent(e.model.num_layers, e.model.full_num_layers, results);
  return results;
}

// summary.json of a run that ends: the engine, the config, the model, the results, the notes (capacity, engine).
json run_summary(const ExperimentConfig& e, const Engine& engine, const json& engine_info, const TensorSource& weights,
                 const json& provenance, json results, int64_t kv_capacity_tokens, const std::string& capacity_note,
                 const json& score) {
  const json model = {{"name", e.model.name}, {"arch", arch_name(e.model.arch)}, {"layers", e.model.num_layers},
                      {"full_layers", e.model.full_num_layers}, {"params", e.model.num_params()},
                      {"weights", weights.describe()}};
  json notes = json::array();
  if (!capacity_note.empty()) notes.push_back(capacity_note);
  results["kv_capacity_tokens"] = kv_capacity_tokens;
  for (const std::string& n : engine.notes()) notes.push_back(n);
  json summary = {{"name", e.name},   {"status", "ok"}, {"engine", engine.name()}, {"engine_info", engine_info},
                  {"config_file", e.file}, {"config", e.resolved()}, {"provenance", provenance}, {"model", model},
                  {"results", std::move(results)}, {"notes", notes}};
  summary["overrides"] = e.overrides;
  if (!score.is_null()) summary["score"] = score;
  return summary;
}

// The engine prepares what its first steps would set up on first use (CUDA graphs of each decode size) for as many
// sequences as can run at once: the requests, or schedule.max_running when it caps them. What it did and its time.
json warm_up(Engine& engine, const SchedulerConfig& sc, int64_t requests) {
  const int64_t t0 = now_ns();
  json w = engine.warm_up(sc.max_running > 0 ? std::min(sc.max_running, requests) : requests);
  if (!w.empty()) w["s"] = double(now_ns() - t0) / 1e9;
  return w;
}

// One run, from its config to its folder: requests, engine, scheduler and recorders, the step loop, the summary.
json run_body(const ExperimentConfig& e, const RunOptions& opt, RunState& st) {
  const fs::path dir = opt.out_dir;
  fs::create_directories(dir);
  st.provenance = collect_provenance(opt.command_line);
  std::vector<Request> requests = make_requests(e.workload, e.model, e.sampling);
  LogitsRecorder logits(e, requests, dir);  // marks the requests that record logits
  const PlannedRequests plan = plan_requests(e, requests);

  auto weights = open_weights(e);
  const int64_t load0 = now_ns();
  // The hardware balance goes to the engine as it is: each engine applies what concerns it (GPU memory
  // and SMs for its GPU work, R-worker count and cores for spawned R-workers).
  std::unique_ptr<Engine> engine = make_engine(e.engine, {e.model, *weights, e.sampling, e.hardware});
  const double load_s = double(now_ns() - load0) / 1e9;
  json engine_info = engine->info();
  std::string capacity_note;
  const SchedulerConfig sc = admission_config(e, *engine, plan.sched, capacity_note);
  if (json w = warm_up(*engine, sc, int64_t(requests.size())); !w.empty()) engine_info["warm_up"] = std::move(w);
  Scheduler sched(sc);
  for (const auto& r : plan.sched) sched.submit(r);

  // summary.json says "incomplete" before steps.jsonl exists, so a folder with steps.jsonl always has a summary
  // (a kill -9 between the two would leave none). steps.jsonl and requests.jsonl grow as the run goes, so a run
  // that fails or is killed keeps what it did.
  st.loop_started = true;
  st.requests = int64_t(requests.size());
  write_incomplete_summary(e, dir, st);
  StepRecorder steps(dir);
  RequestRecorder reqs(dir, requests, plan.arrivals);

  const LoopTotals n = StepLoop(*engine, sched, requests, steps, reqs, logits, st).run(opt.progress, plan.total_gen);
  engine->shutdown();
  steps.close();
  reqs.finish();
  const json score = logits.finish(reqs);  // logits.jsonl, score.jsonl

  json results = run_results(e, requests.size(), plan, n, load_s, steps, reqs);
  const json summary = run_summary(e, *engine, engine_info, *weights, st.provenance, std::move(results),
                                   sc.kv_capacity_tokens, capacity_note, score);
  write_json_file((dir / "trace.json").string(), steps.trace().finish(st.provenance, "fd-bench " + e.name), -1);
  write_json_file((dir / "summary.json").string(), summary);
  return summary;
}

}  // namespace

// A run that fails before its first step leaves no folder it made (the error is in the config, the weights,
// the binaries or the endpoints: exit 2 or 1 with nothing to read); one that fails later keeps steps.jsonl and
// requests.jsonl as they were written and gets a summary.json with "status": "failed", the error and what
// finished. The error is then thrown on.
json run_experiment(const ExperimentConfig& e, const RunOptions& opt) {
  const fs::path dir = opt.out_dir;
  if (fs::exists(dir / "summary.json")) {  // a failed or killed run's folder may be run again (sweeps redo it)
    bool failed = false;
    try {
      const std::string status = read_json_file((dir / "summary.json").string()).value("status", "");
      failed = status == "failed" || status == "incomplete";
    } catch (const Error&) {
    }
    if (!failed) throw ConfigError(opt.out_dir + ": already holds a finished run (summary.json); choose another --out");
    fs::remove(dir / "summary.json");
  }
  RunState st;
  st.created_dir = !fs::exists(dir);
  try {
    return run_body(e, opt, st);
  } catch (const std::exception& ex) {
    std::error_code ec;
    if (!st.loop_started) {
      if (st.created_dir) fs::remove_all(dir, ec);
    } else {
      const json summary = {{"name", e.name},
                            {"status", "failed"},
                            {"error", ex.what()},
                            {"config_file", e.file},
                            {"config", e.resolved()},
                            {"provenance", st.provenance},
                            {"results", {{"num_requests", st.requests},
                                         {"finished_requests", st.finished},
                                         {"steps", st.steps},
                                         {"output_tokens", st.output_tokens}}}};
      try {
        write_json_file((dir / "summary.json").string(), summary);
      } catch (...) {  // the run's own error is the one to report
      }
    }
    throw;
  }
}

}  // namespace fd
