// The micro-benchmarks' main, on Google Benchmark. A program registers its benchmarks (and the same-run
// ceiling beside each kernel) from its own options; this main runs them with the --benchmark_* flags,
// puts the provenance (git commit, host, CPU, cores, GPUs, date, command) into the JSON's "context" as
// fd_* keys, and takes --json FILE as --benchmark_out=FILE --benchmark_out_format=json, the file that
// goes to artifacts/.
#pragma once
#include <benchmark/benchmark.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fastdecode/core/cli_main.h"

namespace fd::bench {

// Runs `app` (the program's options) and then the benchmarks `register_all` registers; `after_all` (if
// given) runs after the last benchmark, e.g. to stop processes a benchmark left running for the next
// one. Exit codes as guarded_main: 0, 1 (error, including any benchmark that failed()), 2 (usage).
int bench_main(int argc, char** argv, CLI::App& app, const std::function<void()>& register_all,
               const std::function<void()>& after_all = {});

// Marks the running benchmark failed: Google Benchmark's SkipWithError (its JSON row gets error_occurred
// and error_message, the other benchmarks still run) and bench_main exits 1 afterwards with `name:
// message` on stderr. The caller returns from the benchmark without touching `st` again.
void fail(benchmark::State& st, const std::string& name, const std::string& message);
// Runs `body`; an exception it throws becomes fail(st, name, what()). A benchmark must not throw through
// Google Benchmark: the run would end with the JSON file cut off.
void run_guarded(benchmark::State& st, const std::string& name, const std::function<void()>& body);

// Ceilings measured in this run, by case: a kernel benchmark registered after its case's ceiling reads
// the ceiling's seconds per iteration and reports ratio_to_ceiling = ceiling time / kernel time (bytes
// read in the same time by both: the kernel's share of the ceiling's bandwidth).
class Ceilings {
 public:
  void set(const std::string& key, double seconds) { s_[key] = seconds; }
  // 0 when the ceiling did not run (filtered out).
  double get(const std::string& key) const {
    const auto it = s_.find(key);
    return it == s_.end() ? 0.0 : it->second;
  }

 private:
  std::map<std::string, double> s_;
};

// Seconds per iteration of a finished benchmark loop that timed itself with SetIterationTime.
double seconds_per_iteration(const benchmark::State& st, double total_seconds);

}  // namespace fd::bench
