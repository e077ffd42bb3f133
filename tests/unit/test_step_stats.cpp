// Steady-window and decode-only statistics (harness/step_stats.h), on hand-built step sequences whose
// answers are known: an all-at-once ramp then decode then drain, continuous arrivals, a run with no
// window, a prefill spike, and step times that are unknown (fd-sim without a cost model).
#include "harness/step_stats.h"

#include <gtest/gtest.h>

#include <optional>

using namespace fd;

namespace {

// One step: `running` sequences, `admitted` of them joining (prefill `prefill` prompt tokens), the rest
// decoding; `finished` done after it; context `ctx`.
StepStat st(int64_t step, std::optional<double> ms, int64_t running, int64_t admitted, int64_t finished,
            int64_t prefill = 0, int64_t ctx = 0) {
  StepStat s;
  s.step = step;
  s.step_ms = ms;
  s.prefill_tokens = prefill;
  s.decode_tokens = running - admitted;
  s.new_tokens = running;
  s.running = running;
  s.total_context = ctx;
  s.admitted = admitted;
  s.finished = finished;
  return s;
}

double d(const json& j) { return j.get<double>(); }

}  // namespace

// All at once, with an admission ramp over steps 0-1 (a prefill budget), decode, then a drain from step 7.
// The window is steps 2..6: after the last admission (1), before the first finish (7).
TEST(StepStats, AllAtOnceRampDecodeDrain) {
  std::vector<StepStat> v = {st(0, 50.0, 2, 2, 0, 100, 100), st(1, 60.0, 4, 2, 0, 120, 224)};
  for (int64_t i = 2; i <= 6; ++i) v.push_back(st(i, 10.0 + double(i), 4, 0, 0, 0, 224 + 4 * (i - 1)));
  v.push_back(st(7, 9.0, 4, 0, 2, 0, 260));
  v.push_back(st(8, 5.0, 2, 0, 2, 0, 140));
  const SteadyWindow w = steady_window(v);
  EXPECT_FALSE(w.whole_run);
  EXPECT_EQ(w.first_step, 2);
  EXPECT_EQ(w.last_step, 6);
  EXPECT_EQ(w.end - w.begin, 5u);
  EXPECT_NE(w.rule.find("after the last admission (step 1), before the first finish (step 7)"), std::string::npos) << w.rule;

  const json s = steady_stats(v);
  EXPECT_EQ(s["steps"], 5);
  EXPECT_EQ(s["tokens"], 20);
  const double ms = 12 + 13 + 14 + 15 + 16;
  EXPECT_DOUBLE_EQ(d(s["tokens_per_s"]), 20 / (ms / 1e3));
  EXPECT_DOUBLE_EQ(d(s["step_ms"]["max"]), 16.0);
  EXPECT_DOUBLE_EQ(d(s["decode_step_ms"]["mean"]), ms / 5);
  EXPECT_DOUBLE_EQ(d(s["mean_batch"]), 4.0);
  EXPECT_DOUBLE_EQ(d(s["mean_total_context"]), (228 + 232 + 236 + 240 + 244) / 5.0);

  // Decode-only: steps 2..8 (step 1 has prefill even though two sequences decode in it).
  const json o = decode_only_stats(v);
  EXPECT_EQ(o["steps"], 7);
  EXPECT_EQ(o["tokens"], 5 * 4 + 4 + 2);
  EXPECT_DOUBLE_EQ(d(o["tokens_per_s"]), 26 / ((ms + 9 + 5) / 1e3));
  EXPECT_DOUBLE_EQ(d(o["step_ms"]["max"]), 16.0);
  EXPECT_EQ(o["step_ms"]["count"], 7);
}

// Continuous arrivals (SLS): one request joins every other step and each lives 6 steps, so the first
// finish (step 5) comes before the last admission (step 10): the window is steps 6..9.
TEST(StepStats, ContinuousArrivals) {
  std::vector<StepStat> v;
  for (int64_t i = 0; i <= 15; ++i) {
    const int64_t adm = (i % 2 == 0 && i <= 10) ? 1 : 0;
    const int64_t fin = (i >= 5 && i % 2 == 1 && i <= 15) ? 1 : 0;
    v.push_back(st(i, 1.0 + double(i % 3), 3, adm, fin, adm * 7, 30));
  }
  const SteadyWindow w = steady_window(v);
  EXPECT_FALSE(w.whole_run);
  EXPECT_EQ(w.first_step, 6);
  EXPECT_EQ(w.last_step, 9);
  EXPECT_NE(w.rule.find("after the first finish (step 5), before the last admission (step 10)"), std::string::npos) << w.rule;
  const json s = steady_stats(v);
  EXPECT_EQ(s["steps"], 4);
  EXPECT_EQ(s["tokens"], 12);
  // Steps 6 and 8 admit (prefill): the window's decode-only steps are 7 and 9.
  EXPECT_EQ(s["decode_step_ms"]["count"], 2);
  EXPECT_DOUBLE_EQ(d(s["decode_step_ms"]["mean"]), (2.0 + 1.0) / 2);
  EXPECT_DOUBLE_EQ(d(s["mean_batch"]), (2 + 3 + 2 + 3) / 4.0);
}

// Step numbers with gaps (fd-sim skips steps where nothing runs): the window is by step number and
// first_step / last_step are steps that exist.
TEST(StepStats, WindowBoundsAreRecordedSteps) {
  const std::vector<StepStat> v = {st(0, 1.0, 1, 1, 0), st(3, 1.0, 1, 0, 0), st(4, 1.0, 1, 0, 0),
                                   st(9, 1.0, 1, 0, 1)};
  const SteadyWindow w = steady_window(v);
  EXPECT_EQ(w.first_step, 3);
  EXPECT_EQ(w.last_step, 4);
  EXPECT_EQ(w.begin, 1u);
  EXPECT_EQ(w.end, 3u);
}

// No step strictly between the last admission and the first finish (they are adjacent), no finish at all,
// and no step: the whole run, with the rule saying why.
TEST(StepStats, NoWindowFallsBackToWholeRun) {
  const std::vector<StepStat> adjacent = {st(0, 4.0, 2, 2, 0, 10), st(1, 2.0, 2, 0, 2)};
  SteadyWindow w = steady_window(adjacent);
  EXPECT_TRUE(w.whole_run);
  EXPECT_EQ(w.first_step, 0);
  EXPECT_EQ(w.last_step, 1);
  EXPECT_EQ(w.rule.rfind("whole run", 0), 0u) << w.rule;
  const json s = steady_stats(adjacent);
  EXPECT_EQ(s["steps"], 2);
  EXPECT_EQ(s["tokens"], 4);
  EXPECT_DOUBLE_EQ(d(s["tokens_per_s"]), 4 / 6e-3);

  const std::vector<StepStat> unfinished = {st(0, 1.0, 2, 2, 0), st(1, 1.0, 2, 0, 0), st(2, 1.0, 2, 0, 0)};
  w = steady_window(unfinished);
  EXPECT_TRUE(w.whole_run);
  EXPECT_EQ(w.end - w.begin, 3u);
  EXPECT_NE(w.rule.find("no request finished"), std::string::npos) << w.rule;

  w = steady_window({});
  EXPECT_TRUE(w.whole_run);
  EXPECT_EQ(w.first_step, -1);
  EXPECT_EQ(steady_stats({})["steps"], 0);
  EXPECT_EQ(decode_only_stats({})["steps"], 0);
  EXPECT_DOUBLE_EQ(d(decode_only_stats({})["tokens_per_s"]), 0.0);
}

// A huge prefill step (with decodes in it) must not reach decode_only's or the window's decode_step_ms.
TEST(StepStats, PrefillStepsExcludedFromDecodeOnly) {
  std::vector<StepStat> v = {st(0, 2.0, 2, 2, 0, 20)};
  for (int64_t i = 1; i <= 8; ++i) v.push_back(st(i, 2.0, i < 4 ? 2 : 3, i == 4 ? 1 : 0, 0, i == 4 ? 5000 : 0));
  v[4].step_ms = 900.0;  // the late joiner's prefill
  v.push_back(st(9, 2.0, 3, 0, 3));
  const json o = decode_only_stats(v);
  EXPECT_EQ(o["steps"], 8);
  EXPECT_DOUBLE_EQ(d(o["step_ms"]["max"]), 2.0);
  EXPECT_DOUBLE_EQ(d(o["step_ms"]["p99"]), 2.0);
  const json s = steady_stats(v);  // window 5..8 (last admission 4, first finish 9)
  EXPECT_EQ(s["first_step"], 5);
  EXPECT_DOUBLE_EQ(d(s["decode_step_ms"]["max"]), 2.0);
}

// fd-sim without a cost model: step times unknown. Counts stay; every time-based field is null.
TEST(StepStats, UnknownStepTimesGiveNull) {
  std::vector<StepStat> v = {st(0, std::nullopt, 2, 2, 0)};
  for (int64_t i = 1; i <= 4; ++i) v.push_back(st(i, std::nullopt, 2, 0, i == 4 ? 2 : 0, 0, 10 * i));
  const json o = decode_only_stats(v);
  EXPECT_EQ(o["steps"], 4);
  EXPECT_EQ(o["tokens"], 8);
  EXPECT_TRUE(o["tokens_per_s"].is_null());
  EXPECT_TRUE(o["step_ms"].is_null());
  const json s = steady_stats(v);
  EXPECT_EQ(s["steps"], 3);
  EXPECT_EQ(s["tokens"], 6);
  EXPECT_TRUE(s["tokens_per_s"].is_null());
  EXPECT_TRUE(s["step_ms"].is_null());
  EXPECT_TRUE(s["decode_step_ms"].is_null());
  EXPECT_DOUBLE_EQ(d(s["mean_total_context"]), 20.0);
}

// Full-depth equivalents: the rates times layers / full_layers; none at full depth; a null rate stays null.
TEST(StepStats, FullDepthEquivalent) {
  const json results = {{"output_throughput", 800.0},
                        {"decode_only", {{"tokens_per_s", 1000.0}}},
                        {"steady", {{"tokens_per_s", nullptr}}}};
  const json f = full_depth_equivalent(4, 32, results);
  EXPECT_DOUBLE_EQ(d(f["factor"]), 0.125);
  EXPECT_DOUBLE_EQ(d(f["output_throughput"]), 100.0);
  EXPECT_DOUBLE_EQ(d(f["decode_tokens_per_s"]), 125.0);
  EXPECT_TRUE(f["steady_tokens_per_s"].is_null());
  EXPECT_EQ(f["layers"], 4);
  EXPECT_EQ(f["full_layers"], 32);
  EXPECT_NE(f["basis"].get<std::string>().find("linear"), std::string::npos);
  EXPECT_TRUE(full_depth_equivalent(32, 32, results).is_null());
}

TEST(SloStats, GoodputAndAttainmentAsVllmDefinesThem) {
  // TPOT = (e2e - ttft) / (n - 1): 100 ms for the first two, 0 for the one-token request.
  const std::vector<fd::RequestLatency> reqs = {{100, 1100, 11}, {300, 400, 2}, {50, 50, 1}};
  const fd::json s = fd::slo_stats(200.0, 100.0, std::nullopt, reqs, 2.0);
  // ttft <= 200 and tpot <= 100: the first (100, 100) and the third (50, 0); the second's TTFT is 300.
  EXPECT_EQ(s["good_requests"], 2);
  EXPECT_DOUBLE_EQ(s["attainment"].get<double>(), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(s["goodput_requests_per_s"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(s["goodput_tokens_per_s"].get<double>(), 6.0);  // (11 + 1) tokens in 2 s
  EXPECT_EQ(s["limits"]["tpot_ms"], 100.0);
  EXPECT_TRUE(s["limits"]["e2e_ms"].is_null());
  // An end-to-end limit of 1 000 ms drops the first (1 100 ms); a limit is met at equality (tpot 100 <= 100).
  EXPECT_EQ(fd::slo_stats(200.0, 100.0, 1000.0, reqs, 2.0)["good_requests"], 1);
  EXPECT_EQ(fd::slo_stats(std::nullopt, 99.9, std::nullopt, reqs, 2.0)["good_requests"], 1);
  // No limit: nothing judged.
  const fd::json none = fd::slo_stats(std::nullopt, std::nullopt, std::nullopt, reqs, 2.0);
  EXPECT_TRUE(none["limits"].is_null() && none["attainment"].is_null() && none["goodput_requests_per_s"].is_null());
  EXPECT_EQ(none["requests"], 3);
}
