// The hybrid placement controller (fastdecode/sched/hybrid.h) against synthetic rates on a fake clock:
// a simulated engine runs each step at the cost model's time under the TRUE rates and reports the
// measured pieces; the controller sees only its prior and those measurements.
#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <functional>
#include <map>

#include "fastdecode/core/error.h"
#include "fastdecode/sched/hybrid.h"

namespace fd {
namespace {

HybridRates rates(double t_ms, double gpu_ns_per_token, double cpu_ns_per_token, int workers) {
  HybridRates r;
  r.s_part = TTable({{1, t_ms * 1e-3}, {4096, t_ms * 1e-3}});  // flat T(n): weight-bound
  r.gpu_s_per_token = gpu_ns_per_token * 1e-9;
  r.workers.assign(size_t(workers), WorkerCost{cpu_ns_per_token * 1e-9, 0, 0});
  r.move_s_per_token = 1e-9;
  return r;
}

struct Req {
  int64_t id, prompt, gen;
};

struct SimResult {
  double tokens_per_s = 0;
  int64_t max_running = 0, max_cpu = 0, max_gpu = 0, steps = 0;
  double cpu_token_share = 0;  // mean over steps of CPU context / all context
};

// Runs requests to completion (offline: all queued at 0) on a fake clock. truth(step) gives the true rates.
template <class Truth>
SimResult simulate(HybridController& c, std::deque<Req> q, Truth truth, int64_t max_steps = 100000,
                   std::function<void(int64_t)> each = nullptr, int64_t admit_per_step = 1 << 30) {
  SimResult res;
  std::map<int64_t, int64_t> left;  // id -> tokens still to generate
  double clock = 0;
  int64_t tokens = 0;
  double share_sum = 0;
  for (int64_t step = 0; step < max_steps && (!q.empty() || !left.empty()); ++step) {
    for (int64_t k = 0; k < admit_per_step && !q.empty(); ++k) {
      const Req r = q.front();
      const Admission a = c.admit(r.id, r.prompt, r.prompt + r.gen);
      if (!a.admitted) break;
      left[r.id] = r.gen;
      q.pop_front();
    }
    c.plan_moves();
    const HybridRates tr = truth(step);
    const HybridLoad& l = c.load();
    const StepCost cost = step_cost(tr, RateScale{}, l);
    StepMeasure m;
    m.layers = 2;
    m.batch = l.batch();
    m.s_part_s = 2 * cost.s_part;
    m.gpu_attn_s = 2 * cost.gpu_attn;
    m.gpu_tokens = l.gpu_tokens;
    m.gpu_seqs = l.gpu_seqs;
    for (size_t w = 0; w < l.w_seqs.size(); ++w)
      m.workers.push_back({2 * (tr.workers[w].s_per_token * double(l.w_tokens[w]) + tr.workers[w].s_per_seq * double(l.w_seqs[w])),
                           l.w_tokens[w], l.w_seqs[w]});
    m.move_tokens = l.move_tokens;
    m.move_s = 2 * cost.move;
    int64_t all = l.gpu_tokens, cpu = 0;
    for (int64_t t : l.w_tokens) all += t, cpu += t;
    share_sum += all > 0 ? double(cpu) / double(all) : 0;
    res.max_running = std::max(res.max_running, c.running());
    res.max_cpu = std::max(res.max_cpu, c.cpu_running());
    res.max_gpu = std::max(res.max_gpu, l.gpu_seqs);
    clock += 2 * cost.step;
    tokens += c.running();
    c.observe(m);
    c.advance();
    for (auto it = left.begin(); it != left.end();) {
      if (--it->second == 0) {
        c.finish(it->first);
        it = left.erase(it);
      } else {
        ++it;
      }
    }
    if (each) each(step);
    ++res.steps;
  }
  res.tokens_per_s = double(tokens) / clock;
  res.cpu_token_share = share_sum / double(res.steps);
  return res;
}

std::deque<Req> same_requests(int n, int64_t prompt, int64_t gen) {
  std::deque<Req> q;
  for (int i = 0; i < n; ++i) q.push_back({i, prompt, gen});
  return q;
}

HybridControllerConfig mode(HybridMode m, double f = 0) {
  HybridControllerConfig c;
  c.mode = m;
  c.cpu_fraction = f;
  return c;
}

const KvPool kBigGpu{1 << 20, 16};
std::vector<KvPool> pools(int n, int64_t blocks) { return std::vector<KvPool>(size_t(n), KvPool{blocks, 32}); }

TEST(HybridController, GpuFarFasterPlacesNothingOnTheCpus) {
  // CPU 400x slower per token than the GPU: the best split gains < min_gain -> GPU-only exactly.
  const HybridRates r = rates(10, 1, 400, 2);
  HybridController hy(mode(HybridMode::Auto), r, kBigGpu, pools(2, 1 << 20));
  HybridController go(mode(HybridMode::AllGpu), r, kBigGpu, pools(2, 1 << 20));
  auto truth = [&](int64_t) { return r; };
  const SimResult a = simulate(hy, same_requests(64, 2048, 64), truth);
  const SimResult b = simulate(go, same_requests(64, 2048, 64), truth);
  EXPECT_EQ(a.max_cpu, 0);
  EXPECT_EQ(hy.moves_total(), 0);
  EXPECT_DOUBLE_EQ(a.tokens_per_s, b.tokens_per_s);
}

TEST(HybridController, ComparableCpuSplitsNearTheBalancePoint) {
  // T = 0.5 ms, GPU 10 ns/token, 4 workers at 40 ns/token each (10 ns/token together): balance when
  // T + a·(W - Wc) = (r/4)·Wc, i.e. Wc/W = (T/W + a)/(a + r/4).
  const HybridRates r = rates(0.5, 10, 40, 4);
  HybridController hy(mode(HybridMode::Auto), r, kBigGpu, pools(4, 1 << 20));
  HybridController go(mode(HybridMode::AllGpu), r, kBigGpu, pools(4, 1 << 20));
  auto truth = [&](int64_t) { return r; };
  double share_at_10 = -1;
  const SimResult a = simulate(hy, same_requests(128, 1024, 64), truth, 100000, [&](int64_t s) {
    if (s == 10) {
      const HybridLoad& l = hy.load();
      double all = double(l.gpu_tokens), cpu = 0;
      for (int64_t t : l.w_tokens) all += double(t), cpu += double(t);
      share_at_10 = cpu / all;
    }
  });
  const SimResult b = simulate(go, same_requests(128, 1024, 64), truth);
  const double W = 128.0 * 1034, want = (0.5e-3 / W + 10e-9) / (10e-9 + 10e-9);
  EXPECT_NEAR(share_at_10, want, 0.03) << "balance share " << want;
  EXPECT_GT(a.tokens_per_s, 1.6 * b.tokens_per_s);
}

TEST(HybridController, GpuMemoryCapOverflowsToTheCpus) {
  // The GPU pool holds 8 sequences of peak 1088 (68 blocks of 16 each): GPU-only runs 8 at a time, the
  // hybrid controller puts the rest on the R-workers.
  const HybridRates r = rates(2, 10, 40, 4);
  const KvPool small{8 * 68, 16};
  HybridController hy(mode(HybridMode::Auto), r, small, pools(4, 1 << 20));
  HybridController go(mode(HybridMode::AllGpu), r, small, pools(4, 1 << 20));
  auto truth = [&](int64_t) { return r; };
  const SimResult a = simulate(hy, same_requests(64, 1024, 64), truth);
  const SimResult b = simulate(go, same_requests(64, 1024, 64), truth);
  EXPECT_EQ(b.max_running, 8);
  EXPECT_GT(a.max_running, 8);
  EXPECT_LE(a.max_gpu, 8);  // the GPU pool never holds more than its memory
  EXPECT_GT(a.tokens_per_s, 2 * b.tokens_per_s);
}

TEST(HybridController, AdaptsWhenTheCpuRatesDrift) {
  // Prior = truth (CPU comparable) until step 40, then the CPUs slow down 8x: the learned ratio follows
  // and the CPU share of context falls.
  const HybridRates r = rates(2, 10, 40, 4);
  HybridRates slow = r;
  for (auto& w : slow.workers) w.s_per_token *= 8;
  HybridController hy(mode(HybridMode::Auto), r, kBigGpu, pools(4, 1 << 20));
  std::deque<Req> q;
  for (int i = 0; i < 10000; ++i) q.push_back({i, 512, 32 + (i * 7) % 64});  // 20 arrive per step
  auto truth = [&](int64_t step) { return step < 40 ? r : slow; };
  double share_before = -1, share_after = -1;
  auto share = [&]() {
    const HybridLoad& l = hy.load();
    double all = double(l.gpu_tokens), cpu = 0;
    for (int64_t t : l.w_tokens) all += double(t), cpu += double(t);
    return cpu / all;
  };
  simulate(hy, q, truth, 400, [&](int64_t s) {
    if (s == 39) share_before = share();
    if (s == 399) share_after = share();
  }, 20);
  EXPECT_NEAR(hy.scale().workers[0], 8.0, 0.4);
  EXPECT_GT(share_before, 0.3);
  EXPECT_LT(share_after, 0.5 * share_before);
}

TEST(HybridController, ForcedModesAreHonoured) {
  const HybridRates r = rates(2, 10, 400, 2);  // auto would keep everything on the GPU
  auto truth = [&](int64_t) { return r; };
  {
    HybridController c(mode(HybridMode::AllCpu), r, kBigGpu, pools(2, 1 << 20));
    const SimResult s = simulate(c, same_requests(16, 64, 8), truth);
    EXPECT_EQ(s.max_cpu, 16);
    EXPECT_EQ(s.max_running, 16);
  }
  {
    HybridController c(mode(HybridMode::AllGpu), rates(2, 10, 1, 2), kBigGpu, pools(2, 1 << 20));
    const SimResult s = simulate(c, same_requests(16, 64, 8), truth);
    EXPECT_EQ(s.max_cpu, 0);
  }
  {
    HybridControllerConfig cfg = mode(HybridMode::FixedFraction, 0.25);
    cfg.max_moves_per_step = 1000;
    HybridController c(cfg, r, kBigGpu, pools(2, 1 << 20));
    std::deque<Req> q;
    for (int i = 0; i < 40; ++i) q.push_back({i, 64, i % 4 == 1 ? 8 : 13});  // the CPU ones finish first
    simulate(c, q, truth, 100000, [&](int64_t) {
      // after the step's finishes the next plan_moves restores round(f·n); check it right here
      c.plan_moves();
      EXPECT_EQ(c.cpu_running(), std::llround(0.25 * double(c.running())));
    });
  }
}

TEST(HybridController, CpuSidePlacesAsTheFastDecodeEngineDoes) {
  // fastdecode/sched/placement.h's rule on the CPU side: worker 0 holds a sequence of 100 tokens about to end (peak 105),
  // worker 1 a young one (8 tokens, peak 28). A new young one goes where the future it shares is smallest: worker 0
  // (sum_{t<5} (100 + t)(8 + t) = 5 110, against sum_{t<20} (8 + t)^2 = 6 790), though worker 0 holds more tokens now
  // (placing by the load now, as before, chose worker 1).
  const HybridRates r = rates(2, 10, 400, 2);
  HybridController c(mode(HybridMode::AllCpu), r, kBigGpu, pools(2, 1 << 20));
  EXPECT_EQ(c.admit(0, 100, 105).where.worker, 0);
  EXPECT_EQ(c.admit(1, 8, 28).where.worker, 1);
  EXPECT_EQ(c.admit(2, 8, 28).where.worker, 0);
  // A micro-batch of equal sequences spreads over the workers.
  HybridController d(mode(HybridMode::AllCpu), rates(2, 10, 400, 3), kBigGpu, pools(3, 1 << 20));
  std::vector<int> per(3, 0);
  for (int i = 0; i < 6; ++i) per[size_t(d.admit(i, 64, 96).where.worker)] += 1;
  EXPECT_EQ(per, std::vector<int>({2, 2, 2}));
}

TEST(HybridController, AdmissionUsesTheCombinedCapacity) {
  // GPU pool: 3 sequences of peak 100 (blocks of 100); two R-workers of 2 each: 7 fit, the 8th waits.
  const HybridRates r = rates(2, 10, 40, 2);
  HybridController c(mode(HybridMode::Auto), r, KvPool{3, 100}, pools(2, 8));  // 8 blocks of 32: two of peak 100 (4 blocks each)
  EXPECT_EQ(c.combined_capacity_tokens(), 300 + 2 * 8 * 32);
  for (int i = 0; i < 7; ++i) EXPECT_TRUE(c.admit(i, 50, 100).admitted) << i;
  const Admission a = c.admit(7, 50, 100);
  EXPECT_FALSE(a.admitted);
  EXPECT_NE(a.reason.find("no room"), std::string::npos) << a.reason;
  c.finish(0);
  EXPECT_TRUE(c.admit(7, 50, 100).admitted);
  HybridController g(mode(HybridMode::AllGpu), r, KvPool{3, 100}, pools(2, 8));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(g.admit(i, 50, 100).admitted);
  EXPECT_FALSE(g.admit(3, 50, 100).admitted);
}

TEST(HybridController, MovesAreCountedInTheirStep) {
  const HybridRates r = rates(2, 10, 40, 1);
  HybridController c(mode(HybridMode::FixedFraction, 1.0), r, kBigGpu, pools(1, 1 << 20));
  ASSERT_TRUE(c.admit(1, 500, 600).admitted);  // on the CPU: its 500 prompt tokens move in this step
  EXPECT_DOUBLE_EQ(c.predict().move, 500 * 1e-9);
  c.advance();
  EXPECT_DOUBLE_EQ(c.predict().move, 0);
  EXPECT_THROW(c.admit(2, 10, 5), ConfigError);  // peak below context
  for (int i = 0; i < 99; ++i) c.advance();
  EXPECT_THROW(c.advance(), Error);  // past its reservation
}

TEST(HybridController, LearnsRatiosFromMeasuredSteps) {
  const HybridRates r = rates(2, 10, 40, 1);
  HybridControllerConfig cfg;
  cfg.ewma = 0.5;
  HybridController c(cfg, r, kBigGpu, pools(1, 1 << 20));
  StepMeasure m;
  m.layers = 4;
  m.batch = 8;
  m.s_part_s = 4 * 3e-3;                         // 1.5 x T
  m.gpu_tokens = 1000, m.gpu_seqs = 4, m.gpu_attn_s = 4 * 1000 * 20e-9;  // 2 x a
  m.workers = {{4 * 1000 * 20e-9, 1000, 4}};     // 0.5 x r
  for (int i = 0; i < 40; ++i) c.observe(m);
  EXPECT_NEAR(c.scale().s_part, 1.5, 1e-6);
  EXPECT_NEAR(c.scale().gpu, 2.0, 1e-6);
  EXPECT_NEAR(c.scale().workers[0], 0.5, 1e-6);
  EXPECT_NEAR(c.learned_rates().gpu_s_per_token, 20e-9, 1e-12);
  m.workers.resize(2);
  EXPECT_THROW(c.observe(m), ConfigError);
}

TEST(HybridController, ConfigParseIsStrict) {
  const json j = json::parse(R"({"mode": "fixed-fraction", "cpu_fraction": 0.5, "max_moves_per_step": 2})");
  StrictObject o(j, "cfg.json", "engine.hybrid");
  const HybridControllerConfig c = HybridControllerConfig::parse(o);
  o.finish();
  EXPECT_EQ(c.mode, HybridMode::FixedFraction);
  EXPECT_DOUBLE_EQ(c.cpu_fraction, 0.5);
  for (const char* bad : {R"({"mode": "half"})", R"({"cpu_fraction": 0.5})", R"({"cpu_fraction": 2, "mode": "fixed-fraction"})",
                          R"({"splt": 1})"}) {
    const json b = json::parse(bad);
    StrictObject ob(b, "cfg.json", "engine.hybrid");
    EXPECT_THROW({ HybridControllerConfig::parse(ob); ob.finish(); }, ConfigError) << bad;
  }
}

TEST(HybridModel, PredictsSplitAndThroughput) {
  HybridModelInput in;
  in.t = TTable({{1, 2e-3}, {4096, 2e-3}});
  in.layers = 32;
  in.batch = 256;
  in.context = 1024;
  in.reserve_tokens = 2048;
  in.gpu_s_per_token = 10e-9;
  in.cpu_s_per_token = 4000e-9;  // far slower: nothing on the CPUs
  HybridPlan p = model_hybrid(in);
  EXPECT_EQ(p.hybrid.cpu_seqs, 0);
  EXPECT_DOUBLE_EQ(p.hybrid.tokens_per_s, p.gpu_only.tokens_per_s);
  in.cpu_s_per_token = 10e-9;  // comparable: split near balance, above both
  p = model_hybrid(in);
  // T + a(B-k)c = r k c  ->  k = (T + aBc)/((a + r)c) = (2e-3 + 10e-9·256·1024)/(20e-9·1024) = 225.7
  EXPECT_NEAR(double(p.hybrid.cpu_seqs), 225.7, 1.0);
  EXPECT_GT(p.hybrid.tokens_per_s, p.gpu_only.tokens_per_s);
  EXPECT_GT(p.hybrid.tokens_per_s, p.fastdecode.tokens_per_s);
  in.gpu_capacity_tokens = 64 * 2048;  // memory cap: GPU-only holds 64
  p = model_hybrid(in);
  EXPECT_EQ(p.gpu_only.batch, 64);
  EXPECT_EQ(p.hybrid.batch, 256);
  EXPECT_NE(format_hybrid_line(p).find("MODELLED"), std::string::npos);
  in.reserve_tokens = 10;  // below the context
  EXPECT_THROW(model_hybrid(in), ConfigError);
}

// A worker's fixed cost per ATTEND counts only when it holds a sequence; with it (and engaging) larger than
// what the CPUs could hide behind the GPU's step, the static model keeps every sequence on the GPU.
TEST(HybridModel, PerCallAndEngageCostsCountOncePerLayer) {
  HybridRates r = rates(1.0, 10, 10, 2);
  r.workers[0].s_per_call = 200e-6;
  r.workers[1].s_per_call = 300e-6;
  r.engage_s = 100e-6;
  HybridLoad l;
  l.gpu_seqs = 4, l.gpu_tokens = 4000;
  l.w_seqs = {1, 0}, l.w_tokens = {1000, 0};
  StepCost c = step_cost(r, RateScale{}, l);
  EXPECT_NEAR(c.cpu_side, 100e-6 + 200e-6 + 10e-9 * 1000, 1e-12);  // worker 1 holds nothing: no call cost
  l.w_seqs = {0, 0}, l.w_tokens = {0, 0};
  EXPECT_EQ(step_cost(r, RateScale{}, l).cpu_side, 0);
  EXPECT_EQ(r.workers[1].cost(0, 0), 0);

  // The static model's inputs from measured rates: the workers as one CPU side.
  r.workers[0].s_per_seq = 2e-6, r.workers[1].s_per_seq = 2e-6;
  HybridModelInput in = hybrid_model_input(r);
  EXPECT_NEAR(in.cpu_s_per_token, 5e-9, 1e-18);  // two workers of 10 ns/token in parallel
  EXPECT_NEAR(in.cpu_s_per_seq, 1e-6, 1e-15);
  EXPECT_NEAR(in.cpu_s_per_call, 300e-6, 1e-15);  // the slowest worker's
  EXPECT_NEAR(in.engage_s, 100e-6, 1e-15);
  in.layers = 2, in.batch = 32, in.context = 512, in.reserve_tokens = 544;
  in.gpu_capacity_tokens = 32 * 544;
  // T = 1 ms per layer >> e + f: the CPUs hide some sequences, so the split is above GPU-only.
  HybridPlan p = model_hybrid(in);
  EXPECT_GT(p.hybrid.cpu_seqs, 0);
  EXPECT_GT(p.hybrid.tokens_per_s, p.gpu_only.tokens_per_s);
  in.t = TTable({{1, 0.15e-3}, {4096, 0.15e-3}});  // a GPU layer shorter than engaging + one call: nothing to gain
  p = model_hybrid(in);
  EXPECT_EQ(p.hybrid.cpu_seqs, 0);
  EXPECT_DOUBLE_EQ(p.hybrid.tokens_per_s, p.gpu_only.tokens_per_s);
}

// A sequence lives whole on one R-worker: with W workers, k < W sequences cost one worker's whole time, not k / W
// of the side's. Measured case (artifacts/hybrid/h100-quick-6f61e5d, Llama-2-7b at 24 GB): as a fluid side the
// CPUs took 3 of 36 sequences (+7 % modelled) where the controller, placing whole sequences, took none.
TEST(HybridModel, SequencesAreWholeOnOneWorker) {
  HybridRates r = rates(0.3, 1e-6, 340, 4);  // T = 0.3 ms flat, GPU attention ~free, 4 workers of 0.34 us per token
  for (auto& w : r.workers) w.s_per_seq = 15e-6, w.s_per_call = 30e-6;
  r.engage_s = 130e-6;
  HybridModelInput in = hybrid_model_input(r);
  EXPECT_EQ(in.cpu_workers, 4);
  in.layers = 1, in.batch = 36, in.context = 500, in.reserve_tokens = 544;
  in.gpu_capacity_tokens = 32 * 544;  // the GPU holds 32
  // One CPU sequence (whole, on one worker): e + f + 0.34 us x 500 + 15 us = 130 + 30 + 185 = 345 us > 300 us:
  // 33 running at 345 us (95.7k tok/s) < 32 at 300 us (106.7k): nothing on the CPUs, at any k < 4 (the same
  // worker time) and k >= 4 alike (a worker's 345 us at least).
  HybridPlan p = model_hybrid(in);
  EXPECT_EQ(p.hybrid.cpu_seqs, 0);
  EXPECT_NEAR(p.gpu_only.tokens_per_s, 32 / 0.30e-3, 1);
  // As a fluid side (the old model) the 4 workers share one sequence's tokens: 130 + 30 + 185 / 4 + ... < 300 us for
  // 3 sequences (e + f + 3 x 46.25 us = 298.75 us): it took them.
  in.cpu_workers = 0;
  p = model_hybrid(in);
  EXPECT_EQ(p.hybrid.cpu_seqs, 3);
  EXPECT_EQ(p.hybrid.batch, 35);
}

TEST(HybridModel, RatesFromARunsSummary) {
  const json prior = json::parse(R"({"s_part_per_layer": [[1, 1.5e-4], [128, 1.7e-4]], "gpu_s_per_token": 4e-9,
      "gpu_s_per_seq": 5e-7, "engage_s": 4e-4, "move_s_per_token": 3e-5,
      "workers": [{"s_per_token": 2e-7, "s_per_seq": 1e-6, "s_per_call": 2e-4}, {"s_per_token": 2e-7, "s_per_seq": 1e-6}]})");
  for (const json& j : {prior, json{{"prior", prior}}, json{{"engine_info", {{"prior", prior}}}}}) {
    const HybridRates r = hybrid_rates_from_json(j, "run/summary.json");
    ASSERT_EQ(r.workers.size(), 2u);
    EXPECT_DOUBLE_EQ(r.workers[0].s_per_call, 2e-4);
    EXPECT_DOUBLE_EQ(r.workers[1].s_per_call, 0);  // an older run: not measured
    EXPECT_DOUBLE_EQ(r.s_part.at(128), 1.7e-4);
    EXPECT_DOUBLE_EQ(r.engage_s, 4e-4);
  }
  const auto err = [](const json& j) {
    try {
      hybrid_rates_from_json(j, "run/summary.json");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(err(json{{"engine_info", {{"slots", 4}}}}).find("run/summary.json: s_part_per_layer"), std::string::npos);
  json bad = prior;
  bad["workers"][1].erase("s_per_token");
  EXPECT_NE(err(bad).find("run/summary.json: workers[1].s_per_token: expected a number"), std::string::npos);
  bad = prior;
  bad["workers"][0]["s_per_call"] = -1;
  EXPECT_NE(err(bad).find("workers[0].s_per_call must be >= 0"), std::string::npos);
}

}  // namespace
}  // namespace fd
