// fd-bench: runs experiment configs and writes a run folder (summary.json, steps.jsonl, trace.json,
// requests.jsonl); `workload` writes a config's requests as JSONL for drivers outside the harness.
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "fastdecode/sched/perf_model.h"
#include "fastdecode/sched/hybrid.h"
#include "fastdecode/core/cli_main.h"
#include "harness/engines.h"
#include "harness/experiment.h"
#include "harness/provenance.h"
#include "harness/profile.h"
#include "kernels/cpu/decode_attention.h"
#include "harness/runner.h"
#include "harness/sweep.h"

// fd-bench workload: the requests exactly as run_experiment makes them (make_requests + arrival_times),
// checked as `run` checks them, one JSON object per line.
static int write_workload(const fd::ExperimentConfig& e, const std::string& out) {
  const std::vector<fd::Request> requests = fd::make_requests(e.workload, e.model, e.sampling);
  const std::vector<double> arrivals = fd::arrival_times(e.workload);
  std::string text;
  for (size_t i = 0; i < requests.size(); ++i) {
    const fd::Request& r = requests[i];
    fd::validate_request(r, e.model);
    fd::json line = {{"id", r.id}, {"arrival_s", arrivals[i]}, {"prompt", r.prompt}, {"gen_len", r.max_new_tokens},
                     {"stop_at_eos", r.stop_at_eos}};
    if (r.sampling)
      line["sampling"] = {{"temperature", r.sampling->temperature}, {"top_k", r.sampling->top_k},
                          {"top_p", r.sampling->top_p}, {"seed", r.sampling->seed}};
    if (!r.forced.empty()) line["forced"] = r.forced;
    text += line.dump() + "\n";
  }
  if (out.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  std::ofstream f(out, std::ios::trunc);
  if (!f) throw fd::ConfigError(out + ": cannot open for writing");
  f << text;
  if (!f.flush()) FD_THROW(out << ": write failed");
  std::fprintf(stderr, "fd-bench: %s: wrote %zu requests to %s\n", e.name.c_str(), requests.size(), out.c_str());
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{"fd-bench: run FastDecode experiment configs (see docs/EXPERIMENTS.md)", "fd-bench"};
  app.require_subcommand(1);
  std::string config, out;
  bool quiet = false, check = false;
  CLI::App* run = app.add_subcommand("run", "Run one experiment config and write its run folder");
  run->add_option("config", config, "Experiment config (JSON)")->required();
  run->add_option("--out", out, "Run folder (default: <output.dir>/<name>/<UTC time>)");
  run->add_flag("--quiet", quiet, "No progress line");
  run->add_flag("--check", check, "Validate the config, print it with defaults filled in, and exit");
  std::vector<std::string> sets;
  run->add_option("--set", sets,
                  "KEY.PATH=VALUE: set a config key before validation, e.g. --set workload.requests=64 --set "
                  "engine.rworkers.kv_dtype=int8 (VALUE is parsed as JSON when it parses, else taken as a string; "
                  "missing objects are created; repeatable, applied in order, echoed in summary.json \"overrides\")")
      ->take_all()
      ->allow_extra_args(false);
  std::string slo;
  run->add_option("--slo", slo,
                  "latency limits of a good request, ms: e.g. ttft:2000,tpot:100[,e2e:MS] (= --set workload.slo=...; "
                  "summary.json results.slo: attainment and goodput, docs/EXPERIMENTS.md)");
  // plan: the paper's performance model on a measured profile (docs/SCHEDULING.md).
  std::string profile_path, model_path, kv_dtype = "fp16", plan_json;
  int64_t seq = 0, layers = 0;
  double latency_ms = 0, cpus_available = 0;
  CLI::App* plan = app.add_subcommand("plan", "Choose the batch B and the R-worker CPU count P from a profile (modelled)");
  plan->add_option("--profile", profile_path, "profile.json: T(B) table and R per KV dtype (needed but for "
                   "--hybrid-prior alone, which prints the hybrid line only)");
  plan->add_option("--model", model_path, "Model config (HF config.json); N = its layers")->required();
  plan->add_option("--seq", seq, "Generated sequence length S")->required()->check(CLI::PositiveNumber);
  plan->add_option("--layers", layers, "Override N (default: the model's full depth)")->check(CLI::PositiveNumber);
  plan->add_option("--latency-ms", latency_ms, "Latency bound L for a whole sequence: largest B with 2·N·S·T(B) <= L")
      ->check(CLI::PositiveNumber);
  plan->add_option("--cpus-available", cpus_available, "R-worker CPUs you have (default: as many as the plan needs)")
      ->check(CLI::PositiveNumber);
  plan->add_option("--kv-dtype", kv_dtype, "Which R of the profile to use")->capture_default_str();
  int64_t socket_cores = 0;
  std::string socket_name = "socket";
  plan->add_option("--socket-cores", socket_cores, "Cores per CPU socket (e.g. 64 for an AMD EPYC 7763): P is also "
                   "reported in sockets")->check(CLI::PositiveNumber);
  CLI::Option* socket_name_opt = plan->add_option("--socket-name", socket_name, "What a socket is, for the report "
                                                  "(needs --socket-cores)")->capture_default_str();
  plan->add_option("--json", plan_json, "Also write the plan as JSON here");
  int64_t plan_batch = 0;
  fd::GpuDatasheet sheet;
  double socket_gbps = 0;
  std::string validation_path = std::string(FD_SOURCE_DIR) + "/artifacts/paper/validation-service/validation.json";
  plan->add_option("--batch", plan_batch, "B: plan for this batch (instead of the latency bound or the knee of E(B))")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  plan->add_option("--gpu-hbm-gbps", sheet.hbm_gbps, "The GPU by its datasheet: HBM GB/s (with --gpu-tflops: T(B) as a "
                   "roofline instead of a profile's table)")->check(CLI::PositiveNumber);
  plan->add_option("--gpu-tflops", sheet.dense_tflops, "The GPU by its datasheet: dense fp16 TFLOP/s")->check(CLI::PositiveNumber);
  plan->add_option("--hbm-efficiency", sheet.hbm_efficiency, "The share of --gpu-hbm-gbps a layer's weights read at")
      ->capture_default_str()->check(CLI::Range(0.01, 1.0));
  plan->add_option("--gemm-efficiency", sheet.gemm_efficiency, "The share of --gpu-tflops the S-Part's GEMMs reach")
      ->capture_default_str()->check(CLI::Range(0.01, 1.0));
  plan->add_option("--socket-gbps", socket_gbps, "A CPU socket by its memory bandwidth (GB/s the R-workers read KV at): P "
                   "also in such sockets; without a profile's R, R is one socket's")->check(CLI::PositiveNumber);
  plan->add_option("--validation", validation_path, "The validation whose error band the plan quotes")->capture_default_str();
  // The hybrid line (fastdecode/sched/hybrid.h): needs the GPU's decode-attention KV read rate.
  double hy_gpu_gbps = 0, hy_gpu_mem_gb = 0, hy_cpu_mem_gb = 0, hy_context = 0;
  int64_t hy_batch = 0;
  std::string hy_prior;
  plan->add_option("--gpu-attn-gbps", hy_gpu_gbps, "Hybrid line: the GPU's decode attention, GB/s of fp16 KV read")
      ->check(CLI::PositiveNumber);
  plan->add_option("--hybrid-prior", hy_prior, "Hybrid line: every rate (T(n), GPU and R-worker attention, engaging) "
                   "from a hybrid run's summary.json (its engine_info.prior) instead of the profile and --gpu-attn-gbps");
  plan->add_option("--hybrid-batch", hy_batch, "Hybrid line: sequences wanted (default: the plan's B)")->check(CLI::PositiveNumber);
  plan->add_option("--gpu-mem-gb", hy_gpu_mem_gb, "Hybrid line: GPU memory (default: no cap)")->check(CLI::PositiveNumber);
  plan->add_option("--cpu-mem-gb", hy_cpu_mem_gb, "Hybrid line: R-worker KV memory in all (default: no cap)")
      ->check(CLI::PositiveNumber);
  plan->add_option("--context", hy_context, "Hybrid line: mean context per sequence (default S/2)")->check(CLI::PositiveNumber);
  // predict: one decode step of FastDecode from profiles alone (fastdecode/sched/perf_model.h, predict_step).
  std::string pr_profile, pr_service, pr_kv = "fp16", pr_json;
  double pr_batch = 0, pr_context = 0;
  int64_t pr_layers = 0;
  CLI::App* predict = app.add_subcommand(
      "predict", "MODELLED decode step of FastDecode from profiles alone: N·max(2·T(B/2), R-workers' layer time) + T(B/2) + head");
  predict->add_option("--profile", pr_profile, "profile.json of the GPU side (T(B), head_b)")->required();
  predict->add_option("--service", pr_service, "profile.json with r_service (fd-bench profile --service; default: --profile)");
  predict->add_option("--batch", pr_batch, "B: sequences decoding in the step")->required()->check(CLI::Range(1.0, 1e9));
  predict->add_option("--context", pr_context, "Mean context of a sequence, tokens")->required()->check(CLI::Range(1.0, 1e9));
  predict->add_option("--layers", pr_layers, "N: layers run")->required()->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  predict->add_option("--kv-dtype", pr_kv, "KV dtype of the R-workers")->capture_default_str();
  predict->add_option("--json", pr_json, "Also write the prediction as JSON here (- : stdout only the JSON)");
  // The GPU side of a comparison (issue 41's crossover): GPU-only from the same GPU profile.
  std::string pr_engine = "fastdecode", pr_model;
  double pr_attn_gbps = 0, pr_mem_gb = 0;
  int64_t pr_max_context = 0;
  predict->add_option("--engine", pr_engine, "fastdecode, or gpu-only: N·(T(n) + n·context·a) + head(n), n = min(B, the "
                      "slots --gpu-mem-gb holds at --max-context), a from --gpu-attn-gbps")
      ->capture_default_str()->check(CLI::IsMember({"fastdecode", "gpu-only"}));
  predict->add_option("--gpu-attn-gbps", pr_attn_gbps, "--engine gpu-only: the GPU's decode attention, GB/s of fp16 KV read")
      ->check(CLI::PositiveNumber);
  predict->add_option("--model", pr_model, "--engine gpu-only: model config (its KV bytes a token; slots at full depth)");
  predict->add_option("--gpu-mem-gb", pr_mem_gb, "--engine gpu-only: GPU memory, GB (as hardware.gpu.memory_gb)")
      ->check(CLI::PositiveNumber);
  predict->add_option("--max-context", pr_max_context, "--engine gpu-only: tokens a slot reserves (engine.max_context)")
      ->check(CLI::PositiveNumber);
  // profile: T(B) of the S-Part backend and R of the R-worker kernel on this machine.
  std::string prof_model, prof_out;
  fd::ProfileOptions po;
  CLI::App* profile = app.add_subcommand("profile", "Measure T(B) (S-Part) and R (R-worker kernel, per CPU) -> profile.json");
  profile->add_option("--backend", po.backend, "S-Part backend for T(B)")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  profile->add_option("--sm-count", po.sm_count, "T(B) with the CUDA S-Part on this many SMs (a green context, as "
                      "hardware.gpu.sm_count; --backend cuda only; 0: the whole GPU)")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  profile->add_option("--r-threads", po.r_threads, "CPUs measuring R together (R is per CPU; use the R-worker CPU count)")
      ->capture_default_str()->check(CLI::Range(1, 4096));
  profile->add_option("--model", prof_model, "Model config (HF config.json)")->required();
  profile->add_option("--batches", po.batches, "Batch sizes for T(B), increasing")->capture_default_str();
  profile->add_option("--kv-dtypes", po.kv_dtypes, "KV dtypes for R (fp16, int8, int4)")->capture_default_str();
  profile->add_option("--context", po.context, "Context per sequence for R (>= 32, one KV block)")->capture_default_str()->check(CLI::PositiveNumber);
  profile->add_option("--reps", po.reps, "Repetitions (median)")->capture_default_str()->check(CLI::PositiveNumber);
  profile->add_option("--out", prof_out, "profile.json to write")->required();
  profile->add_flag("--service", po.service,
                    "Also measure R as R-workers serve it (r_service: spawned fd-rworker processes, real ATTEND rounds "
                    "through the client, a grid of --service-batches x --contexts; docs/SCHEDULING.md)");
  profile->add_option("--rworkers", po.svc.workers, "--service: R-workers spawned")->capture_default_str()->check(CLI::Range(1, 4096));
  profile->add_option("--rworker-threads", po.svc.threads, "--service: compute threads each")->capture_default_str()
      ->check(CLI::Range(1, 4096));
  profile->add_flag("!--no-pin", po.svc.pin, "--service: do not pin the workers to disjoint cores (pinned by default, as "
                    "the engine pins hardware.rworkers)");
  profile->add_option("--first-cpu", po.svc.first_cpu, "--service: the first core pinned")->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  profile->add_option("--service-batches", po.svc.batches, "--service: sequences over all workers")->capture_default_str();
  profile->add_option("--contexts", po.svc.contexts, "--service: prompt tokens a sequence")->capture_default_str();
  profile->add_option("--service-layers", po.svc.layers, "--service: layers each sequence holds (the runs' depth)")
      ->capture_default_str()->check(CLI::Range(1, 1024));
  profile->add_flag("!--no-shm", po.svc.shm, "--service: ZeroMQ only (no shared-memory lane)");
  profile->add_option("--rworker-binary", po.svc.binary,
                      "--service: the fd-rworker program to spawn (default: the one beside fd-bench; e.g. another build's, "
                      "to compare two workers with the same profiler)")->check(CLI::ExistingFile);
  // workload: the requests `run` would make, as JSONL, for drivers outside the harness (baselines/hf).
  std::string wl_config, wl_out;
  std::vector<std::string> wl_sets;
  CLI::App* workload = app.add_subcommand(
      "workload",
      "Write the requests `run` would make for a config as JSONL, one line each: {\"id\", \"arrival_s\", \"prompt\", "
      "\"gen_len\", \"stop_at_eos\", \"sampling\" (only when the request has its own), \"forced\" (only when "
      "teacher-forced)}, in id order");
  workload->add_option("config", wl_config, "Experiment config (JSON)")->required();
  workload->add_option("--set", wl_sets, "KEY.PATH=VALUE: as `fd-bench run --set` (repeatable, applied in order)")
      ->take_all()
      ->allow_extra_args(false);
  workload->add_option("-o,--out", wl_out, "JSONL file to write (default: stdout)");
  // sweep: a base config at every point of a grid of --set overrides, repeated (docs/EXPERIMENTS.md, "Sweeps").
  std::string sw_spec;
  fd::SweepOptions sw;
  CLI::App* sweep = app.add_subcommand("sweep", "Run a sweep spec: every point x repeat into OUT/<point>/rep<k>/, with OUT/index.json");
  sweep->add_option("spec", sw_spec, "Sweep spec (JSON)")->required();
  sweep->add_option("--out", sw.out_dir, "Sweep folder (resumable: runs that have a summary.json are skipped)")->required();
  sweep->add_option("--set", sw.sets, "KEY.PATH=VALUE: as `fd-bench run --set`, applied to every point after its own")
      ->take_all()
      ->allow_extra_args(false);
  sweep->add_flag("--dry-run", sw.dry_run, "Validate every point, print the points and the run count; run and write nothing");
  sweep->add_flag("--quiet", sw.quiet, "No progress on stderr");
  sweep->add_flag("--fail-fast", sw.fail_fast, "Stop at the first failed run");
  sweep->add_flag("--quick", sw.quick, "Run the spec's \"quick\" variant (its \"set\", fewer values)");
  sweep->add_option("--only", sw.only,
                    "AXIS=VALUE[,VALUE...]: run only these values of an axis (labels as in folder names; repeatable)")
      ->take_all()
      ->allow_extra_args(false);
  sweep->add_option("--repeats", sw.repeats, "Repeats of each point instead of the spec's")->check(CLI::Range(1, 1000000));
  return fd::guarded_main(app, argc, argv, [&]() {
    if (*workload) return write_workload(fd::load_experiment(wl_config, wl_sets), wl_out);
    if (*sweep) {
      sw.command_line = fd::join_args(argc, argv);
      return fd::run_sweep(fd::load_sweep_spec(sw_spec), sw);
    }
    if (*predict) {
      const fd::Profile gpu = fd::load_profile(pr_profile);
      fd::StepPrediction p;
      fd::json j;
      if (pr_engine == "gpu-only") {
        if (pr_attn_gbps <= 0 || pr_model.empty() || pr_mem_gb <= 0 || pr_max_context <= 0)
          throw fd::ConfigError("--engine gpu-only needs --gpu-attn-gbps, --model, --gpu-mem-gb and --max-context");
        if (!pr_service.empty() || pr_kv != "fp16")
          throw fd::ConfigError("--engine gpu-only: --service and --kv-dtype are FastDecode's (GPU-only keeps fp16 KV)");
        const fd::ModelConfig m = fd::load_model_config(pr_model);
        const int64_t slots = fd::gpu_only_capacity(m, pr_mem_gb * 1e9, pr_max_context);
        if (slots < 1) throw fd::ConfigError("--engine gpu-only: " + std::to_string(pr_mem_gb) + " GB holds no sequence");
        const double n = std::min(pr_batch, double(slots));
        const double kv_layer = double(m.kv_bytes_per_token(2, true)) / double(m.full_num_layers);
        p = fd::predict_gpu_only_step(gpu, kv_layer / (pr_attn_gbps * 1e9), n, pr_context, pr_layers);
        j = fd::to_json(p);
        j["batch"] = n;
        j["inputs"] = {{"engine", pr_engine}, {"profile", pr_profile}, {"batch", pr_batch}, {"slots", slots},
                       {"context", pr_context}, {"layers", pr_layers}, {"gpu_attn_gbps", pr_attn_gbps},
                       {"gpu_mem_gb", pr_mem_gb}, {"max_context", pr_max_context}, {"model", pr_model}};
      } else {
        const fd::Profile svc = pr_service.empty() ? gpu : fd::load_profile(pr_service);
        p = fd::predict_step(gpu, svc, pr_kv, pr_batch, pr_context, pr_layers);
        j = fd::to_json(p);
        j["batch"] = pr_batch;
        j["inputs"] = {{"engine", pr_engine}, {"profile", pr_profile}, {"service", pr_service.empty() ? pr_profile : pr_service},
                       {"batch", pr_batch}, {"context", pr_context}, {"layers", pr_layers}, {"kv_dtype", pr_kv},
                       {"workers", svc.service.workers}, {"threads", svc.service.threads}};
      }
      j["modelled"] = true;
      if (pr_json == "-") {
        std::printf("%s\n", j.dump().c_str());
        return 0;
      }
      if (pr_engine == "gpu-only")
        std::printf("MODELLED gpu-only: %.0f sequences; step %.3f ms = %lld x (S %.3f + attention %.3f ms) + head %.3f ms; %.0f tokens/s\n",
                    j["batch"].get<double>(), 1e3 * p.step_s, (long long)pr_layers, 1e3 * p.s_layer_s, 1e3 * p.r_layer_s,
                    1e3 * p.head_s, p.tokens_per_s);
      else
        std::printf("MODELLED: step %.3f ms = %lld x max(S %.3f, R %.3f ms) + fill %.3f + head %.3f ms; %.0f tokens/s; %s binds%s\n",
                    1e3 * p.step_s, (long long)pr_layers, 1e3 * p.s_layer_s, 1e3 * p.r_layer_s, 1e3 * p.fill_s, 1e3 * p.head_s,
                    p.tokens_per_s, p.binds.c_str(), p.outside_grid ? " (B or context outside the service grid: R held at its edge)" : "");
      if (!pr_json.empty()) fd::write_json_file(pr_json, j);
      return 0;
    }
    if (*profile) {
      po.command_line = fd::join_args(argc, argv);
      po.svc.kv_dtypes = po.kv_dtypes;
      po.svc.reps = po.reps;
      const fd::json prof = fd::measure_profile(fd::load_model_config(prof_model), po);
      fd::write_json_file(prof_out, prof);
      std::printf("%s\nwrote %s\n", prof.dump(1).c_str(), prof_out.c_str());
      return 0;
    }
    if (*plan) {
      if (socket_name_opt->count() > 0 && socket_cores == 0)
        throw fd::ConfigError("--socket-name '" + socket_name + "' needs --socket-cores (cores per socket)");
      const bool datasheet = sheet.hbm_gbps > 0 || sheet.dense_tflops > 0;
      if (datasheet && !(sheet.hbm_gbps > 0 && sheet.dense_tflops > 0))
        throw fd::ConfigError("the GPU by its datasheet needs both --gpu-hbm-gbps and --gpu-tflops");
      if (datasheet && !hy_prior.empty())
        throw fd::ConfigError("--hybrid-prior brings its own GPU rates: give it without --gpu-hbm-gbps / --gpu-tflops");
      if (profile_path.empty() && hy_prior.empty() && !datasheet)
        throw fd::ConfigError("plan needs --profile (the paper's plan), the GPU by its datasheet (--gpu-hbm-gbps, --gpu-tflops) "
                              "or --hybrid-prior (the hybrid line alone)");
      if (profile_path.empty() && datasheet && socket_gbps <= 0)
        throw fd::ConfigError("with the GPU by its datasheet and no --profile, give the CPU by its memory bandwidth: --socket-gbps");
      if (profile_path.empty() && !datasheet && hy_batch == 0)
        throw fd::ConfigError("--hybrid-prior without --profile needs --hybrid-batch (no plan B to default to)");
      const fd::ModelConfig m = fd::load_model_config(model_path);
      const int64_t n_layers = layers > 0 ? layers : m.full_num_layers;
      fd::HybridModelInput prior_in;  // read before anything is printed: a bad file fails cleanly
      if (!hy_prior.empty()) prior_in = fd::hybrid_model_input(fd::hybrid_rates_from_json(fd::read_json_file(hy_prior), hy_prior));
      // The hybrid line (fastdecode/sched/hybrid.h): B sequences of mean context c, each reserving S tokens;
      // fixed per-step terms (LM head, sampling) not counted. `prof`/`r_per_cpu`: the paper plan's, if any.
      const auto hybrid_line = [&](const fd::Profile* prof, double r_all_cpus, int64_t plan_batch) -> fd::json {
        if (hy_gpu_gbps <= 0 && hy_prior.empty()) {
          std::printf("  hybrid: not modelled (give --gpu-attn-gbps, the GPU's decode-attention KV read rate, or --hybrid-prior)\n");
          return nullptr;
        }
        const double kv_layer = double(m.kv_bytes_per_token(2, true)) / double(m.full_num_layers);
        fd::HybridModelInput hi;
        if (!hy_prior.empty()) {
          hi = prior_in;
        } else {
          hi.t = prof->t;
          hi.gpu_s_per_token = kv_layer / (hy_gpu_gbps * 1e9);
          hi.cpu_s_per_token = r_all_cpus;
        }
        hi.layers = n_layers;
        hi.batch = hy_batch > 0 ? hy_batch : plan_batch;
        hi.context = hy_context > 0 ? hy_context : double(seq) / 2;
        hi.reserve_tokens = std::max(double(seq), hi.context);
        const double kv_token = kv_layer * double(m.full_num_layers);  // memory at full depth, as the engines count it
        if (hy_gpu_mem_gb > 0)
          hi.gpu_capacity_tokens = std::max(0.0, hy_gpu_mem_gb * 1e9 - double(fd::with_layers(m, m.full_num_layers).num_params()) * 2 -
                                                     double(1ull << 30)) / kv_token;
        if (hy_cpu_mem_gb > 0) hi.cpu_capacity_tokens = hy_cpu_mem_gb * 1e9 / kv_token;
        const fd::HybridPlan hp = fd::model_hybrid(hi);
        std::printf("  %s\n", fd::format_hybrid_line(hp).c_str());
        fd::json j = fd::to_json(hp);
        j["inputs"] = {{"prior", hy_prior.empty() ? fd::json(nullptr) : fd::json(hy_prior)},
                       {"gpu_attn_gbps", hy_gpu_gbps}, {"batch", hi.batch}, {"context", hi.context},
                       {"reserve_tokens", hi.reserve_tokens}, {"gpu_mem_gb", hy_gpu_mem_gb},
                       {"cpu_mem_gb", hy_cpu_mem_gb}, {"layers", hi.layers},
                       {"rates", {{"gpu_s_per_token", hi.gpu_s_per_token}, {"gpu_s_per_seq", hi.gpu_s_per_seq},
                                  {"cpu_s_per_token", hi.cpu_s_per_token}, {"cpu_s_per_seq", hi.cpu_s_per_seq},
                                  {"cpu_s_per_call", hi.cpu_s_per_call}, {"engage_s", hi.engage_s}}}};
        return j;
      };
      if (profile_path.empty() && !datasheet) {  // the hybrid line alone, every rate from the run's prior
        std::printf("MODELLED from %s (model %s, N = %lld layers, S = %lld):\n", hy_prior.c_str(), m.name.c_str(),
                    (long long)n_layers, (long long)seq);
        const fd::json hj = hybrid_line(nullptr, 0, 0);
        if (!plan_json.empty()) fd::write_json_file(plan_json, {{"modelled", true}, {"hybrid", hj}});
        return 0;
      }
      fd::Profile prof;
      if (!profile_path.empty()) prof = fd::load_profile(profile_path);
      // The KV bytes a context token costs at one layer in the R-workers' dtype (K and V, scales included).
      const fd::KVDType kvd = fd::kv_dtype_from_name(kv_dtype);
      const double kv_token_layer =
          double(fd::kv_block_bytes(kvd, int(m.num_kv_heads), int(m.head_dim))) / double(fd::kKVBlockTokens);
      const double r_socket = socket_gbps > 0 ? fd::r_socket_s(kv_token_layer, socket_gbps) : 0;
      fd::PlanInput in;
      const bool in_sockets = profile_path.empty();  // no profile's R: the CPU is counted in sockets
      if (!in_sockets) {
        auto r = prof.r_s_per_token_layer.find(kv_dtype);
        if (r == prof.r_s_per_token_layer.end())
          throw fd::ConfigError(profile_path + ": r_s_per_token_layer has no entry for kv dtype '" + kv_dtype + "'");
        in.r_s_per_token_layer = r->second;
        in.r_socket = r_socket;
      } else {
        in.r_s_per_token_layer = r_socket;
      }
      const double layer_params = double(fd::with_layers(m, 2).num_params() - fd::with_layers(m, 1).num_params());
      in.t = datasheet ? fd::datasheet_t_table(sheet, layer_params, double(std::max<int64_t>(plan_batch, 4096))) : prof.t;
      if (plan_batch > 0) in.batch = plan_batch;
      in.layers = n_layers;
      in.seq = seq;
      if (latency_ms > 0) in.latency_s = latency_ms / 1e3;
      if (cpus_available > 0) in.cpus_available = cpus_available;
      in.socket_cores = socket_cores;
      in.socket_name = socket_name;
      const fd::Plan p = fd::make_plan(in);
      fd::json hybrid_plan = nullptr;
      const std::string gpu_text =
          datasheet ? "a GPU of " + fd::format_count(sheet.hbm_gbps) + " GB/s HBM (x " + fd::format_count(sheet.hbm_efficiency) +
                          ") and " + fd::format_count(sheet.dense_tflops) + " dense TFLOP/s (x " +
                          fd::format_count(sheet.gemm_efficiency) + "), T(B) = max(2·W/HBM, 2·p·B/FLOP/s) a layer"
                    : profile_path;
      const std::string cpu_text = in_sockets ? "sockets reading KV at " + fd::format_count(socket_gbps) + " GB/s"
                                              : profile_path + (socket_gbps > 0 ? ", and sockets of " + fd::format_count(socket_gbps) + " GB/s" : "");
      std::printf("MODELLED from %s; CPU: %s (model %s, N = %lld layers, S = %lld, R[%s] = %.3g s/token/layer per %s):\n",
                  gpu_text.c_str(), cpu_text.c_str(), m.name.c_str(), (long long)in.layers, (long long)seq, kv_dtype.c_str(),
                  in.r_s_per_token_layer, in_sockets ? "socket" : "CPU");
      if (p.batch == 0) {
        std::printf("  no B in the profile's range [%g, %g] meets 2·N·S·T(B) <= %.1f ms\n", in.t.b_first(), in.t.b_last(), latency_ms);
      } else {
        std::printf("  B = %lld (%s rule); T(B) = %.3f ms per layer; E(B) = %.0f /s (max %.0f)\n", (long long)p.batch,
                    p.batch_rule.c_str(), p.t_b_s * 1e3, p.e_b, p.e_max);
        std::printf("  sequence latency 2·N·S·T(B) = %s s\n", fd::format_count(p.seq_latency_s).c_str());
        if (in_sockets)
          std::printf("  sockets needed P = B·S·R/(2·T(B)) = %s (each reading KV at %s GB/s); using %s\n",
                      fd::format_count(p.cpus_needed).c_str(), fd::format_count(socket_gbps).c_str(), fd::format_count(p.cpus_used).c_str());
        else
          std::printf("  %s\n", fd::format_cpus_line(p).c_str());
        if (p.sockets_by_bandwidth > 0)
          std::printf("  in sockets judged by memory bandwidth (%s GB/s each): %s sockets\n", fd::format_count(socket_gbps).c_str(),
                      fd::format_count(p.sockets_by_bandwidth).c_str());
        std::printf("  tokens/s: S-bound %.0f, R-bound %.0f -> %.0f (%s binds); step %.3f ms\n", p.tokens_per_s_s_bound,
                    p.tokens_per_s_r_bound, p.tokens_per_s, p.binds.c_str(), 1e3 * double(p.batch) / p.tokens_per_s);
        // The error band: how far the model's predictions of measured runs were off (analysis/model_validation.py).
        try {
          const fd::json v = fd::read_json_file(validation_path).at("summary");
          const std::string repo = std::string(FD_SOURCE_DIR) + "/";
          const std::string shown = validation_path.rfind(repo, 0) == 0 ? validation_path.substr(repo.size()) : validation_path;
          std::printf("  error band: FastDecode runs predicted from profiles of their own machine were off by a median %.1f %%, "
                      "at most %.1f %% (%d runs: %s)%s\n",
                      100 * v.at("median_abs_err").get<double>(), 100 * v.at("max_abs_err").get<double>(), v.at("runs").get<int>(),
                      shown.c_str(), datasheet ? "; a datasheet roofline is what a GPU could reach, an upper bound" : "");
        } catch (const std::exception&) {
          std::printf("  error band: no validation at %s (analysis/model_validation.py writes it)\n", validation_path.c_str());
        }
        hybrid_plan = profile_path.empty() ? fd::json(nullptr) : hybrid_line(&prof, in.r_s_per_token_layer / p.cpus_used, p.batch);
      }
      if (!plan_json.empty()) {
        fd::json j = fd::to_json(p);
        j["modelled"] = true;
        j["inputs"] = {{"profile", profile_path}, {"model", m.name}, {"layers", in.layers}, {"seq", seq},
                       {"kv_dtype", kv_dtype}, {"r_s_per_token_layer", in.r_s_per_token_layer},
                       {"latency_ms", latency_ms}, {"cpus_available", cpus_available}, {"batch", plan_batch},
                       {"cpu_unit", in_sockets ? "sockets" : "cores"}, {"socket_gbps", socket_gbps},
                       {"gpu_datasheet", datasheet ? fd::json{{"hbm_gbps", sheet.hbm_gbps}, {"dense_tflops", sheet.dense_tflops},
                                                               {"hbm_efficiency", sheet.hbm_efficiency},
                                                               {"gemm_efficiency", sheet.gemm_efficiency}}
                                                   : fd::json(nullptr)}};
        j["step_s"] = p.batch > 0 ? double(p.batch) / p.tokens_per_s : 0.0;
        j["hybrid"] = hybrid_plan;
        fd::write_json_file(plan_json, j);
      }
      return 0;
    }
    if (!slo.empty()) {  // --slo ttft:MS,tpot:MS,e2e:MS -> --set workload.slo={...}, after the other overrides
      const fd::SloLimits l = fd::parse_slo_flag(slo);
      fd::json lim = fd::json::object();
      if (l.ttft_ms) lim["ttft_ms"] = *l.ttft_ms;
      if (l.tpot_ms) lim["tpot_ms"] = *l.tpot_ms;
      if (l.e2e_ms) lim["e2e_ms"] = *l.e2e_ms;
      sets.push_back("workload.slo=" + lim.dump());
    }
    const fd::ExperimentConfig e = fd::load_experiment(config, sets);
    if (check) {
      std::printf("%s\n", e.resolved().dump(2).c_str());
      return 0;
    }
    if (out.empty())
      out = (std::filesystem::path(e.output_dir) / e.name / fd::utc_timestamp("%Y%m%d-%H%M%S")).string();
    std::fprintf(stderr, "fd-bench: %s: model %s (%lld of %lld layers), engine %s, %lld requests -> %s\n",
                 e.name.c_str(), e.model.name.c_str(), (long long)e.model.num_layers,
                 (long long)e.model.full_num_layers, e.engine.type.c_str(), (long long)e.workload.requests,
                 out.c_str());
    fd::RunOptions opt;
    opt.out_dir = out;
    opt.command_line = fd::join_args(argc, argv);
    opt.progress = !quiet;
    const fd::json s = fd::run_experiment(e, opt);
    const fd::json& r = s["results"];
    std::printf("%s: %lld output tokens in %.2f s = %.1f tokens/s; step p50 %.2f ms, p99 %.2f ms; "
                "TTFT p50 %.1f ms; TPOT p50 %.2f ms; decode-only p99 %.2f ms, steady %.1f tokens/s\nrun folder: %s\n",
                e.name.c_str(), (long long)r["output_tokens"].get<int64_t>(), r["duration_s"].get<double>(),
                r["output_throughput"].get<double>(), r["step_ms"]["p50"].get<double>(),
                r["step_ms"]["p99"].get<double>(), r["ttft_ms"]["p50"].get<double>(),
                r["tpot_ms"]["p50"].get<double>(), r["decode_only"]["step_ms"]["p99"].get<double>(),
                r["steady"]["tokens_per_s"].get<double>(), out.c_str());
    if (!r["step_breakdown_ms_mean"].empty()) {
      std::printf("step breakdown (mean ms per step):");
      for (const auto& [k, v] : r["step_breakdown_ms_mean"].items()) std::printf(" %s %.2f", k.c_str(), v.get<double>());
      std::printf("\n");
    }
    for (const auto& n : s["notes"]) std::printf("note: %s\n", n.get<std::string>().c_str());
    return 0;
  });
}
