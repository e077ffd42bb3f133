// fd-sim: runs the sequence-level scheduler (fastdecode/sched/schedule.h) without hardware against a
// cost model, and writes steps.jsonl and summary.json (docs/SCHEDULING.md).
//
// Step time (two mini-batch pipeline, paper Fig. 5): the running batch is split in two halves; per
// layer the GPU runs the S-Part of one half while the R-workers run the R-Part of the other. With
// balanced halves a layer takes max(S, R), so a step takes
//     s_ms = N·T(n)            (or the constant --t-ms-per-step-s-part)      n = running sequences
//     r_ms = N·W·R/P                                                         W = total context
//     step_ms = max(s_ms, r_ms)
// With a profile that has R-workers measured in service (fd-bench profile --service: r_service) the step is the one
// model of fastdecode/sched/perf_model.h instead, predict_step at (n, W/n): N·max(2·T(n/2), R(n, W/n)) + T(n/2) +
// head(n), s_ms and r_ms its N·S and N·R parts (fd-bench predict gives the same number).
// With R-worker processes (--workers, or the service profile's), each admitted request is placed on one as the
// FastDecode engine places it (fastdecode/sched/placement.h) and the R part is the busiest worker's: the even share
// times its KV tokens over the mean (worker_kv_imbalance, as fd-bench records it).
// Prefill and transfer are not modelled (the paper's workloads have short prompts). A request's admission
// step stands for its prefill: steps.jsonl counts its prompt as that step's prefill_tokens and the others
// as decode_tokens, so results.decode_only / steady follow fd-bench's rules (harness/step_stats.h).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>
#include <sstream>

#include "fastdecode/core/error.h"
#include "fastdecode/model/weights.h"
#include "fastdecode/sched/perf_model.h"
#include "fastdecode/sched/placement.h"
#include "fastdecode/sched/schedule.h"
#include "fastdecode/core/cli_main.h"
#include "harness/engines.h"
#include "harness/experiment.h"
#include "harness/provenance.h"
#include "harness/runner.h"
#include "harness/step_stats.h"

namespace fs = std::filesystem;
using fd::json;

namespace {

[[noreturn]] void usage(const std::string& what) { throw fd::ConfigError(what); }

int64_t parse_int(const std::string& s, const std::string& flag) {
  size_t pos = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos == 0 || pos != s.size()) usage(flag + ": '" + s + "' is not an integer");
  return v;
}

double parse_double(const std::string& s, const std::string& flag) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos == 0 || pos != s.size() || !std::isfinite(v)) usage(flag + ": '" + s + "' is not a number");
  return v;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream is(s);
  while (std::getline(is, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.push_back("");
  return out;
}

// "N" or "uniform:a:b" (inclusive), drawn with splitmix64 from (seed, stream, request index).
struct LengthDist {
  int64_t lo = 0, hi = 0;
  static LengthDist parse(const std::string& s, const std::string& flag, int64_t min_value) {
    LengthDist d;
    if (s.rfind("uniform:", 0) == 0) {
      const auto parts = split(s, ':');
      if (parts.size() != 3) usage(flag + ": expected N or uniform:A:B, got '" + s + "'");
      d.lo = parse_int(parts[1], flag);
      d.hi = parse_int(parts[2], flag);
    } else {
      d.lo = d.hi = parse_int(s, flag);
    }
    if (d.lo < min_value || d.hi < d.lo)
      usage(flag + ": need " + std::to_string(min_value) + " <= A <= B, got '" + s + "'");
    return d;
  }
  int64_t draw(uint64_t seed, uint64_t stream, uint64_t i) const {
    if (lo == hi) return lo;
    const uint64_t x = fd::splitmix64(fd::splitmix64(seed ^ stream) + i);
    return lo + int64_t(x % uint64_t(hi - lo + 1));
  }
  bool fixed() const { return lo == hi; }
};

// The cost of one step from (running sequences n, total context W).
struct CostModel {
  bool has_s = false, has_r = false;
  std::optional<double> s_step_ms_const;  // --t-ms-per-step-s-part
  fd::TTable t;                           // T(B), s per layer
  double r_s = 0;                         // R, s per token per layer per R-worker
  int64_t layers = 0;                     // N
  double rworkers = 1;                    // P
  double t_layer_s(double n) const { return s_step_ms_const ? *s_step_ms_const / 1e3 / double(layers) : t.at(n); }
  double s_ms(int64_t n) const {
    if (!has_s || n == 0) return 0;
    if (s_step_ms_const) return *s_step_ms_const;
    return double(layers) * t.at(double(n)) * 1e3;  // N·T(n)
  }
  double r_ms(int64_t w) const { return has_r ? double(layers) * double(w) * r_s / rworkers * 1e3 : 0; }  // N·W·R/P
  // The service model (predict_step), when the profile has r_service: {s_ms, r_ms, step_ms}.
  const fd::Profile* service = nullptr;
  std::string kv_dtype = "fp16";
  // `busiest`: the busiest R-worker's KV tokens over the mean (1: an even share).
  std::array<double, 3> step(int64_t n, int64_t w, double busiest) const {
    if (service && n > 0) {
      const fd::StepPrediction p =
          fd::predict_step(*service, *service, kv_dtype, double(n), double(w) / double(n), layers, std::max(1.0, busiest));
      return {double(layers) * p.s_layer_s * 1e3, double(layers) * p.r_layer_s * 1e3, p.step_s * 1e3};
    }
    const double s = s_ms(n), r = r_ms(w) * std::max(1.0, busiest);
    return {s, r, std::max(s, r)};
  }
};

struct SimRequest {
  uint64_t id = 0;
  double arrival_s = 0;
  int64_t prompt_len = 0, gen_len = 1, max_gen_len = 1;
  // filled by the simulation
  size_t worker = 0;  // with --workers: the R-worker it was placed on
  int64_t admit_step = -1, finish_step = -1, produced = 0;
  double admit_s = 0, first_token_s = 0, last_token_s = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fd-sim: simulate SLS / load-control admission against a cost model (docs/SCHEDULING.md)", "fd-sim"};
  std::string mode_s, out, gen_len_s, prompt_len_s = "0", arrival_s = "offline", trace, profile_path, t_b_ms,
                                      kv_dtype = "fp16", experiment;
  std::vector<std::string> sets;
  std::string slo_s;
  int64_t batch = 0, seq = 0, interval = fd::SchedulerConfig{}.interval, w_lim = 0, micro_batch = 0, max_running = -1, min_gap = 0, kv_cap = 0, requests = 0,
          steps_cap = 0, layers = 0;
  uint64_t seed = 0;
  double rworkers = 1;
  int64_t workers = -1;
  std::optional<double> t_ms_step, r_ns;
  app.add_option("--experiment", experiment,
                 "an fd-bench experiment config: its schedule, workload, layers and R-workers, read as fd-bench reads "
                 "them (instead of the flags for those)");
  app.add_option("--set", sets, "with --experiment: KEY=VALUE overrides, as fd-bench's --set")->needs("--experiment");
  app.add_option("--mode", mode_s, "all-at-once | fixed-interval | load-control (required without --experiment)")
      ->check(CLI::IsMember({"all-at-once", "fixed-interval", "load-control"}));
  app.add_option("--batch", batch, "B: sequences started together / target running batch (required without --experiment)")->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  app.add_option("--seq", seq, "S: generation length in steps (the paper's S; --gen-len defaults to it; required without --experiment)")->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  app.add_option("--interval", interval, "F: steps between micro-batches (default 1, as schedule.interval in fd-bench)")->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  app.add_option("--w-lim", w_lim, "load-control: limit on projected total context, tokens")->check(CLI::Range(int64_t(1), int64_t(1) << 60));
  app.add_option("--micro-batch", micro_batch, "load-control: micro-batch size m (default ceil(B*F/S))")->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  app.add_option("--max-running", max_running, "load-control: cap on running sequences (default 0 = none, as schedule.max_running)")->check(CLI::Range(int64_t(0), int64_t(1) << 24));
  app.add_option("--min-gap", min_gap, "load-control: at least this many steps between micro-batches (default 0 = greedy)")->check(CLI::Range(int64_t(0), int64_t(1) << 24));
  app.add_option("--kv-capacity-tokens", kv_cap, "R-workers' KV capacity in tokens, all workers (default: unlimited)")->check(CLI::Range(int64_t(1), int64_t(1) << 60));
  app.add_option("--requests", requests, "number of requests (default 4*B)")->check(CLI::Range(int64_t(1), int64_t(1) << 26));
  app.add_option("--gen-len", gen_len_s, "generated tokens per request: N or uniform:A:B (default S); the scheduler projects with the maximum");
  app.add_option("--prompt-len", prompt_len_s, "prompt tokens: N or uniform:A:B (default 0)");
  app.add_option("--arrival", arrival_s, "offline (all at t=0) or poisson:RATE (requests/s)");
  app.add_option("--trace", trace, "JSONL trace: {arrival_s, prompt_len, gen_len[, max_gen_len]} per line")
      ->excludes("--requests")->excludes("--gen-len")->excludes("--prompt-len")->excludes("--arrival");
  app.add_option("--steps", steps_cap, "stop after this many steps (0 = run to completion)")->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  app.add_option("--seed", seed, "seed of lengths and arrivals");
  app.add_option("--t-ms-per-step-s-part", t_ms_step, "S-Part time of a whole step (all layers), ms, any batch")->check(CLI::PositiveNumber);
  app.add_option("--t-b-ms", t_b_ms, "T(B) table, ms per layer: 'B:ms,B:ms,...' (interpolated)")->excludes("--t-ms-per-step-s-part");
  app.add_option("--r-ns-per-token-layer", r_ns, "R: ns per context token per layer on one R-worker")->check(CLI::PositiveNumber);
  app.add_option("--layers", layers, "N: layers (default: the profile's)")->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  app.add_option("--rworkers", rworkers, "P: R-workers (CPUs) sharing the R-Part evenly (default 1)")->check(CLI::PositiveNumber);
  app.add_option("--workers", workers,
                 "R-worker processes the sequences are placed on as the FastDecode engine places them; the R part is the "
                 "busiest one's (default: the profile's r_service workers, else 0 = an even share)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 16));
  app.add_option("--profile", profile_path, "profile.json: {t_b: [[B, s/layer]..], r_s_per_token_layer: {dtype: s}, layers}");
  app.add_option("--kv-dtype", kv_dtype, "which R of the profile (default fp16)");
  app.add_option("--slo", slo_s, "latency limits of a good request, ms: ttft:MS,tpot:MS,e2e:MS (results.slo, as fd-bench's; "
                 "with --experiment its workload.slo is the default)");
  app.add_option("--out", out, "output folder (steps.jsonl, summary.json)")->required();

  return fd::guarded_main(app, argc, argv, [&]() -> int {
    // ---------------- validation (all before any work; ConfigError -> exit 2) ----------------
    fd::SchedulerConfig sc;
    std::optional<fd::ExperimentConfig> exp;
    if (!experiment.empty()) {
      // The experiment's schedule, workload, layers and R-workers, parsed and defaulted by fd-bench's own reader.
      for (const char* f : {"--mode", "--batch", "--seq", "--interval", "--w-lim", "--micro-batch", "--max-running", "--min-gap",
                            "--kv-capacity-tokens", "--requests", "--gen-len", "--prompt-len", "--arrival", "--trace", "--seed",
                            "--layers", "--rworkers", "--workers"})
        if (app.count(f) > 0)
          usage(std::string(f) + " with --experiment: the experiment sets it (change it there, or with --set)");
      exp = fd::load_experiment(experiment, sets);
      const fd::RWorkerShape rw = fd::fastdecode_rworkers(exp->engine, exp->hardware);
      sc = exp->schedule;
      mode_s = fd::to_string(sc.mode);
      batch = sc.batch, seq = sc.seq, interval = sc.interval, kv_cap = sc.kv_capacity_tokens;
      layers = exp->model.num_layers;
      rworkers = double(rw.processes * rw.threads);
      workers = rw.processes;
      if (app.count("--kv-dtype") == 0) kv_dtype = rw.kv_dtype;
    } else {
      if (mode_s.empty() || batch <= 0 || seq <= 0) usage("give --mode, --batch and --seq (or --experiment)");
      sc.mode = fd::parse_admit_mode(mode_s);
      sc.batch = batch;
      sc.seq = seq;
      sc.interval = interval;
      if (sc.mode == fd::AdmitMode::LoadControl) {
        if (w_lim <= 0) usage("--mode load-control needs --w-lim");
        sc.w_lim = w_lim;
        sc.micro_batch = micro_batch;
        sc.max_running = max_running < 0 ? 0 : max_running;  // fd-bench's schedule.max_running default: no cap
        sc.min_gap = min_gap;
      } else {
        if (w_lim > 0) usage("--w-lim applies to --mode load-control only");
        if (micro_batch > 0 || max_running >= 0 || min_gap > 0)
          usage("--micro-batch / --max-running / --min-gap apply to --mode load-control only");
      }
      sc.kv_capacity_tokens = kv_cap;
    }
    fd::validate(sc);

    CostModel cost;
    std::optional<fd::Profile> profile;
    if (!profile_path.empty()) profile = fd::load_profile(profile_path);
    if (t_ms_step) {
      cost.has_s = true;
      cost.s_step_ms_const = *t_ms_step;
    } else if (!t_b_ms.empty()) {
      std::vector<std::pair<double, double>> pts;
      for (const auto& item : split(t_b_ms, ',')) {
        const auto bt = split(item, ':');
        if (bt.size() != 2) usage("--t-b-ms: expected B:ms pairs separated by commas, got '" + item + "'");
        pts.emplace_back(parse_double(bt[0], "--t-b-ms"), parse_double(bt[1], "--t-b-ms") / 1e3);
      }
      try {
        cost.t = fd::TTable(std::move(pts));
      } catch (const fd::ConfigError& e) {
        usage(std::string("--t-b-ms: ") + e.what());
      }
      cost.has_s = true;
    } else if (profile) {
      cost.t = profile->t;
      cost.has_s = true;
    }
    if (r_ns) {
      cost.r_s = *r_ns * 1e-9;
      cost.has_r = true;
    } else if (profile) {
      auto it = profile->r_s_per_token_layer.find(kv_dtype);
      if (it == profile->r_s_per_token_layer.end()) usage(profile_path + ": no r_s_per_token_layer for kv dtype '" + kv_dtype + "'");
      cost.r_s = it->second;
      cost.has_r = true;
    }
    cost.layers = layers > 0 ? layers : (profile ? profile->layers : 0);
    const bool per_layer = cost.has_r || (cost.has_s && !cost.s_step_ms_const);
    if (per_layer && cost.layers <= 0) usage("give --layers (T(B) and R are per layer)");
    if (cost.layers <= 0) cost.layers = 1;
    cost.rworkers = rworkers;
    // A profile with R-workers in service, and nothing overriding its T(B) or R: the one model (predict_step).
    if (profile && !profile->service.empty() && !t_ms_step && t_b_ms.empty() && !r_ns) {
      const double svc_cpus = double(profile->service.workers * profile->service.threads);
      if (rworkers != svc_cpus)
        usage("--rworkers " + fd::format_count(rworkers) + ": the profile's R-workers in service are " +
              std::to_string(profile->service.workers) + " x " + std::to_string(profile->service.threads) + " threads = " +
              fd::format_count(svc_cpus) + " CPUs (its r_service was measured for them)");
      if (profile->service.round_s.count(kv_dtype) == 0) usage(profile_path + ": r_service has no " + kv_dtype + " rows");
      cost.service = &*profile;
      cost.kv_dtype = kv_dtype;
      if (workers < 0) workers = profile->service.workers;
    }
    if (workers < 0) workers = 0;
    const bool timed = cost.has_s || cost.has_r;
    // --slo (or the experiment's workload.slo): the limits results.slo judges each request by.
    fd::SloLimits slo = exp ? exp->workload.slo : fd::SloLimits{};
    if (!slo_s.empty()) slo = fd::parse_slo_flag(slo_s);

    // ---------------- workload ----------------
    std::vector<SimRequest> reqs;
    bool online = false;
    if (exp) {  // the requests fd-bench makes of the workload: their lengths, arrivals and the scheduler's projection
      const std::vector<fd::Request> made = fd::make_requests(exp->workload, exp->model);
      const std::vector<double> arrivals = fd::arrival_times(exp->workload);
      for (size_t i = 0; i < made.size(); ++i) {
        const int64_t projected = exp->workload.file_requests.empty() ? made[i].max_new_tokens : exp->workload.file_requests[i].max_gen_len;
        reqs.push_back({uint64_t(i), arrivals[i], int64_t(made[i].prompt.size()), made[i].max_new_tokens, projected});
      }
      online = exp->workload.arrival != "offline";
    } else if (!trace.empty()) {
      online = true;
      for (const auto& t : fd::load_trace_jsonl(trace))
        reqs.push_back({reqs.size(), t.arrival_s, t.prompt_len, t.gen_len, t.max_gen_len});
    } else {
      const int64_t n = requests > 0 ? requests : 4 * batch;
      const LengthDist gen = gen_len_s.empty() ? LengthDist{seq, seq} : LengthDist::parse(gen_len_s, "--gen-len", 1);
      const LengthDist prm = LengthDist::parse(prompt_len_s, "--prompt-len", 0);
      std::vector<double> arrivals(size_t(n), 0.0);
      if (arrival_s.rfind("poisson:", 0) == 0) {
        const double rate = parse_double(arrival_s.substr(8), "--arrival");
        if (!(rate > 0)) usage("--arrival poisson:RATE needs RATE > 0");
        arrivals = fd::poisson_arrivals(n, rate, seed);
        online = true;
      } else if (arrival_s != "offline") {
        usage("--arrival: expected offline or poisson:RATE, got '" + arrival_s + "'");
      }
      for (int64_t i = 0; i < n; ++i)
        reqs.push_back({uint64_t(i), arrivals[size_t(i)], prm.draw(seed, 0x70726f6d7074ull, uint64_t(i)),
                        gen.draw(seed, 0x67656e6c656eull, uint64_t(i)), gen.hi});
    }
    if (online && !timed)
      usage("online arrivals (--arrival poisson / --trace) need a cost model (--t-ms-per-step-s-part, --t-b-ms or --profile)");

    fd::Scheduler sched(sc);
    for (const auto& r : reqs) sched.submit({r.id, r.arrival_s, r.prompt_len, r.max_gen_len});

    if (fs::exists(fs::path(out) / "summary.json")) usage(out + ": already holds a summary.json (refusing to overwrite)");
    fs::create_directories(out);
    std::ofstream steps_out(fs::path(out) / "steps.jsonl");
    if (!steps_out) FD_THROW(out << "/steps.jsonl: cannot write");

    // ---------------- simulation ----------------
    std::vector<size_t> active;  // indices into reqs
    double clock = 0;
    int64_t step = 0, recorded = 0, output_tokens = 0;
    double first_start = -1, end_s = 0;
    std::vector<fd::StepStat> recs;  // step_ms absent without a cost model
    std::vector<double> imbalance;   // per recorded step: the busiest worker's KV over the mean (0: no --workers)
    std::vector<int64_t> placed_load(size_t(workers), 0);  // per worker: prompt + max new tokens of its sequences
    std::vector<bool> no_dead(size_t(workers), false);
    int64_t longest = 0;
    std::vector<double> itl_ms;
    int64_t s_bound = 0, r_bound = 0;
    bool truncated = false;
    while (!sched.done()) {
      if (steps_cap > 0 && step >= steps_cap) {
        truncated = true;
        break;
      }
      if (sched.running() == 0 && sched.arrived(clock) == 0) clock = std::max(clock, *sched.next_arrival_s());  // idle
      const auto ids = sched.admit(step, clock);
      int64_t prefill_tokens = 0;  // the admitted requests' prompts (not timed: prefill is not modelled)
      for (auto id : ids) {
        SimRequest& r = reqs[size_t(id)];
        r.admit_step = step;
        r.admit_s = clock;
        prefill_tokens += r.prompt_len;
        if (workers > 0) {  // the engine's placement, against the sequences running now
          std::vector<fd::PlacedLoad> running;
          running.reserve(active.size());
          for (size_t i : active) {
            const SimRequest& a = reqs[i];
            const int64_t done = step - a.admit_step;  // tokens it has made before this step; its KV as the engine counts it
            running.push_back({a.worker, double(done > 0 ? a.prompt_len + done - 1 : a.prompt_len), double(a.max_gen_len - done)});
          }
          const int64_t need = r.prompt_len + r.max_gen_len;
          longest = std::max(longest, need);
          r.worker = fd::place_sequence(placed_load, no_dead, running, double(r.prompt_len), double(r.max_gen_len), need, longest);
          placed_load[r.worker] += need;
        }
        active.push_back(size_t(id));
      }
      if (active.empty()) {  // nothing runs at this step (fixed-interval waiting for its slot): no cost
        ++step;
        continue;
      }
      int64_t w = 0;
      for (size_t i : active) w += reqs[i].prompt_len + (step - reqs[i].admit_step + 1);
      const int64_t n = int64_t(active.size());
      double busiest = 0;  // over the sequences past their admission step, as the engine's decode records it
      if (workers > 0) {
        std::vector<int64_t> kv(size_t(workers), 0);
        int64_t sum = 0;
        for (size_t i : active)
          if (reqs[i].admit_step < step) {
            const int64_t c = reqs[i].prompt_len + (step - reqs[i].admit_step);  // its KV after this step's append
            kv[reqs[i].worker] += c, sum += c;
          }
        if (sum > 0) busiest = double(*std::max_element(kv.begin(), kv.end())) * double(workers) / double(sum);
      }
      const auto [s_ms, r_ms, step_ms] = cost.step(n, w, busiest);
      (s_ms >= r_ms ? s_bound : r_bound) += 1;
      const double t_end = clock + step_ms / 1e3;
      int64_t finished = 0;
      std::vector<size_t> still;
      still.reserve(active.size());
      for (size_t i : active) {
        SimRequest& r = reqs[i];
        ++r.produced;
        if (r.produced == 1) r.first_token_s = t_end;
        else itl_ms.push_back((t_end - r.last_token_s) * 1e3);
        r.last_token_s = t_end;
        if (r.produced == r.gen_len) {
          r.finish_step = step;
          if (workers > 0) placed_load[r.worker] -= r.prompt_len + r.max_gen_len;
          sched.on_finished(r.id, step);
          ++finished;
        } else {
          still.push_back(i);
        }
      }
      const int64_t queued = sched.arrived(clock);
      const int64_t decode_tokens = n - int64_t(ids.size());  // sequences past their admission step
      json line = {{"step", step},       {"start_s", clock},   {"running", n},          {"admitted", ids.size()},
                   {"finished", finished}, {"queued", queued}, {"total_context", w},    {"s_ms", s_ms},
                   {"r_ms", r_ms},        {"step_ms", step_ms}, {"binds", s_ms >= r_ms ? "S" : "R"},
                   {"new_tokens", n},     {"prefill_tokens", prefill_tokens},           {"decode_tokens", decode_tokens},
                   {"started", ids.size()}};  // as fd-bench's steps.jsonl: an admitted request starts at once
      if (busiest > 0) line["worker_kv_imbalance"] = busiest;
      imbalance.push_back(busiest);
      if (!cost.has_s && !cost.has_r)  // no cost model: the schedule only; times are unknown, not zero
        for (const char* k : {"start_s", "s_ms", "r_ms", "step_ms", "binds"}) line[k] = nullptr;
      steps_out << line.dump() << "\n";
      recs.push_back({step, timed ? std::optional<double>(step_ms) : std::nullopt, prefill_tokens, decode_tokens, n, n, w,
                      int64_t(ids.size()), finished});
      if (first_start < 0) first_start = clock;
      output_tokens += n;
      active.swap(still);
      clock = t_end;
      end_s = t_end;
      ++step;
      ++recorded;
    }
    steps_out.close();
    if (!steps_out) FD_THROW(out << "/steps.jsonl: write failed");

    // ---------------- summary ----------------
    // Steady window (harness/step_stats.h, the same rule as fd-bench): the steps strictly between the
    // last admission and the first finish, in whichever order they come; none -> the whole run.
    const fd::SteadyWindow win = fd::steady_window(recs);
    const int64_t n_steady = int64_t(win.end - win.begin);
    int64_t max_ctx = 0, max_ctx_steady = 0, max_running_seen = 0;
    double sum_steady = 0, sum_all = 0, sum_running_steady = 0, peak_ms = 0;
    std::vector<double> step_ms_all;
    for (size_t i = 0; i < recs.size(); ++i) {
      const fd::StepStat& r = recs[i];
      max_ctx = std::max(max_ctx, r.total_context);
      max_running_seen = std::max(max_running_seen, r.running);
      sum_all += double(r.total_context);
      peak_ms = std::max(peak_ms, r.step_ms.value_or(0.0));
      step_ms_all.push_back(r.step_ms.value_or(0.0));
      if (i >= win.begin && i < win.end) {
        sum_steady += double(r.total_context);
        sum_running_steady += double(r.running);
        max_ctx_steady = std::max(max_ctx_steady, r.total_context);
      }
    }
    std::vector<double> ttft, tpot, queue_delay, e2e;
    std::vector<fd::RequestLatency> latencies;
    int64_t finished_requests = 0;
    for (const auto& r : reqs) {
      if (r.finish_step < 0) continue;
      ++finished_requests;
      ttft.push_back((r.first_token_s - r.arrival_s) * 1e3);
      queue_delay.push_back((r.admit_s - r.arrival_s) * 1e3);
      e2e.push_back((r.last_token_s - r.arrival_s) * 1e3);
      if (r.produced > 1) tpot.push_back((r.last_token_s - r.first_token_s) * 1e3 / double(r.produced - 1));
      latencies.push_back({(r.first_token_s - r.arrival_s) * 1e3, (r.last_token_s - r.arrival_s) * 1e3, r.produced});
    }
    const double duration = recs.empty() ? 0 : end_s - first_start;
    auto timed_or_null = [&](const json& v) { return timed ? v : json(nullptr); };

    json results = {
        {"steps", recorded},
        {"last_step", recs.empty() ? -1 : recs.back().step},
        {"truncated", truncated},
        {"num_requests", int64_t(reqs.size())},
        {"finished_requests", finished_requests},
        {"output_tokens", output_tokens},
        {"duration_s", timed_or_null(duration)},
        {"tokens_per_s", timed_or_null(duration > 0 ? double(output_tokens) / duration : 0.0)},
        {"max_total_context", max_ctx},
        {"mean_total_context", n_steady ? sum_steady / double(n_steady) : 0.0},
        {"max_total_context_steady", max_ctx_steady},
        {"mean_total_context_all", recs.empty() ? 0.0 : sum_all / double(recs.size())},
        {"steady_window", {{"first_step", win.first_step}, {"last_step", win.last_step}, {"steps", n_steady}, {"rule", win.rule}}},
        {"max_running", max_running_seen},
        {"mean_running_steady", n_steady ? sum_running_steady / double(n_steady) : 0.0},
        {"peak_step_ms", timed_or_null(peak_ms)},
        {"step_ms", timed_or_null(fd::distribution(step_ms_all))},
        {"s_bound_steps", s_bound},
        {"r_bound_steps", r_bound},
        {"ttft_ms", timed_or_null(fd::distribution(ttft))},
        {"tpot_ms", timed_or_null(fd::distribution(tpot))},
        {"itl_ms", timed_or_null(fd::distribution(itl_ms))},
        {"queue_delay_ms", timed_or_null(fd::distribution(queue_delay))},
        {"e2e_latency_ms", timed_or_null(fd::distribution(e2e))},
        {"decode_only", fd::decode_only_stats(recs)},
        {"steady", fd::steady_stats(recs)},
    };
    if (json imb = fd::worker_imbalance_stats(recs, imbalance); !imb.is_null()) results["worker_kv_imbalance"] = imb;
    // Goodput and SLO attainment (harness/step_stats.h), as fd-bench's; time-based, so null without a cost model.
    results["slo"] = timed ? fd::slo_stats(slo.ttft_ms, slo.tpot_ms, slo.e2e_ms, latencies, duration) : json(nullptr);
    // Closed-form predictions (fixed lengths only): context convention ctx = prompt + tokens so far.
    json pred = json::object();
    // The workload's fixed lengths, when they are: {prompt, generated}.
    std::optional<std::pair<int64_t, int64_t>> fixed_len;
    if (exp) {
      const fd::WorkloadConfig& wl = exp->workload;
      if (wl.source == "random" && wl.prompt_len.fixed() && wl.gen_len.fixed()) fixed_len = {{wl.prompt_len.min, wl.gen_len.min}};
    } else if (trace.empty()) {
      const LengthDist gen = gen_len_s.empty() ? LengthDist{seq, seq} : LengthDist::parse(gen_len_s, "--gen-len", 1),
                       prm = LengthDist::parse(prompt_len_s, "--prompt-len", 0);
      if (gen.fixed() && prm.fixed()) fixed_len = {{prm.lo, gen.lo}};
    }
    if (fixed_len) {
      const double B = double(batch), S = double(fixed_len->second), F = double(interval), p = double(fixed_len->first);
      pred["all_at_once_peak"] = B * (p + S);                          // B·(p+S); B·S with p = 0
      pred["fixed_interval_steady_peak"] = B * p + B * (S + F) / 2;    // paper's W'max = B(S+F)/2
      pred["fixed_interval_steady_mean"] = B * p + B * (S + 1) / 2;    // mean over whole periods
    }
    results["predictions"] = pred;
    json perf = nullptr;
    if (cost.has_s && cost.has_r) {
      const double tb = cost.t_layer_s(double(batch)), S = double(seq);
      perf = {{"t_b_s_per_layer", tb},
              {"cpus_needed", fd::cpus_needed(double(batch), S, cost.r_s, tb)},
              {"tokens_per_s_s_bound", fd::tokens_per_s_s_bound(double(batch), cost.layers, tb)},
              {"tokens_per_s_r_bound", fd::tokens_per_s_r_bound(cost.rworkers, cost.layers, S, cost.r_s)}};
      perf["binds"] = perf["tokens_per_s_s_bound"].get<double>() <= perf["tokens_per_s_r_bound"].get<double>() ? "S" : "R";
    }
    results["perf_model"] = perf;

    json config = {{"mode", mode_s},
                   {"batch", batch},
                   {"seq", seq},
                   {"interval", interval},
                   {"w_lim", sc.w_lim},
                   {"micro_batch", sc.mode == fd::AdmitMode::LoadControl ? sched.config().micro_batch : 0},
                   {"max_running", sc.max_running},
                   {"min_gap", sc.min_gap},
                   {"kv_capacity_tokens", kv_cap},
                   {"requests", int64_t(reqs.size())},
                   {"gen_len", exp ? exp->resolved()["workload"]["gen_len"] : json(trace.empty() ? (gen_len_s.empty() ? std::to_string(seq) : gen_len_s) : "trace")},
                   {"prompt_len", exp ? exp->resolved()["workload"]["prompt_len"] : json(trace.empty() ? prompt_len_s : "trace")},
                   {"arrival", exp ? exp->resolved()["workload"]["arrival"] : json(trace.empty() ? arrival_s : "trace:" + trace)},
                   {"experiment", exp ? json(experiment) : json(nullptr)},
                   {"experiment_resolved", exp ? json{{"schedule", exp->resolved()["schedule"]}, {"workload", exp->resolved()["workload"]},
                                                      {"layers", exp->model.num_layers}}
                                               : json(nullptr)},
                   {"experiment_set", sets},
                   {"steps_cap", steps_cap},
                   {"seed", exp ? exp->workload.seed : seed},
                   {"cost", {{"t_ms_per_step_s_part", t_ms_step ? json(*t_ms_step) : json(nullptr)},
                             {"t_b_s_per_layer", cost.t.empty() || cost.s_step_ms_const ? json(nullptr) : json(cost.t.points())},
                             {"r_s_per_token_layer", cost.has_r ? json(cost.r_s) : json(nullptr)},
                             {"layers", cost.layers},
                             {"rworkers", cost.rworkers},
                             {"workers", workers},
                             {"profile", profile_path},
                             {"kv_dtype", kv_dtype},
                             {"model", cost.service ? "predict_step (r_service)" : "max(N·T(n), N·W·R/P)"}}}};
    json notes = json::array();
    if (!timed) notes.push_back("no cost model given: time-based fields are null");
    if (truncated) notes.push_back("stopped by --steps before every request finished");
    const json summary = {{"program", "fd-sim"},
                          {"config", config},
                          {"provenance", fd::collect_provenance(fd::join_args(argc, argv))},
                          {"results", results},
                          {"notes", notes}};
    fd::write_json_file((fs::path(out) / "summary.json").string(), summary);
    std::printf("fd-sim %s: %lld steps, max total context %lld, steady mean %.1f", mode_s.c_str(), (long long)recorded,
                (long long)max_ctx, n_steady ? sum_steady / double(n_steady) : 0.0);
    if (timed) std::printf(", %.1f tokens/s, peak step %.2f ms", duration > 0 ? double(output_tokens) / duration : 0.0, peak_ms);
    // The window's rule (since issue 13 the same as fd-bench's: an all-at-once run of one wave now has a
    // window, after the admission and before the first finish, where it used to fall back to the whole run).
    std::printf("\nsteady window: steps %lld..%lld (%lld), %s\nout: %s\n", (long long)win.first_step,
                (long long)win.last_step, (long long)n_steady, win.rule.c_str(), out.c_str());
    return 0;
  });
}
