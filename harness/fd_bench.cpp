// fd-bench: runs experiment configs and writes a run folder (summary.json, steps.jsonl, trace.json,
// requests.jsonl).
#include <cstdio>
#include <filesystem>

#include "harness/cli_main.h"
#include "harness/experiment.h"
#include "harness/provenance.h"
#include "harness/runner.h"

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
  return fd::guarded_main(app, argc, argv, [&]() {
    const fd::ExperimentConfig e = fd::load_experiment(config);
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
                "TTFT p50 %.1f ms; TPOT p50 %.2f ms\nrun folder: %s\n",
                e.name.c_str(), (long long)r["output_tokens"].get<int64_t>(), r["duration_s"].get<double>(),
                r["output_throughput"].get<double>(), r["step_ms"]["p50"].get<double>(),
                r["step_ms"]["p99"].get<double>(), r["ttft_ms"]["p50"].get<double>(),
                r["tpot_ms"]["p50"].get<double>(), out.c_str());
    if (!r["step_breakdown_ms_mean"].empty()) {
      std::printf("step breakdown (mean ms per step):");
      for (const auto& [k, v] : r["step_breakdown_ms_mean"].items()) std::printf(" %s %.2f", k.c_str(), v.get<double>());
      std::printf("\n");
    }
    for (const auto& n : s["notes"]) std::printf("note: %s\n", n.get<std::string>().c_str());
    return 0;
  });
}
