#include "harness/runner.h"

#include "fastdecode/core/stats.h"

#include "harness/engines.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <numeric>
#include <thread>

#include "fastdecode/core/clock.h"
#include "harness/provenance.h"
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

namespace {

// Chrome Trace Event format (opens in Perfetto / chrome://tracing): complete events ("ph": "X") with
// microsecond timestamps from the run's start; one thread id per track.
class TraceWriter {
 public:
  explicit TraceWriter(int64_t t0_ns) : t0_(t0_ns) {}
  void event(const std::string& track, const std::string& name, int64_t start_ns, int64_t dur_ns, json args = {}) {
    json e = {{"name", name}, {"ph", "X"}, {"pid", 1}, {"tid", tid(track)},
              {"ts", double(start_ns - t0_) / 1e3}, {"dur", double(dur_ns) / 1e3}};
    if (!args.is_null()) e["args"] = std::move(args);
    events_.push_back(std::move(e));
  }
  json finish(const json& provenance, const std::string& process) const {
    json all = json::array();
    all.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 1}, {"args", {{"name", process}}}});
    for (const auto& [track, id] : tids_)
      all.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", id}, {"args", {{"name", track}}}});
    for (const auto& e : events_) all.push_back(e);
    return {{"traceEvents", all}, {"displayTimeUnit", "ms"}, {"otherData", provenance}};
  }

 private:
  int tid(const std::string& track) {
    auto it = tids_.find(track);
    if (it != tids_.end()) return it->second;
    const int id = int(tids_.size()) + 1;
    tids_[track] = id;
    return id;
  }
  int64_t t0_;
  std::map<std::string, int> tids_;
  json events_ = json::array();
};

// Progress: steps, tokens/s, ETA. On a terminal one line, redrawn at most ~10 times a second; otherwise (a log file, a
// pipe) a line every FD_PROGRESS_INTERVAL_S seconds (default 10; 0: every step), so a run logged to a file shows it.
class Progress {
 public:
  Progress(bool enabled, int64_t total_tokens) : on_(enabled), tty_(isatty(fileno(stderr))), total_(total_tokens), t0_(now_ns()) {
    if (!tty_) {
      const char* e = std::getenv("FD_PROGRESS_INTERVAL_S");
      char* end = nullptr;
      const double v = e ? std::strtod(e, &end) : 10.0;
      interval_ns_ = int64_t(1e9 * (e && end != e && *end == '\0' && v >= 0 ? v : 10.0));
      last_ = t0_;  // the first line after one interval: a short run prints none
    }
  }
  void update(int64_t step, int64_t tokens, int64_t running, bool force = false) {
    if (!on_) return;
    const int64_t t = now_ns();
    if (!force && t - last_ < interval_ns_) return;
    if (!tty_ && force) return;  // the closing redraw: the summary follows
    last_ = t;
    const double s = double(t - t0_) / 1e9, rate = s > 0 ? double(tokens) / s : 0.0;
    const double eta = rate > 0 ? double(total_ - tokens) / rate : 0.0;
    std::fprintf(stderr, "%s  step %6lld | running %5lld | tokens %8lld / %lld | %9.1f tok/s | ETA %6.1f s  %s", tty_ ? "\r" : "",
                 (long long)step, (long long)running, (long long)tokens, (long long)total_, rate, eta, tty_ ? "" : "\n");
    std::fflush(stderr);
  }
  void done() {
    if (on_ && tty_) std::fprintf(stderr, "\n");
  }

 private:
  bool on_, tty_;
  int64_t total_, t0_, last_ = 0, interval_ns_ = 100'000'000;
};

struct RequestTrack {
  int64_t prompt_len = 0;
  int64_t arrival_ns = 0, admit_ns = 0;  // from the run's start
  std::vector<int32_t> tokens;
  std::vector<int64_t> token_ns;  // time each token was produced (end of its step), from run start
};

// One line of requests.jsonl (vLLM's metric names): TTFT from arrival to the first token; e2e = arrival to
// the last token; queueing = arrival to the step that admitted it.
json request_record(uint64_t id, const RequestTrack& rt, const std::vector<int32_t>& prompt) {
  const double arrive = double(rt.arrival_ns) / 1e6;
  const double first = double(rt.token_ns.front()) / 1e6 - arrive, last = double(rt.token_ns.back()) / 1e6 - arrive;
  return {{"id", id}, {"prompt_len", rt.prompt_len}, {"output_len", rt.tokens.size()}, {"arrival_ms", arrive},
          {"queue_ms", std::max(0.0, double(rt.admit_ns) / 1e6 - arrive)}, {"ttft_ms", first}, {"e2e_ms", last},
          {"prompt", prompt}, {"tokens", rt.tokens}};
}

// What a run has done so far, for the summary of a run that fails (run_experiment).
struct RunState {
  bool created_dir = false, loop_started = false;
  json provenance;
  int64_t steps = 0, output_tokens = 0, finished = 0, requests = 0;
};

// What the runner keeps of one request that records its logits (output.logits / workload.score).
struct LogitsTrack {
  std::vector<int32_t> forced;                               // score runs: the continuation
  std::vector<std::vector<std::pair<int32_t, double>>> top;  // per position: top-K [token, logprob]
  std::vector<float> rows;                                   // full: [positions, vocab], freed once written
  int64_t positions = 0;
  double nll_sum = 0;                                        // score: -sum log p(forced[i])
};

// logsumexp of one logits row, in double: log_softmax(row)[i] = row[i] - log_sum_exp(row).
double log_sum_exp(const std::vector<float>& row) {
  double m = -INFINITY;
  for (float x : row) m = std::max(m, double(x));
  double s = 0;
  for (float x : row) s += std::exp(double(x) - m);
  return m + std::log(s);
}

}  // namespace

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

json run_body(const ExperimentConfig& e, const RunOptions& opt, RunState& st) {
  const fs::path dir = opt.out_dir;
  fs::create_directories(dir);
  const json prov = collect_provenance(opt.command_line);
  st.provenance = prov;

  std::vector<Request> requests = make_requests(e.workload, e.model, e.sampling);
  // Logits recording (output.logits, workload.score): the runner asks the engine for the rows of these
  // requests only, and reduces each row as it comes (score, top-K; the full rows only when written).
  std::map<uint64_t, LogitsTrack> logit_track;
  for (uint64_t id : e.logits.requests) {
    FD_CHECK(id < requests.size(), "output.logits names request " << id);
    requests[size_t(id)].record_logits = true;
    logit_track[id].forced = requests[size_t(id)].forced;
  }
  const bool write_logits = e.logits.write, write_npy = e.logits.write && e.logits.full;
  std::set<uint64_t> npy_ids;  // the recorded requests whose full rows are written (output.logits.full: all or the first N)
  for (const auto& [id, L] : logit_track)
    if (write_npy && (e.logits.full_requests < 0 || int64_t(npy_ids.size()) < e.logits.full_requests)) npy_ids.insert(id);
  if (write_npy) fs::create_directories(dir / "logits");
  const std::vector<double> arrivals = arrival_times(e.workload);
  int64_t total_gen = 0, prompt_tokens = 0;
  std::map<uint64_t, RequestTrack> track;
  // Every request is checked before any work.
  std::vector<SchedRequest> sched_requests;
  for (size_t i = 0; i < requests.size(); ++i) {
    const Request& r = requests[i];
    validate_request(r, e.model);
    total_gen += r.max_new_tokens;
    prompt_tokens += int64_t(r.prompt.size());
    track[r.id].prompt_len = int64_t(r.prompt.size());
    track[r.id].arrival_ns = int64_t(arrivals[i] * 1e9);
    // The scheduler projects with the trace's max_gen_len when there is one (early finish otherwise).
    const int64_t projected = e.workload.file_requests.empty() ? r.max_new_tokens : e.workload.file_requests[i].max_gen_len;
    sched_requests.push_back({r.id, arrivals[i], int64_t(r.prompt.size()), projected});
  }
  std::map<uint64_t, const Request*> by_id;
  for (const auto& r : requests) by_id[r.id] = &r;

  auto weights = open_weights(e);
  const int64_t load0 = now_ns();
  // The hardware balance goes to the engine as it is: each engine applies what concerns it (GPU memory
  // and SMs for its GPU work, R-worker count and cores for spawned R-workers).
  std::unique_ptr<Engine> engine = make_engine(e.engine, {e.model, *weights, e.sampling, e.hardware});
  const double load_s = double(now_ns() - load0) / 1e9;
  const json engine_info = engine->info();

  // The admission schedule decides at which step each request starts (all at the first step unless
  // the config asks for SLS / load control), never beyond the R-workers' KV memory.
  SchedulerConfig sc = e.schedule;
  sc.deferred_starts = true;  // the engine may start an admitted request later (prefill budget, slots)
  std::string capacity_note;
  if (sc.kv_capacity_tokens == 0 && !sched_requests.empty()) {  // what the engine can hold (0: not bounded)
    int64_t min_prompt = INT64_MAX, max_len = 0;
    for (const auto& r : sched_requests)
      min_prompt = std::min(min_prompt, r.prompt_len), max_len = std::max(max_len, r.prompt_len + r.max_gen_len);
    const EngineCapacity cap = engine->capacity(min_prompt, max_len);
    if (!cap.error.empty()) throw ConfigError(e.file + ": " + cap.error);
    sc.kv_capacity_tokens = cap.kv_tokens;
    capacity_note = cap.note;
  }
  Scheduler sched(sc);
  for (const auto& r : sched_requests) sched.submit(r);

  // Both files grow as the run goes (flushed each step / each finished request), so a run that fails or is
  // killed keeps what it did; requests.jsonl is rewritten in id order at the end.
  std::ofstream steps_out(dir / "steps.jsonl", std::ios::trunc);
  if (!steps_out) FD_THROW((dir / "steps.jsonl").string() << ": cannot open for writing");
  std::ofstream live_requests(dir / "requests.jsonl", std::ios::trunc);
  if (!live_requests) FD_THROW((dir / "requests.jsonl").string() << ": cannot open for writing");
  st.loop_started = true;
  st.requests = int64_t(requests.size());
  // What a folder says while its run goes on, and after a kill -9 that lets nothing else be written: status
  // "incomplete" with the process that ran it; the run's end writes ok or failed over it.
  write_json_file((dir / "summary.json").string(),
                  {{"name", e.name}, {"status", "incomplete"}, {"pid", int64_t(getpid())}, {"config_file", e.file},
                   {"config", e.resolved()}, {"provenance", st.provenance},
                   {"note", "written as the run started: steps.jsonl and requests.jsonl hold what it did; a run that "
                            "ends replaces this with status ok or failed, so incomplete means it is still running (pid) "
                            "or was killed"}});

  // Time 0 is the start of the first step; request i arrives at arrivals[i] seconds.
  const int64_t t0 = now_ns();
  TraceWriter trace(t0);
  Progress progress(opt.progress, total_gen);
  int64_t step = 0, engine_steps = 0, out_tokens = 0;
  std::vector<double> step_ms;
  std::vector<StepStat> step_stats;  // for results.decode_only / steady (harness/step_stats.h)
  std::vector<double> kv_imbalance;  // per step, aligned with step_stats: StepResult::worker_kv_imbalance (0: none)
  std::map<std::string, double> breakdown_total;
  std::map<std::string, int64_t> counts_total, steps_with_counts;  // StepResult::counts: sum, steps where > 0
  while (!sched.done()) {
    // Nothing running and nothing arrived yet: wait (wall clock) for the next arrival.
    if (sched.running() == 0 && sched.arrived(double(now_ns() - t0) / 1e9) == 0) {
      if (auto next = sched.next_arrival_s()) {
        const double wait_s = *next - double(now_ns() - t0) / 1e9;
        if (wait_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait_s));
      }
    }
    const int64_t s0 = now_ns();
    std::vector<Request> start;
    for (uint64_t id : sched.admit(step, double(s0 - t0) / 1e9)) {
      start.push_back(*by_id.at(id));
      track.at(id).admit_ns = s0 - t0;
    }
    if (!start.empty()) engine->add(start);
    if (engine->done()) {  // nothing admitted and nothing running (waiting for a slot or an arrival)
      ++step;
      continue;
    }
    StepResult r = engine->step();
    const int64_t s1 = now_ns();
    int64_t finished = 0, started = 0;  // started: sequences whose first token came this step
    std::vector<uint64_t> advanced;
    for (const auto& t : r.tokens) advanced.push_back(t.request_id);
    sched.on_step_done(advanced);  // before on_started: a sequence's first token starts its life this step
    for (const auto& t : r.tokens) {
      RequestTrack& rt = track.at(t.request_id);
      if (rt.tokens.empty()) {
        sched.on_started(t.request_id, step);
        ++started;
      }
      rt.tokens.push_back(t.token);
      rt.token_ns.push_back(s1 - t0);
      if (auto lt = logit_track.find(t.request_id); lt != logit_track.end()) {
        LogitsTrack& L = lt->second;
        if (int64_t(t.logits.size()) != e.model.vocab_size)
          FD_THROW("engine " << engine->name() << " returned " << t.logits.size() << " logits for request " << t.request_id
                             << " (record_logits asks for " << e.model.vocab_size
                             << " per token): this engine does not record logits");
        const size_t pos = size_t(L.positions++);
        const double lse = log_sum_exp(t.logits);
        if (!L.forced.empty()) {
          FD_CHECK(pos < L.forced.size(), "request " << t.request_id << " generated past its forced continuation");
          L.nll_sum -= double(t.logits[size_t(L.forced[pos])]) - lse;
        }
        if (write_logits && e.logits.top_k > 0) {
          std::vector<int32_t> idx(t.logits.size());
          std::iota(idx.begin(), idx.end(), 0);
          const size_t k = size_t(e.logits.top_k);
          std::partial_sort(idx.begin(), idx.begin() + std::ptrdiff_t(k), idx.end(), [&](int32_t a, int32_t b) {
            return t.logits[size_t(a)] > t.logits[size_t(b)] || (t.logits[size_t(a)] == t.logits[size_t(b)] && a < b);
          });
          auto& row = L.top.emplace_back();
          for (size_t q = 0; q < k; ++q) row.emplace_back(idx[q], double(t.logits[size_t(idx[q])]) - lse);
        }
        const bool npy = npy_ids.count(t.request_id) > 0;
        if (npy) L.rows.insert(L.rows.end(), t.logits.begin(), t.logits.end());
        if (t.finished && npy) {  // written as soon as the request is done: rows do not pile up
          write_npy_f32((dir / "logits" / ("request_" + std::to_string(t.request_id) + ".npy")).string(), L.rows.data(),
                        L.positions, e.model.vocab_size);
          std::vector<float>().swap(L.rows);
        }
      }
      if (t.finished) {
        ++finished;
        ++st.finished;
        sched.on_finished(t.request_id, step);
        live_requests << request_record(t.request_id, rt, by_id.at(t.request_id)->prompt).dump() << "\n";
        live_requests.flush();
      }
    }
    out_tokens += int64_t(r.tokens.size());
    const double ms = double(s1 - s0) / 1e6;
    for (const auto& [k, v] : r.breakdown_ms) breakdown_total[k] += v;
    for (const auto& [k, v] : r.counts) counts_total[k] += v, steps_with_counts[k] += v > 0;
    step_ms.push_back(ms);
    step_stats.push_back({engine_steps, ms, r.prefill_tokens, r.decode_tokens, int64_t(r.tokens.size()),
                          int64_t(r.tokens.size()), r.total_context, started, finished});
    json phases = json::object();
    for (const auto& sp : r.spans) {
      trace.event(sp.track, sp.name, sp.start_ns, sp.dur_ns);
      phases[sp.name] = phases.value(sp.name, 0.0) + double(sp.dur_ns) / 1e6;
    }
    // "step" counts engine steps (one line each); "sched_step" is the scheduler's step index, which
    // also advances over idle steps (nothing running, waiting for a slot or an arrival).
    json rec = {{"step", engine_steps},
                {"sched_step", step},
                {"start_ms", double(s0 - t0) / 1e6},
                {"step_ms", ms},
                {"running", r.tokens.size()},
                {"new_tokens", r.tokens.size()},
                {"finished", finished},
                {"admitted", start.size()},
                {"started", started},
                {"queued", sched.queued()},
                {"prefill_tokens", r.prefill_tokens},
                {"decode_tokens", r.decode_tokens},
                {"total_context", r.total_context},
                {"phases_ms", phases},
                {"breakdown_ms", r.breakdown_ms}};
    if (!r.counts.empty()) rec["counts"] = r.counts;
    if (r.worker_kv_imbalance > 0) rec["worker_kv_imbalance"] = r.worker_kv_imbalance;
    kv_imbalance.push_back(r.worker_kv_imbalance);
    trace.event("harness", "step " + std::to_string(engine_steps), s0, s1 - s0,
                {{"tokens", r.tokens.size()}, {"total_context", r.total_context}});
    steps_out << rec.dump() << "\n";
    steps_out.flush();
    ++step;
    ++engine_steps;
    st.steps = engine_steps;
    st.output_tokens += int64_t(r.tokens.size());
    progress.update(engine_steps, out_tokens, int64_t(r.tokens.size()) - finished);
  }
  const int64_t t_end = now_ns();
  progress.update(engine_steps, out_tokens, 0, true);
  progress.done();
  engine->shutdown();
  steps_out.close();

  // Per-request latency metrics (vLLM's names): TTFT from arrival to the first token; TPOT =
  // (last - first) / (n - 1); ITL = every gap between consecutive tokens; queueing = arrival to the
  // step that admitted it; e2e = arrival to the last token.
  std::vector<double> ttft, tpot, itl, e2e, queue;
  std::vector<RequestLatency> latencies;  // for results.slo
  live_requests.close();
  std::ofstream req_out(dir / "requests.jsonl", std::ios::trunc);
  for (const auto& [id, rt] : track) {
    FD_CHECK(!rt.tokens.empty(), "request " << id << " produced no token");
    const json rec = request_record(id, rt, by_id.at(id)->prompt);
    const double first = rec["ttft_ms"].get<double>(), last = rec["e2e_ms"].get<double>();
    ttft.push_back(first);
    e2e.push_back(last);
    queue.push_back(rec["queue_ms"].get<double>());
    const size_t n = rt.tokens.size();
    if (n > 1) tpot.push_back((last - first) / double(n - 1));
    latencies.push_back({first, last, int64_t(n)});
    for (size_t i = 1; i < n; ++i) itl.push_back(double(rt.token_ns[i] - rt.token_ns[i - 1]) / 1e6);
    req_out << rec.dump() << "\n";
  }

  // Logits outputs: logits.jsonl (one line per recorded request) and score.jsonl (scored requests).
  json score_summary;
  if (write_logits) {
    std::ofstream lo(dir / "logits.jsonl", std::ios::trunc);
    if (!lo) FD_THROW((dir / "logits.jsonl").string() << ": cannot open for writing");
    for (const auto& [id, L] : logit_track) {
      json rec = {{"request", id}, {"tokens", track.at(id).tokens}};
      if (!L.forced.empty()) rec["forced"] = L.forced;
      if (write_npy && !npy_ids.count(id)) rec["full"] = false;  // no logits/request_ID.npy for it
      if (e.logits.top_k > 0) {
        json top = json::array();
        for (const auto& row : L.top) {
          json r = json::array();
          for (const auto& [tok, lp] : row) r.push_back({tok, lp});
          top.push_back(std::move(r));
        }
        rec["top"] = std::move(top);
      }
      lo << rec.dump() << "\n";
    }
  }
  if (e.workload.source == "score") {
    std::ofstream so(dir / "score.jsonl", std::ios::trunc);
    if (!so) FD_THROW((dir / "score.jsonl").string() << ": cannot open for writing");
    double nll = 0;
    int64_t n = 0;
    for (const auto& [id, L] : logit_track) {
      FD_CHECK(L.positions == int64_t(L.forced.size()),
               "request " << id << ": " << L.positions << " scored positions for " << L.forced.size() << " forced tokens");
      const double mean = L.nll_sum / double(L.positions);
      so << json{{"request", id}, {"tokens", L.positions}, {"nll_sum", L.nll_sum}, {"nll_mean", mean}, {"ppl", std::exp(mean)}}.dump()
         << "\n";
      nll += L.nll_sum;
      n += L.positions;
    }
    score_summary = {{"requests", logit_track.size()}, {"tokens", n}, {"nll_sum", nll},
                     {"mean_nll", n ? nll / double(n) : 0.0}, {"perplexity", n ? std::exp(nll / double(n)) : 0.0}};
  }

  const double dur_s = double(t_end - t0) / 1e9;
  json results = {{"num_requests", requests.size()},
                  {"prompt_tokens", prompt_tokens},
                  {"output_tokens", out_tokens},
                  {"steps", engine_steps},
                  {"duration_s", dur_s},
                  {"weights_load_s", load_s},
                  {"output_throughput", double(out_tokens) / dur_s},
                  {"total_token_throughput", double(out_tokens + prompt_tokens) / dur_s},
                  {"request_throughput", double(requests.size()) / dur_s},
                  {"step_ms", distribution(step_ms)},
                  {"ttft_ms", distribution(ttft)},
                  {"tpot_ms", distribution(tpot)},
                  {"itl_ms", distribution(itl)},
                  {"e2e_latency_ms", distribution(e2e)},
                  {"queue_ms", distribution(queue)}};
  // Decode-only steps and the steady window (harness/step_stats.h); at reduced depth, the full-depth
  // equivalents of the rates (extrapolated, labelled so).
  results["decode_only"] = decode_only_stats(step_stats);
  results["steady"] = steady_stats(step_stats);
  results["slo"] = slo_stats(e.workload.slo.ttft_ms, e.workload.slo.tpot_ms, e.workload.slo.e2e_ms, latencies, dur_s);
  // The busiest worker's KV tokens over the mean, per decode step (engines with workers): over the decode-only steps
  // and over the steady window's.
  if (json imb = worker_imbalance_stats(step_stats, kv_imbalance); !imb.is_null()) results["worker_kv_imbalance"] = imb;
  if (e.model.num_layers < e.model.full_num_layers)
    results["full_depth_equivalent"] = full_depth_equivalent(e.model.num_layers, e.model.full_num_layers, results);
  // Mean per step of the engine's breakdown (e.g. S-Part compute, wait for R-workers, slowest R-worker).
  json bd = json::object();
  for (const auto& [k, v] : breakdown_total) bd[k] = engine_steps > 0 ? v / double(engine_steps) : 0.0;
  results["step_breakdown_ms_mean"] = bd;
  if (!counts_total.empty()) {  // engine event counts (StepResult::counts), when the engine reports any
    results["counts_total"] = counts_total;
    results["steps_with_counts"] = steps_with_counts;
  }
  json model = {{"name", e.model.name}, {"arch", arch_name(e.model.arch)}, {"layers", e.model.num_layers},
                {"full_layers", e.model.full_num_layers}, {"params", e.model.num_params()},
                {"weights", weights->describe()}};
  json notes = json::array();
  if (!capacity_note.empty()) notes.push_back(capacity_note);
  results["kv_capacity_tokens"] = sc.kv_capacity_tokens;
  for (const std::string& n : engine->notes()) notes.push_back(n);
  json summary = {{"name", e.name},   {"status", "ok"}, {"engine", engine->name()}, {"engine_info", engine_info},
                  {"config_file", e.file}, {"config", e.resolved()}, {"provenance", prov}, {"model", model},
                  {"results", results}, {"notes", notes}};
  summary["overrides"] = e.overrides;
  if (!score_summary.is_null()) summary["score"] = score_summary;
  write_json_file((dir / "trace.json").string(), trace.finish(prov, "fd-bench " + e.name), -1);
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
