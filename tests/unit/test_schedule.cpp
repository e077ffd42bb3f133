// Sequence-level admission (fastdecode/sched/schedule.h): the properties of each mode, checked
// deterministically with a tiny driver (one token per running sequence per step, now_s = step).
#include "fastdecode/sched/schedule.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <numeric>

#include "fastdecode/model/weights.h"
#include "test_helpers.h"

using namespace fd;
using fd::test::error_message;
using fd::test::TempDir;
using ::testing::HasSubstr;

namespace {

struct Seq {
  int64_t prompt = 0, gen = 1, max_gen = 1;  // gen: actual length (<= max_gen, what the scheduler knows)
  double arrival = 0;
  int64_t admit = -1, finish = -1;
};

struct SimRun {
  std::vector<int64_t> w, running, proj;  // per step: actual total context, running count, projected load
  std::map<int64_t, std::vector<RequestId>> admits;  // step -> ids (in admission order)
  int64_t first_finish = -1, last_admit = -1;
};

// The harness loop of schedule.h: admit, one token per running sequence, report finishes.
SimRun drive(const SchedulerConfig& cfg, std::vector<Seq>& seqs, int64_t max_steps = 1000000) {
  Scheduler s(cfg);
  for (size_t i = 0; i < seqs.size(); ++i) s.submit({i, seqs[i].arrival, seqs[i].prompt, seqs[i].max_gen});
  SimRun run;
  std::vector<size_t> active;
  for (int64_t step = 0; !s.done(); ++step) {
    EXPECT_LT(step, max_steps) << "no progress";
    if (step >= max_steps) break;
    for (RequestId id : s.admit(step, double(step))) {
      seqs[id].admit = step;
      active.push_back(size_t(id));
      run.admits[step].push_back(id);
      run.last_admit = step;
    }
    int64_t w = 0;
    for (size_t i : active) w += seqs[i].prompt + (step - seqs[i].admit + 1);
    run.w.push_back(w);
    run.running.push_back(int64_t(active.size()));
    run.proj.push_back(s.projected_load(step));
    std::vector<size_t> still;
    for (size_t i : active) {
      if (step - seqs[i].admit + 1 == seqs[i].gen) {
        seqs[i].finish = step;
        s.on_finished(i, step);
        if (run.first_finish < 0) run.first_finish = step;
      } else {
        still.push_back(i);
      }
    }
    active.swap(still);
  }
  return run;
}

std::vector<Seq> fixed(int64_t n, int64_t prompt, int64_t gen) {
  std::vector<Seq> v(static_cast<size_t>(n));
  for (auto& s : v) s = {prompt, gen, gen, 0.0};
  return v;
}

// Uniform lengths in [lo, hi] from a seed (splitmix64).
int64_t uni(uint64_t seed, uint64_t i, int64_t lo, int64_t hi) {
  return lo + int64_t(splitmix64(seed * 1000003 + i) % uint64_t(hi - lo + 1));
}

SchedulerConfig cfg_of(AdmitMode m, int64_t B, int64_t S, int64_t F) {
  SchedulerConfig c;
  c.mode = m;
  c.batch = B;
  c.seq = S;
  c.interval = F;
  return c;
}

}  // namespace

TEST(Schedule, ParsesModesAndValidates) {
  EXPECT_EQ(parse_admit_mode("all-at-once"), AdmitMode::AllAtOnce);
  EXPECT_EQ(parse_admit_mode("fixed-interval"), AdmitMode::FixedInterval);
  EXPECT_EQ(parse_admit_mode("load-control"), AdmitMode::LoadControl);
  EXPECT_THAT(error_message<ConfigError>([] { parse_admit_mode("sls"); }), HasSubstr("unknown scheduling mode"));
  auto c = cfg_of(AdmitMode::LoadControl, 4, 8, 2);
  EXPECT_THAT(error_message<ConfigError>([&] { Scheduler s(c); }), HasSubstr("w_lim"));
  c.w_lim = 10;
  Scheduler s(c);
  // A request whose own peak (p + g) exceeds W_lim could never start: refused at submit.
  EXPECT_THAT(error_message<ConfigError>([&] { s.submit({1, 0.0, 3, 8}); }), HasSubstr("could never start"));
  s.submit({1, 1.0, 2, 8});
  EXPECT_THAT(error_message<ConfigError>([&] { s.submit({2, 0.5, 1, 1}); }), HasSubstr("arrival order"));
}

TEST(Schedule, StrictDriverContract) {
  Scheduler s(cfg_of(AdmitMode::AllAtOnce, 2, 4, 1));
  s.submit({7, 0.0, 0, 4});
  EXPECT_EQ(s.admit(0, 0.0), std::vector<RequestId>{7});
  EXPECT_THROW(s.admit(0, 0.0), Error);           // steps must increase
  EXPECT_THROW(s.on_finished(8, 1), Error);       // not running
  EXPECT_THROW(s.on_finished(7, 4), Error);       // past its max length (last step is 3)
  EXPECT_THROW(s.admit(4, 4.0), Error);           // ran past its max length without on_finished
}

// All-at-once: with prompt 0 and length S, B sequences peak at exactly B·S on their last step; with a
// prompt p the peak is B·(p + S). The next batch starts only when the whole batch has finished.
TEST(ScheduleAllAtOnce, PeaksAtExactlyBS) {
  for (int64_t p : {0, 7}) {
    const int64_t B = 64, S = 100;
    auto seqs = fixed(2 * B, p, S);
    const SimRun r = drive(cfg_of(AdmitMode::AllAtOnce, B, S, 1), seqs);
    EXPECT_EQ(*std::max_element(r.w.begin(), r.w.end()), B * (p + S)) << "p=" << p;
    EXPECT_EQ(r.w[size_t(S - 1)], B * (p + S));
    for (int64_t t = 0; t < S; ++t) EXPECT_EQ(r.w[size_t(t)], B * (p + t + 1));
    ASSERT_EQ(r.admits.size(), 2u);
    EXPECT_EQ(r.admits.at(0).size(), size_t(B));
    EXPECT_EQ(r.admits.at(S).size(), size_t(B));
  }
}

// Fixed-interval: micro-batches of M = B·F/S every F steps. Over the steady window (after the first
// finish, before the last admission) the total context peaks at exactly B·(S+F)/2 (paper's W'max) and
// averages B·(S+1)/2, with exactly B running.
TEST(ScheduleFixedInterval, SettlesAtHalfOfAllAtOnce) {
  const int64_t B = 256, S = 128, F = 16;
  auto seqs = fixed(8 * B, 0, S);
  const SimRun r = drive(cfg_of(AdmitMode::FixedInterval, B, S, F), seqs);
  for (const auto& [step, ids] : r.admits) {
    EXPECT_EQ(step % F, 0);
    EXPECT_EQ(int64_t(ids.size()), B * F / S);
  }
  const int64_t w0 = r.first_finish + 1, w1 = r.last_admit - 1;
  ASSERT_GT(w1 - w0, 4 * S);
  int64_t mx = 0;
  double sum = 0;
  for (int64_t t = w0; t <= w1; ++t) {
    mx = std::max(mx, r.w[size_t(t)]);
    sum += double(r.w[size_t(t)]);
    EXPECT_EQ(r.running[size_t(t)], B);
  }
  const double predicted = double(B) * double(S + F) / 2;
  EXPECT_NEAR(double(mx), predicted, 0.01 * predicted);
  EXPECT_EQ(double(mx), predicted);  // exact when S/F and B·F/S are integers
  EXPECT_DOUBLE_EQ(sum / double(w1 - w0 + 1), double(B) * double(S + 1) / 2);  // whole periods
  // Half of all-at-once's B·S (plus B·F/2).
  EXPECT_LT(double(mx), 0.6 * double(B * S));
}

// M = B·F/S not an integer: slot j starts floor((j+1)·B·F/S) - floor(j·B·F/S), i.e. floor or ceil of
// B·F/S, and S/F consecutive slots start exactly B sequences (B = 1000, F = 64, S = 1024: M = 62.5).
TEST(ScheduleFixedInterval, NonIntegerMicroBatchRounding) {
  const int64_t B = 1000, S = 1024, F = 64;
  int64_t total = 0;
  for (int64_t j = 0; j < 16; ++j) {
    const int64_t m = fixed_interval_slot_size(B, F, S, j);
    EXPECT_TRUE(m == 62 || m == 63) << m;
    EXPECT_EQ(m, j % 2 == 0 ? 62 : 63);
    total += m;
  }
  EXPECT_EQ(total, B);
  EXPECT_EQ(fixed_interval_slot_size(10, 1, 3, 0) + fixed_interval_slot_size(10, 1, 3, 1) + fixed_interval_slot_size(10, 1, 3, 2), 10);
  // Through the scheduler: in steady state exactly B run at every step.
  auto seqs = fixed(4 * B, 0, S);
  const SimRun r = drive(cfg_of(AdmitMode::FixedInterval, B, S, F), seqs);
  for (int64_t t = r.first_finish + 1; t < r.last_admit; ++t) EXPECT_EQ(r.running[size_t(t)], B) << t;
  for (const auto& [step, ids] : r.admits) EXPECT_TRUE(ids.size() == 62 || ids.size() == 63);
}

namespace {
// Brute force of load-control's definition: micro-batch `chunk` started at s is feasible iff for every
// step t >= s the sum over `prior` sequences alive at t and the chunk of (prompt + t - admit + 1) stays
// <= W_lim. Lengths are the scheduler's max lengths.
bool feasible_brute(const std::vector<Seq>& seqs, const std::vector<size_t>& prior, const std::vector<size_t>& chunk,
                    int64_t s, int64_t w_lim) {
  int64_t end = s;
  for (size_t i : prior) end = std::max(end, seqs[i].admit + seqs[i].max_gen - 1);
  for (size_t i : chunk) end = std::max(end, s + seqs[i].max_gen - 1);
  for (int64_t t = s; t <= end; ++t) {
    int64_t w = 0;
    for (size_t i : prior)
      if (t >= seqs[i].admit && t <= seqs[i].admit + seqs[i].max_gen - 1) w += seqs[i].prompt + t - seqs[i].admit + 1;
    for (size_t i : chunk)
      if (t <= s + seqs[i].max_gen - 1) w += seqs[i].prompt + t - s + 1;
    if (w > w_lim) return false;
  }
  return true;
}
}  // namespace

// Load-control never exceeds W_lim, and admits every micro-batch at most one step after the earliest
// step (at or after the previous admission) where the definition holds — checked by brute force over
// equal and unequal lengths, prompts, and several micro-batch sizes (exact lengths: max = actual).
TEST(ScheduleLoadControl, NeverExceedsAndIsEarliestByBruteForce) {
  struct Case {
    int64_t n, m, gen_lo, gen_hi, p_lo, p_hi, w_lim;
  };
  const std::vector<Case> cases = {
      {64, 4, 32, 32, 0, 0, 4 * 32 * 3},      // equal lengths
      {60, 5, 10, 40, 0, 0, 500},             // unequal lengths
      {50, 3, 5, 30, 0, 9, 333},              // prompts too
      {40, 1, 1, 25, 2, 4, 97},               // single-sequence micro-batches
  };
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    std::vector<Seq> seqs(static_cast<size_t>(c.n));
    for (int64_t i = 0; i < c.n; ++i) {
      const int64_t g = uni(ci, uint64_t(2 * i), c.gen_lo, c.gen_hi);
      seqs[size_t(i)] = {uni(ci, uint64_t(2 * i + 1), c.p_lo, c.p_hi), g, g, 0.0};
    }
    auto cfg = cfg_of(AdmitMode::LoadControl, 1000, 1, 1);
    cfg.w_lim = c.w_lim;
    cfg.micro_batch = c.m;
    const SimRun r = drive(cfg, seqs);
    for (size_t t = 0; t < r.w.size(); ++t) ASSERT_LE(r.w[t], c.w_lim) << "case " << ci << " step " << t;
    // Micro-batches in admission order: FIFO chunks of m.
    std::vector<std::pair<int64_t, std::vector<size_t>>> chunks;
    std::vector<size_t> order;
    for (const auto& [step, ids] : r.admits)
      for (auto id : ids) order.push_back(size_t(id));
    for (size_t k = 0; k < order.size(); k += size_t(c.m)) {
      std::vector<size_t> ch(order.begin() + long(k), order.begin() + long(std::min(order.size(), k + size_t(c.m))));
      chunks.emplace_back(seqs[ch.front()].admit, ch);
      for (size_t i : ch) ASSERT_EQ(seqs[i].admit, seqs[ch.front()].admit) << "micro-batch split across steps";
    }
    std::vector<size_t> prior;
    int64_t eligible = 0, exact = 0;
    for (const auto& [s_k, chunk] : chunks) {
      ASSERT_TRUE(feasible_brute(seqs, prior, chunk, s_k, c.w_lim)) << "case " << ci;
      int64_t earliest = eligible;
      while (!feasible_brute(seqs, prior, chunk, earliest, c.w_lim)) ++earliest;
      EXPECT_GE(s_k, earliest) << "case " << ci;
      EXPECT_LE(s_k, earliest + 1) << "case " << ci;
      exact += s_k == earliest;
      eligible = s_k;
      prior.insert(prior.end(), chunk.begin(), chunk.end());
    }
    EXPECT_EQ(exact, int64_t(chunks.size())) << "case " << ci << ": the scheduler admits at the earliest step itself";
  }
}

// The scheduler's own earliest_feasible_step agrees with the definition, and projections are used: a
// running sequence counts to its max length.
TEST(ScheduleLoadControl, EarliestFeasibleStepFromDefinition) {
  auto cfg = cfg_of(AdmitMode::LoadControl, 100, 1, 1);
  cfg.w_lim = 100;
  cfg.micro_batch = 1;
  Scheduler s(cfg);
  s.submit({0, 0.0, 0, 60});  // runs steps 0..59, ctx t+1
  s.submit({1, 0.0, 0, 60});
  EXPECT_EQ(s.admit(0, 0.0), std::vector<RequestId>{0});
  // Request 1 started at s: at t = 59 load is 60 + (59 - s + 1) <= 100 -> s >= 20; afterwards it is alone.
  EXPECT_EQ(s.earliest_feasible_step(1, {{1, 0.0, 0, 60}}), 20);
  for (int64_t t = 1; t < 20; ++t) EXPECT_TRUE(s.admit(t, double(t)).empty()) << t;
  EXPECT_EQ(s.admit(20, 20.0), std::vector<RequestId>{1});
  EXPECT_EQ(s.projected_load(59), 60 + 40);
}

// Paced load-control (min_gap = F) with W_lim = B·(S+F)/2 starts micro-batches exactly where
// fixed-interval does; unpaced greedy locks into a clumped pattern with fewer sequences running.
TEST(ScheduleLoadControl, PacedReproducesFixedInterval) {
  const int64_t B = 128, S = 64, F = 8;
  auto a = fixed(6 * B, 0, S), b = fixed(6 * B, 0, S), c = fixed(6 * B, 0, S);
  const SimRun fi = drive(cfg_of(AdmitMode::FixedInterval, B, S, F), a);
  auto lc = cfg_of(AdmitMode::LoadControl, B, S, F);
  lc.w_lim = B * (S + F) / 2;
  lc.min_gap = F;
  const SimRun paced = drive(lc, b);
  EXPECT_EQ(fi.w, paced.w);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].admit, b[i].admit);
  lc.min_gap = 0;
  const SimRun greedy = drive(lc, c);
  EXPECT_LE(*std::max_element(greedy.w.begin(), greedy.w.end()), lc.w_lim);
  EXPECT_GT(greedy.w.size(), fi.w.size());  // clumps: fewer running, more steps for the same work
}

// Early finish: a finished sequence's load disappears at once; under load-control the next admission
// comes earlier than its projection (which assumed the max length).
TEST(ScheduleEarlyFinish, FreesLoadAtOnce) {
  {
    Scheduler s(cfg_of(AdmitMode::AllAtOnce, 2, 100, 1));
    s.submit({0, 0.0, 5, 100});
    s.submit({1, 0.0, 5, 100});
    ASSERT_EQ(s.admit(0, 0.0).size(), 2u);
    for (int64_t t = 1; t <= 10; ++t) s.admit(t, double(t));
    EXPECT_EQ(s.projected_load(11), 2 * (5 + 12));
    s.on_finished(0, 10);
    EXPECT_EQ(s.projected_load(11), 5 + 12);
    EXPECT_EQ(s.running(), 1);
  }
  // W_lim admits one sequence at a time: the second starts the step after the first finishes (EOS at
  // its 10th token), not at step 100 as projected.
  auto cfg = cfg_of(AdmitMode::LoadControl, 10, 100, 1);
  cfg.w_lim = 103;
  cfg.micro_batch = 1;
  std::vector<Seq> seqs = {{3, 10, 100, 0.0}, {3, 100, 100, 0.0}};
  const SimRun r = drive(cfg, seqs);
  EXPECT_EQ(seqs[0].finish, 9);
  EXPECT_EQ(seqs[1].admit, 10);
  // Actual load drops to zero at once; projections (max length) always bound the actual load.
  for (size_t t = 0; t < r.w.size(); ++t) EXPECT_LE(r.w[t], r.proj[t]);
  // All-at-once: the next batch starts right after the last sequence of this one ends early.
  std::vector<Seq> aa = {{0, 3, 50, 0.0}, {0, 5, 50, 0.0}, {0, 50, 50, 0.0}, {0, 50, 50, 0.0}};
  drive(cfg_of(AdmitMode::AllAtOnce, 2, 50, 1), aa);
  EXPECT_EQ(aa[2].admit, 5);
}

// Memory cap: the actual (and projected) total context never exceeds the KV capacity, in every mode,
// with random lengths and early finishes; every request still completes.
TEST(ScheduleMemory, CapNeverExceeded) {
  for (AdmitMode m : {AdmitMode::AllAtOnce, AdmitMode::FixedInterval, AdmitMode::LoadControl}) {
    std::vector<Seq> seqs(300);
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int64_t mx = uni(9, 3 * i, 20, 80);
      seqs[i] = {uni(9, 3 * i + 1, 0, 16), uni(9, 3 * i + 2, 1, mx), mx, 0.0};
    }
    auto cfg = cfg_of(m, 64, 64, 4);
    cfg.kv_capacity_tokens = 1500;  // far below the unconstrained peaks (~64·(8+50))
    if (m == AdmitMode::LoadControl) cfg.w_lim = 100000;
    const SimRun r = drive(cfg, seqs);
    for (size_t t = 0; t < r.w.size(); ++t) {
      ASSERT_LE(r.w[t], 1500) << to_string(m) << " step " << t;
      ASSERT_LE(r.proj[t], 1500);
      ASSERT_LE(r.w[t], r.proj[t]);  // projection (max lengths) bounds the actual load
    }
    for (const auto& s : seqs) EXPECT_GE(s.finish, 0);
  }
  // All-at-once with a cap: the largest FIFO prefix that fits starts (floor(C / (p+S)) of equal ones).
  std::vector<Seq> eq = fixed(10, 0, 100);
  auto cfg = cfg_of(AdmitMode::AllAtOnce, 10, 100, 1);
  cfg.kv_capacity_tokens = 450;
  const SimRun r = drive(cfg, eq);
  EXPECT_EQ(r.admits.at(0).size(), 4u);
}

// Poisson arrivals: seeded and reproducible, increasing, with the requested mean rate (n = 20000:
// the relative s.d. of the measured rate is 1/sqrt(n) = 0.7 %; bound 3 %) and exponential gaps
// (coefficient of variation 1 within 5 %).
TEST(ScheduleArrivals, PoissonSeededWithTheRightRate) {
  const int64_t n = 20000;
  const double rate = 50;
  const auto a = poisson_arrivals(n, rate, 42), b = poisson_arrivals(n, rate, 42), c = poisson_arrivals(n, rate, 43);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  ASSERT_EQ(int64_t(a.size()), n);
  EXPECT_GT(a[0], 0.0);
  std::vector<double> gaps;
  double prev = 0;
  for (double t : a) {
    ASSERT_GT(t, prev);
    gaps.push_back(t - prev);
    prev = t;
  }
  EXPECT_NEAR(double(n) / a.back(), rate, 0.03 * rate);
  const double mean = std::accumulate(gaps.begin(), gaps.end(), 0.0) / double(n);
  double var = 0;
  for (double g : gaps) var += (g - mean) * (g - mean);
  EXPECT_NEAR(std::sqrt(var / double(n - 1)) / mean, 1.0, 0.05);
  EXPECT_THROW(poisson_arrivals(3, 0.0, 1), ConfigError);
}

// Only arrived requests are admitted; the scheduler reports the next arrival for idle waiting.
TEST(ScheduleArrivals, AdmitsOnlyArrivedRequests) {
  for (AdmitMode m : {AdmitMode::AllAtOnce, AdmitMode::FixedInterval, AdmitMode::LoadControl}) {
    auto cfg = cfg_of(m, 8, 4, 1);
    if (m == AdmitMode::LoadControl) cfg.w_lim = 1000;
    Scheduler s(cfg);
    s.submit({0, 5.5, 1, 4});
    EXPECT_EQ(s.next_arrival_s(), 5.5);
    for (int64_t t = 0; t <= 5; ++t) EXPECT_TRUE(s.admit(t, double(t)).empty()) << to_string(m);
    EXPECT_EQ(s.arrived(5.0), 0);
    EXPECT_EQ(s.admit(6, 6.0), std::vector<RequestId>{0}) << to_string(m);
  }
}

TEST(ScheduleTrace, ParsesStrictJsonl) {
  TempDir d("trace");
  const std::string good = d.file("good.jsonl");
  std::ofstream(good) << "{\"arrival_s\": 0, \"prompt_len\": 4, \"gen_len\": 10}\n\n"
                         "{\"arrival_s\": 0.5, \"prompt_len\": 0, \"gen_len\": 3, \"max_gen_len\": 8}\n";
  const auto t = load_trace_jsonl(good);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].max_gen_len, 10);
  EXPECT_EQ(t[1].arrival_s, 0.5);
  EXPECT_EQ(t[1].gen_len, 3);
  EXPECT_EQ(t[1].max_gen_len, 8);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{\"arrival_s\": 0, \"prompt_len\": 4}", "missing key 'gen_len'"},
      {"{\"arrival_s\": 0, \"prompt_len\": 4, \"gen_len\": 2, \"x\": 1}", "unknown key 'x'"},
      {"{\"arrival_s\": 0, \"prompt_len\": 4, \"gen_len\": 2.5}", "'gen_len' must be an integer"},
      {"{\"arrival_s\": -1, \"prompt_len\": 4, \"gen_len\": 2}", "finite and >= 0"},
      {"{\"arrival_s\": 0, \"prompt_len\": -4, \"gen_len\": 2}", "'prompt_len' = -4"},
      {"{\"arrival_s\": 0, \"prompt_len\": 4, \"gen_len\": 5, \"max_gen_len\": 4}", "'max_gen_len' = 4"},
      {"{\"arrival_s\": 0, \"prompt_len\": 4, \"gen_len\": 0}", "'gen_len' = 0"},
      {"[1, 2]", "expected a JSON object"},
      {"{\"arrival_s\": 0, ", "bad JSON"},
  };
  for (const auto& [line, what] : bad) {
    const std::string f = d.file("bad.jsonl");
    std::ofstream(f) << "{\"arrival_s\": 0, \"prompt_len\": 1, \"gen_len\": 1}\n" << line << "\n";
    const std::string msg = error_message<ConfigError>([&] { load_trace_jsonl(f); });
    EXPECT_THAT(msg, HasSubstr(f + ":2: ")) << line;
    EXPECT_THAT(msg, HasSubstr(what)) << line;
  }
  const std::string dec = d.file("dec.jsonl");
  std::ofstream(dec) << "{\"arrival_s\": 2, \"prompt_len\": 1, \"gen_len\": 1}\n{\"arrival_s\": 1, \"prompt_len\": 1, \"gen_len\": 1}\n";
  EXPECT_THAT(error_message<ConfigError>([&] { load_trace_jsonl(dec); }), HasSubstr(":2: 'arrival_s' decreases"));
  EXPECT_THAT(error_message<ConfigError>([&] { load_trace_jsonl(d.file("none.jsonl")); }), HasSubstr("cannot open"));
}

// deferred_starts: an admitted request the engine has not started slides with time; on_started fixes
// its life, which then ends max_gen_len - 1 steps later.
TEST(Scheduler, DeferredStartsSlideUntilStarted) {
  SchedulerConfig c;
  c.mode = AdmitMode::AllAtOnce;
  c.batch = 2;
  c.deferred_starts = true;
  Scheduler s(c);
  s.submit({1, 0.0, 4, 3});
  s.submit({2, 0.0, 4, 3});
  EXPECT_EQ(s.admit(0, 0.0).size(), 2u);
  s.on_started(1, 0);
  EXPECT_TRUE(s.admit(1, 1.0).empty());
  s.on_finished(1, 2);
  EXPECT_NO_THROW((void)s.admit(5, 5.0));  // request 2 not started yet: no "ran past its max length"
  EXPECT_THROW(s.on_started(2, 4), Error);  // before the step its life slid to
  s.on_started(2, 6);
  EXPECT_THROW(s.on_started(2, 7), Error);  // twice
  EXPECT_THROW(s.on_finished(2, 9), Error);  // life is [6, 8]
  s.on_finished(2, 8);
}

// on_step_done: a started sequence that produced no token in a step (paged-swap's prefill-only steps, a
// preempted or swapped-out sequence) has its life slid by one step, so the engine finishing it later is
// within its life; a sequence that advanced keeps its life.
TEST(Scheduler, StalledSequencesSlideTheirLife) {
  SchedulerConfig c;
  c.mode = AdmitMode::AllAtOnce;
  c.batch = 2;
  c.deferred_starts = true;
  Scheduler s(c);
  s.submit({1, 0.0, 4, 2});
  s.submit({2, 0.0, 4, 2});
  EXPECT_EQ(s.admit(0, 0.0).size(), 2u);
  s.on_step_done({1, 2});
  s.on_started(1, 0), s.on_started(2, 0);  // first tokens at step 0: lives [0, 1]
  s.on_step_done({2});                     // step 1: 1 paused, 2 advanced
  s.on_finished(2, 1);
  EXPECT_NO_THROW(s.admit(2, 2.0));        // 1's life slid to [1, 2]: not past its end
  s.on_step_done({1});
  EXPECT_THROW(s.on_finished(1, 3), Error);  // outside [1, 2]
  s.on_finished(1, 2);
  EXPECT_TRUE(s.done());
}
