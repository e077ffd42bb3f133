#include "harness/bench/bench_main.h"

#include <cstring>

#include "harness/provenance.h"

namespace fd::bench {

double seconds_per_iteration(const benchmark::State& st, double total_seconds) {
  return st.iterations() > 0 ? total_seconds / double(st.iterations()) : 0.0;
}

namespace {
std::vector<std::string> g_failures;  // "name: message" of every benchmark that failed()
}  // namespace

void fail(benchmark::State& st, const std::string& name, const std::string& message) {
  st.SkipWithError(message.c_str());
  g_failures.push_back(name + ": " + message);
}

void run_guarded(benchmark::State& st, const std::string& name, const std::function<void()>& body) {
  try {
    body();
  } catch (const std::exception& e) {
    fail(st, name, e.what());
  }
}

int bench_main(int argc, char** argv, CLI::App& app, const std::function<void()>& register_all,
               const std::function<void()>& after_all) {
  // --json FILE (or --json=FILE) -> Google Benchmark's JSON output file.
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    std::string file;
    if (args[i] == "--json" && i + 1 < args.size()) {
      file = args[i + 1];
      args.erase(args.begin() + long(i) + 1);
    } else if (args[i].rfind("--json=", 0) == 0) {
      file = args[i].substr(7);
    } else {
      continue;
    }
    args[i] = "--benchmark_out=" + file;
    args.insert(args.begin() + long(i) + 1, "--benchmark_out_format=json");
    ++i;
  }
  const std::string command = join_args(argc, argv);
  std::vector<char*> av;
  for (auto& a : args) av.push_back(a.data());
  int ac = int(av.size());
  // --help is the program's (CLI11's, with the Google Benchmark flags in its footer): Google Benchmark
  // would print only its own flags and exit.
  bool help = false;
  for (int i = 1; i < ac; ++i) help |= std::strcmp(av[size_t(i)], "--help") == 0 || std::strcmp(av[size_t(i)], "-h") == 0;
  if (!help) benchmark::Initialize(&ac, av.data());  // takes the --benchmark_* flags out of av
  app.footer(
      "Google Benchmark's flags apply too (--benchmark_filter=REGEX, --benchmark_repetitions=N, "
      "--benchmark_min_time=S where the program sets no time of its own, --benchmark_out=FILE, --benchmark_out_format=json|csv|console, ...). "
      "--json FILE = --benchmark_out=FILE --benchmark_out_format=json.");
  return guarded_main(app, ac, av.data(), [&]() {
    const json prov = collect_provenance(command);
    for (const auto& [k, v] : prov.items()) benchmark::AddCustomContext("fd_" + k, v.is_string() ? v.get<std::string>() : v.dump());
#ifndef NDEBUG
    benchmark::AddCustomContext("fd_build", "DEBUG: FastDecode itself is built without optimisation, timings are not its own");
#else
    // Google Benchmark warns "Library was built as DEBUG" when its own library was (Debian's libbenchmark package is):
    // that is about the library's code, not the kernels measured here.
    benchmark::AddCustomContext("fd_build", "Release (a 'Library was built as DEBUG' warning below is about the Google "
                                            "Benchmark library as packaged, not about the code measured)");
#endif
    register_all();
    const size_t ran = benchmark::RunSpecifiedBenchmarks();
    if (after_all) after_all();
    benchmark::Shutdown();
    if (ran == 0) FD_THROW("no benchmark to run (all skipped, or none matched --benchmark_filter)");
    if (!g_failures.empty()) {
      std::string all;
      for (const auto& f : g_failures) all += (all.empty() ? "" : "\n  ") + f;
      FD_THROW(g_failures.size() << " benchmark(s) failed:\n  " << all);
    }
    return 0;
  });
}

}  // namespace fd::bench
