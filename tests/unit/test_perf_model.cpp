// The performance model (fastdecode/sched/perf_model.h) against hand-computed cases.
//
// Table used throughout: T(B) per layer = 1 ms for B <= 64, then linear to 1.6 ms at 128 and 3.2 ms at
// 256. On [128, 256] T(B) = B/80 ms, so E(B) = B/T(B) = 80 per ms (80000/s) is the maximum.
#include "fastdecode/sched/perf_model.h"

#include <fstream>

#include "harness/profile.h"
#include "test_helpers.h"

using namespace fd;
using fd::test::error_message;
using fd::test::TempDir;
using ::testing::HasSubstr;

namespace {
TTable table() { return TTable({{1, 1e-3}, {64, 1e-3}, {128, 1.6e-3}, {256, 3.2e-3}}); }
}  // namespace

TEST(PerfModel, TableInterpolation) {
  const TTable t = table();
  EXPECT_DOUBLE_EQ(t.at(0.5), 1e-3);     // below the first point: its value (weight-read floor)
  EXPECT_DOUBLE_EQ(t.at(64), 1e-3);
  EXPECT_DOUBLE_EQ(t.at(96), 1.3e-3);    // 1 + 0.6·32/64 ms
  EXPECT_DOUBLE_EQ(t.at(160), 2.0e-3);   // 160/80 ms
  EXPECT_DOUBLE_EQ(t.at(512), 6.4e-3);   // extrapolated along the last segment: 512/80 ms
  EXPECT_DOUBLE_EQ(TTable({{10, 2.0}}).at(20), 4.0);  // one point: proportional above it
  EXPECT_THAT(error_message<ConfigError>([] { TTable({{64, 1.0}, {64, 2.0}}); }), HasSubstr("strictly increasing"));
  EXPECT_THAT(error_message<ConfigError>([] { TTable({{64, 0.0}}); }), HasSubstr("> 0"));
  EXPECT_THROW(TTable(std::vector<std::pair<double, double>>{}), ConfigError);
}

// Knee: smallest B with E(B) >= 0.9·max E = 72/ms. On [64, 128] T = 1 + 0.6(B-64)/64 ms, so
// B/T >= 72 <=> 0.325·B >= 28.8 <=> B >= 88.6: B = 89 (E(89) = 72.10, E(88) = 71.84).
TEST(PerfModel, KneeOfThroughput) {
  const TTable t = table();
  EXPECT_NEAR(e_of_b(t, 89), 89 / 1.234375e-3, 1e-6);
  EXPECT_EQ(knee_batch(t, 0.9), 89);
  EXPECT_EQ(knee_batch(t, 1.0), 128);  // first B at the maximum
  EXPECT_EQ(knee_batch(t, 0.5), 40);   // E = B/1ms >= 40/ms
}

// Latency: 2·N·S·T(B) <= L with N = 32, S = 1024: T(B) <= L/65536. L = 65536 · 2.01 ms -> T <= 2.01 ms
// -> B/80 <= 2.01 -> B = 160. Then P = B·S·R/(2T) = 160·1024·1e-7/(2·0.002) = 4.096; S-bound
// B/(N·T) = 160/(32·0.002) = 2500 tokens/s; R-bound with P CPUs 2P/(N·S·R) = 2P/0.0032768.
TEST(PerfModel, PlanUnderLatencyBound) {
  PlanInput in;
  in.t = table();
  in.r_s_per_token_layer = 1e-7;
  in.layers = 32;
  in.seq = 1024;
  in.latency_s = 65536 * 2.01e-3;
  EXPECT_EQ(latency_batch(in.t, 32, 1024, *in.latency_s), 160);
  EXPECT_EQ(latency_batch(in.t, 32, 1024, 65536 * 2.0e-3), 160);  // met exactly
  EXPECT_EQ(latency_batch(in.t, 32, 1024, 65536 * 0.9e-3), 0);    // nothing meets it
  EXPECT_DOUBLE_EQ(cpus_needed(160, 1024, 1e-7, 2e-3), 4.096);
  EXPECT_DOUBLE_EQ(tokens_per_s_s_bound(160, 32, 2e-3), 2500);
  EXPECT_DOUBLE_EQ(tokens_per_s_r_bound(4, 32, 1024, 1e-7), 2441.40625);

  in.cpus_available = 4;  // fewer than needed: R binds
  Plan p = make_plan(in);
  EXPECT_EQ(p.batch, 160);
  EXPECT_EQ(p.batch_rule, "latency");
  EXPECT_DOUBLE_EQ(p.t_b_s, 2e-3);
  EXPECT_DOUBLE_EQ(p.seq_latency_s, 65536 * 2e-3);
  EXPECT_DOUBLE_EQ(p.cpus_needed, 4.096);
  EXPECT_DOUBLE_EQ(p.tokens_per_s_s_bound, 2500);
  EXPECT_DOUBLE_EQ(p.tokens_per_s_r_bound, 2441.40625);
  EXPECT_DOUBLE_EQ(p.tokens_per_s, 2441.40625);
  EXPECT_EQ(p.binds, "R");
  in.cpus_available = 8;  // more than needed: S binds
  p = make_plan(in);
  EXPECT_DOUBLE_EQ(p.tokens_per_s_r_bound, 4882.8125);
  EXPECT_EQ(p.binds, "S");
  in.cpus_available.reset();  // default: ceil(4.096) = 5 CPUs -> R-bound 10/0.0032768 = 3051.7578125
  p = make_plan(in);
  EXPECT_DOUBLE_EQ(p.cpus_used, 5);
  EXPECT_DOUBLE_EQ(p.tokens_per_s_r_bound, 3051.7578125);
  EXPECT_EQ(p.binds, "S");
  // At exactly P = cpus_needed the two bounds meet (the balance the formula is built on).
  EXPECT_NEAR(tokens_per_s_r_bound(4.096, 32, 1024, 1e-7), 2500, 1e-9);
  in.latency_s = 1.0;
  EXPECT_EQ(make_plan(in).batch, 0);
}

TEST(PerfModel, PlanAtKneeWithoutLatency) {
  PlanInput in;
  in.t = table();
  in.r_s_per_token_layer = 1e-7;
  in.layers = 32;
  in.seq = 1024;
  const Plan p = make_plan(in);
  EXPECT_EQ(p.batch, 89);
  EXPECT_EQ(p.batch_rule, "knee");
  EXPECT_DOUBLE_EQ(p.e_max, 80000);
  EXPECT_DOUBLE_EQ(p.t_b_s, 1.234375e-3);
  // P = 89·1024·1e-7/(2·1.234375e-3) = 0.0091136/0.00246875 = 3.6916...
  EXPECT_NEAR(p.cpus_needed, 0.0091136 / 0.00246875, 1e-12);
  EXPECT_EQ(to_json(p)["batch"], 89);
}

TEST(PerfModel, ProfileJson) {
  const Profile p = parse_profile(json::parse(R"({"t_b": [[1, 0.001], [64, 0.001], [128, 0.0016]],
                                                  "r_s_per_token_layer": {"fp16": 1e-7, "int8": 5e-8}, "layers": 32})"),
                                  "p.json");
  EXPECT_EQ(p.layers, 32);
  EXPECT_DOUBLE_EQ(p.t.at(96), 1.3e-3);
  EXPECT_DOUBLE_EQ(p.r_s_per_token_layer.at("int8"), 5e-8);
  EXPECT_THAT(error_message<ConfigError>([] {
                parse_profile(json::parse(R"({"t_b": [[1, 0.001]], "r_s_per_token_layer": {"fp16": 1e-7}, "x": 1})"), "p.json");
              }),
              HasSubstr("p.json: x"));
  EXPECT_THAT(error_message<ConfigError>([] {
                parse_profile(json::parse(R"({"t_b": [[2, 0.001], [1, 0.002]], "r_s_per_token_layer": {"fp16": 1e-7}})"), "p.json");
              }),
              HasSubstr("p.json: t_b"));
  EXPECT_THAT(error_message<ConfigError>([] {
                parse_profile(json::parse(R"({"t_b": [[1, 0.001]], "r_s_per_token_layer": {"fp16": -1}})"), "p.json");
              }),
              HasSubstr("r_s_per_token_layer"));
}

// The P line never rounds P to 0 while using >= 1 CPU, and says why the count used differs.
TEST(PerfModel, CpusLineAndSockets) {
  EXPECT_EQ(format_count(0.0091136), "0.00911");
  EXPECT_EQ(format_count(3.6916), "3.69");
  EXPECT_EQ(format_count(0.04), "0.04");
  EXPECT_EQ(format_count(1.5e-5), "1.5e-05");
  EXPECT_EQ(format_count(123.4), "123");  // whole numbers from 100 up, not 1.23e+02
  EXPECT_EQ(format_count(4), "4");

  PlanInput in;
  in.t = table();
  in.r_s_per_token_layer = 1e-7;
  in.layers = 32;
  in.seq = 1024;
  in.socket_cores = 64;
  in.socket_name = "AMD EPYC 7763";
  // Knee plan: P = 3.6916... (PlanAtKneeWithoutLatency) = 0.05768 sockets of 64 cores; 4 CPUs used.
  Plan p = make_plan(in);
  EXPECT_DOUBLE_EQ(p.cpus_used, 4);
  EXPECT_EQ(p.cpus_used_reason, "rounded up to whole CPUs");
  EXPECT_DOUBLE_EQ(p.sockets_needed, p.cpus_needed / 64);
  EXPECT_EQ(format_cpus_line(p),
            "CPUs needed P = B·S·R/(2·T(B)) = 3.69 cores = 0.0577 sockets of AMD EPYC 7763 (64 cores each); using 4 "
            "(rounded up to whole CPUs)");
  json j = to_json(p);
  EXPECT_EQ(j["socket_cores"], 64);
  EXPECT_EQ(j["socket_name"], "AMD EPYC 7763");
  EXPECT_DOUBLE_EQ(j["sockets_needed"].get<double>(), p.cpus_needed / 64);
  EXPECT_DOUBLE_EQ(j["cpus_needed"].get<double>(), p.cpus_needed);
  EXPECT_EQ(j["cpus_used_reason"], "rounded up to whole CPUs");

  // R 1000x smaller: P = 0.0036916, which "%.1f" printed as 0.0; one R-worker CPU is the least.
  in.r_s_per_token_layer = 1e-10;
  in.socket_cores = 0;
  p = make_plan(in);
  EXPECT_DOUBLE_EQ(p.cpus_used, 1);
  EXPECT_EQ(format_cpus_line(p), "CPUs needed P = B·S·R/(2·T(B)) = 0.00369 cores; using 1 (at least one R-worker CPU)");
  j = to_json(p);
  EXPECT_TRUE(j["sockets_needed"].is_null() && j["socket_cores"].is_null() && j["socket_name"].is_null());

  in.cpus_available = 2;
  p = make_plan(in);
  EXPECT_EQ(format_cpus_line(p), "CPUs needed P = B·S·R/(2·T(B)) = 0.00369 cores; using 2 (--cpus-available)");

  Plan exact;  // P a whole number: nothing to explain
  exact.cpus_needed = exact.cpus_used = 12;
  EXPECT_EQ(format_cpus_line(exact), "CPUs needed P = B·S·R/(2·T(B)) = 12 cores; using 12");
}

// R's working set: >= 4 x LLC, >= 1 GiB, >= the old 256 MB x threads/4, capped at MemAvailable / 4.
TEST(PerfModel, RWorkingSetFromLLC) {
  const int64_t GiB = int64_t(1) << 30, big = int64_t(64) << 30;
  RWorkingSet w = r_working_set(300'000'000, 12, big);  // the GPU machine's 300 MB L3
  EXPECT_EQ(w.bytes, 1'200'000'000);
  EXPECT_TRUE(w.llc_known);
  EXPECT_FALSE(w.capped());
  w = r_working_set(32 << 20, 1, big);  // a 32 MiB L3: the 1 GiB floor
  EXPECT_EQ(w.bytes, GiB);
  w = r_working_set(0, 1, big);  // unreadable: 256 MB assumed, 4 x 256 MB < 1 GiB
  EXPECT_FALSE(w.llc_known);
  EXPECT_EQ(w.llc_bytes, 256'000'000);
  EXPECT_EQ(w.bytes, GiB);
  w = r_working_set(32 << 20, 64, big);  // many threads: 256 MB x 16
  EXPECT_EQ(w.bytes, 4'096'000'000);
  w = r_working_set(300'000'000, 12, 2'000'000'000);  // little free memory: a quarter of it
  EXPECT_EQ(w.bytes, 500'000'000);
  EXPECT_EQ(w.wanted, 1'200'000'000);
  EXPECT_TRUE(w.capped());
  w = r_working_set(2 * GiB, 1, 0);  // MemAvailable unreadable: at most 4 GiB
  EXPECT_EQ(w.bytes, 4 * GiB);
  EXPECT_TRUE(w.capped());
}

// The LLC is the highest level's size in sysfs (not the largest number, not the first entry).
TEST(PerfModel, ReadLLCFromSysfs) {
  TempDir d("llc");
  auto put = [&](const std::string& idx, const std::string& level, const std::string& size) {
    std::filesystem::create_directories(d.path / idx);
    std::ofstream(d.path / idx / "level") << level << "\n";
    std::ofstream(d.path / idx / "size") << size << "\n";
  };
  EXPECT_EQ(read_llc_bytes(d.file("none")), 0);
  EXPECT_EQ(read_llc_bytes(d.path.string()), 0);
  put("index0", "1", "48K");
  put("index3", "3", "107520K");
  put("index2", "2", "2048K");
  put("index1", "1", "32K");
  EXPECT_EQ(read_llc_bytes(d.path.string()), int64_t(107520) << 10);
  put("index4", "x", "9999M");  // unreadable entries are skipped
  EXPECT_EQ(read_llc_bytes(d.path.string()), int64_t(107520) << 10);
  put("index5", "2", "200M");  // a lower level larger than the last: still the last level's size
  EXPECT_EQ(read_llc_bytes(d.path.string()), int64_t(107520) << 10);
  std::ofstream(d.file("meminfo")) << "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   23000000 kB\n";
  EXPECT_EQ(read_mem_available_bytes(d.file("meminfo")), int64_t(23000000) * 1024);
  EXPECT_EQ(read_mem_available_bytes(d.file("none")), 0);
}

// fd-bench profile's options are refused before any measurement, naming the flag.
TEST(PerfModel, ProfileOptionsRefused) {
  const ModelConfig m = load_model_config(fd::test::repo_path("experiments/models/tiny-llama.json"));
  auto refuse = [&](auto change) {
    ProfileOptions o;
    change(o);
    return error_message<ConfigError>([&] { measure_profile(m, o); });
  };
  EXPECT_THAT(refuse([](ProfileOptions& o) { o.sm_count = 8; }), HasSubstr("--sm-count 8"));
  EXPECT_THAT(refuse([](ProfileOptions& o) { o.kv_dtypes = {"fp16", "int3"}; }), HasSubstr("--kv-dtypes: unknown KV dtype 'int3'"));
  EXPECT_THAT(refuse([](ProfileOptions& o) { o.batches = {4, 2}; }), HasSubstr("--batches: must be strictly increasing"));
  EXPECT_THAT(refuse([](ProfileOptions& o) { o.context = 16; }), HasSubstr("--context"));
  const Profile p = parse_profile(json::parse(R"({"t_b": [[1, 0.001]], "r_s_per_token_layer": {"fp16": 1e-7},
                                                  "backend": "cuda", "sm_count": 32})"),
                                  "p.json");  // what fd-bench profile --sm-count writes
  EXPECT_DOUBLE_EQ(p.t.at(1), 0.001);
}

// fd-bench profile --service's fit (harness/profile_service.h): round = a + c·(B/P) + b·(B·S/P), least squares. Points
// made exactly from known coefficients give them back, with R² 1; noise of a known size gives a max relative error of
// about that size; too few distinct points are refused.
TEST(PerfModel, ServiceFitRecoversTheRoundsCoefficients) {
  const double a = 4e-4, c = 3e-6, b = 2e-9;
  std::vector<double> x1, x2, y;
  for (double per_worker : {4.0, 16.0, 64.0, 256.0})
    for (double ctx : {128.0, 512.0, 1024.0}) x1.push_back(per_worker), x2.push_back(per_worker * ctx), y.push_back(a + c * per_worker + b * per_worker * ctx);
  ServiceFit f = fit_service(x1, x2, y);
  EXPECT_NEAR(f.a, a, 1e-12);
  EXPECT_NEAR(f.c, c, 1e-14);
  EXPECT_NEAR(f.b, b, 1e-17);
  EXPECT_NEAR(f.r2, 1.0, 1e-12);
  EXPECT_LT(f.max_rel_err, 1e-9);
  for (size_t i = 0; i < y.size(); ++i) y[i] *= (i % 2 ? 1.02 : 0.98);  // ±2 %
  f = fit_service(x1, x2, y);
  EXPECT_GT(f.max_rel_err, 0.005);
  EXPECT_LT(f.max_rel_err, 0.05);
  EXPECT_THAT(error_message([] { fit_service({1, 1, 1}, {2, 2, 2}, {1, 2, 3}); }), HasSubstr("do not determine the fit"));
}

// predict_step (fd-bench predict): step = N·max(2·T(B/2), R) + T(B/2) + head(B), R from the service grid, log-bilinear
// between its points and held at its edges. Hand-computed on a 2 x 2 grid.
TEST(PerfModel, StepFromProfilesAlone) {
  const json svc = {
      {"t_b", {{1, 1e-3}, {64, 1e-3}, {128, 1.6e-3}}},
      {"r_s_per_token_layer", {{"fp16", 1e-6}}},
      {"head_b", {{1, 2e-4}, {128, 6e-4}}},
      {"r_service",
       {{"workers", 4}, {"threads", 3}, {"layers", 2}, {"shm", true}, {"pinned", true}, {"fit", json::object()}, {"method", "m"},
        {"rows",
         {{{"kv_dtype", "fp16"}, {"batch", 16}, {"context", 100}, {"round_s_per_layer", 1e-3}, {"first_layer_s", 2e-3}},
          {{"kv_dtype", "fp16"}, {"batch", 16}, {"context", 400}, {"round_s_per_layer", 4e-3}, {"first_layer_s", 5e-3}},
          {{"kv_dtype", "fp16"}, {"batch", 64}, {"context", 100}, {"round_s_per_layer", 4e-3}, {"first_layer_s", 5e-3}},
          {{"kv_dtype", "fp16"}, {"batch", 64}, {"context", 400}, {"round_s_per_layer", 16e-3}, {"first_layer_s", 17e-3}}}}}}};
  const Profile p = parse_profile(svc, "svc.json");
  // At a grid point: R = 4 ms; S = 2·T(16) = 2 ms; fill = T(16) = 1 ms; head(32) = 2e-4 + 4e-4·31/127.
  StepPrediction s = predict_step(p, p, "fp16", 32, 200, 2);
  // Halfway in log B (16 -> 64) and in log context (100 -> 400): R = exp(the mean of the four logs) = (1·4·4·16)^(1/4) = 4 ms.
  EXPECT_NEAR(s.r_layer_s, 4e-3, 1e-12);
  EXPECT_NEAR(s.s_layer_s, 2e-3, 1e-12);
  EXPECT_NEAR(s.fill_s, 1e-3, 1e-12);
  EXPECT_NEAR(s.head_s, 2e-4 + 4e-4 * 31.0 / 127.0, 1e-12);
  EXPECT_NEAR(s.step_s, 2 * 4e-3 + 1e-3 + s.head_s, 1e-12);
  EXPECT_NEAR(s.tokens_per_s, 32 / s.step_s, 1e-9);
  EXPECT_EQ(s.binds, "R");
  EXPECT_FALSE(s.outside_grid);
  s = predict_step(p, p, "fp16", 64, 400, 1);
  EXPECT_NEAR(s.r_layer_s, 16e-3, 1e-12);
  s = predict_step(p, p, "fp16", 1024, 400, 1);  // past the grid: held at its edge, said
  EXPECT_NEAR(s.r_layer_s, 16e-3, 1e-12);
  EXPECT_TRUE(s.outside_grid);
  EXPECT_THAT(error_message([&] { predict_step(p, p, "int4", 32, 200, 2); }), HasSubstr("no int4 rows"));
  json holed = svc;
  holed["r_service"]["rows"].erase(holed["r_service"]["rows"].begin() + 1);
  EXPECT_THAT(error_message([&] { parse_profile(holed, "svc.json"); }), HasSubstr("the grid must be whole"));
  // GPU-only from the same profile: N·(T(n) + n·ctx·a) + head(n). T(32) = 1 ms (flat to 64); attention 32·200·1e-7 =
  // 0.64 ms a layer; head(32) as above.
  const StepPrediction g = predict_gpu_only_step(p, 1e-7, 32, 200, 2);
  EXPECT_NEAR(g.s_layer_s, 1e-3, 1e-12);
  EXPECT_NEAR(g.r_layer_s, 0.64e-3, 1e-12);
  EXPECT_NEAR(g.step_s, 2 * (1e-3 + 0.64e-3) + 2e-4 + 4e-4 * 31.0 / 127.0, 1e-12);
  EXPECT_NEAR(g.tokens_per_s, 32 / g.step_s, 1e-9);
  EXPECT_EQ(g.fill_s, 0);
  EXPECT_EQ(g.binds, "GPU");
  EXPECT_THAT(error_message([&] { predict_gpu_only_step(p, 0, 32, 200, 2); }), HasSubstr("attention rate > 0"));
}
