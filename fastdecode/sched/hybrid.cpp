#include "fastdecode/sched/hybrid.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "fastdecode/core/error.h"
#include "fastdecode/sched/placement.h"

namespace fd {

namespace {
bool finite_nonneg(double x) { return std::isfinite(x) && x >= 0; }
}  // namespace

void HybridRates::validate() const {
  if (s_part.empty()) throw ConfigError("hybrid rates: s_part: T(n) table is empty");
  if (!(std::isfinite(gpu_s_per_token) && gpu_s_per_token > 0)) throw ConfigError("hybrid rates: gpu_s_per_token must be > 0");
  if (!finite_nonneg(gpu_s_per_seq)) throw ConfigError("hybrid rates: gpu_s_per_seq must be >= 0");
  if (!finite_nonneg(engage_s)) throw ConfigError("hybrid rates: engage_s must be >= 0");
  if (!finite_nonneg(move_s_per_token)) throw ConfigError("hybrid rates: move_s_per_token must be >= 0");
  for (size_t w = 0; w < workers.size(); ++w) {
    if (!(std::isfinite(workers[w].s_per_token) && workers[w].s_per_token > 0))
      throw ConfigError("hybrid rates: workers[" + std::to_string(w) + "].s_per_token must be > 0");
    if (!finite_nonneg(workers[w].s_per_seq))
      throw ConfigError("hybrid rates: workers[" + std::to_string(w) + "].s_per_seq must be >= 0");
    if (!finite_nonneg(workers[w].s_per_call))
      throw ConfigError("hybrid rates: workers[" + std::to_string(w) + "].s_per_call must be >= 0");
  }
}

int64_t HybridLoad::batch() const {
  int64_t n = gpu_seqs;
  for (int64_t s : w_seqs) n += s;
  return n;
}

StepCost step_cost(const HybridRates& r, const RateScale& k, const HybridLoad& l) {
  StepCost c;
  const int64_t n = l.batch();
  c.s_part = n > 0 ? k.s_part * r.s_part.at(double(n)) : 0;
  c.gpu_attn = k.gpu * (r.gpu_s_per_token * double(l.gpu_tokens) + r.gpu_s_per_seq * double(l.gpu_seqs));
  c.gpu_side = c.s_part + c.gpu_attn;
  double cpu = 0;
  bool any = false;
  for (size_t w = 0; w < l.w_seqs.size(); ++w) {
    if (l.w_seqs[w] == 0) continue;
    any = true;
    const double kw = w < k.workers.size() ? k.workers[w] : 1.0;
    cpu = std::max(cpu, kw * r.workers[w].cost(l.w_tokens[w], l.w_seqs[w]));
  }
  c.cpu_side = any ? r.engage_s + cpu : 0;
  c.move = k.move * r.move_s_per_token * double(l.move_tokens);
  c.step = std::max(c.gpu_side, c.cpu_side) + c.move;
  c.binds = c.cpu_side > c.gpu_side ? "cpu" : "gpu";
  return c;
}

json to_json(const StepCost& c) {
  return {{"s_part_s", c.s_part}, {"gpu_attn_s", c.gpu_attn}, {"gpu_side_s", c.gpu_side}, {"cpu_side_s", c.cpu_side},
          {"move_s", c.move},     {"step_s", c.step},         {"binds", c.binds}};
}

static const char* mode_name(HybridMode m) {
  switch (m) {
    case HybridMode::Auto: return "auto";
    case HybridMode::AllGpu: return "all-gpu";
    case HybridMode::AllCpu: return "all-cpu";
    case HybridMode::FixedFraction: return "fixed-fraction";
  }
  return "?";
}

HybridControllerConfig HybridControllerConfig::parse(StrictObject& o) {
  HybridControllerConfig c;
  const std::string m = o.get_enum("mode", {"auto", "all-gpu", "all-cpu", "fixed-fraction"}, std::string("auto"));
  c.mode = m == "all-gpu" ? HybridMode::AllGpu
           : m == "all-cpu" ? HybridMode::AllCpu
           : m == "fixed-fraction" ? HybridMode::FixedFraction
                                   : HybridMode::Auto;
  c.cpu_fraction = o.get_number("cpu_fraction", 0, 1, 0);
  if (o.has("cpu_fraction") && c.mode != HybridMode::FixedFraction)
    o.fail("cpu_fraction", "applies only to mode \"fixed-fraction\"");
  c.min_gain = o.get_number("min_gain", 0, 0.99, 0.02);
  c.ewma = o.get_number("ewma", 0, 0.999, 0.8);
  c.max_moves_per_step = o.get_int("max_moves_per_step", 0, 1 << 20, 4);
  c.payback = o.get_number("payback", 0, 1e6, 2);
  return c;
}

json HybridControllerConfig::to_json() const {
  json j = {{"mode", mode_name(mode)}, {"min_gain", min_gain}, {"ewma", ewma},
            {"max_moves_per_step", max_moves_per_step}, {"payback", payback}};
  if (mode == HybridMode::FixedFraction) j["cpu_fraction"] = cpu_fraction;
  return j;
}

HybridController::HybridController(HybridControllerConfig cfg, HybridRates prior, KvPool gpu, std::vector<KvPool> workers)
    : cfg_(cfg), r_(std::move(prior)), gpu_(gpu), pools_(std::move(workers)) {
  r_.validate();
  if (r_.workers.size() != pools_.size())
    throw ConfigError("hybrid controller: " + std::to_string(r_.workers.size()) + " worker rates for " +
                      std::to_string(pools_.size()) + " R-worker pools");
  if (gpu_.blocks < 0 || gpu_.block_tokens < 1) throw ConfigError("hybrid controller: GPU pool: blocks >= 0, block_tokens >= 1");
  for (const KvPool& p : pools_)
    if (p.blocks < 0 || p.block_tokens < 1) throw ConfigError("hybrid controller: R-worker pool: blocks >= 0, block_tokens >= 1");
  if (!(cfg_.cpu_fraction >= 0 && cfg_.cpu_fraction <= 1)) throw ConfigError("hybrid controller: cpu_fraction must be in [0, 1]");
  if ((cfg_.mode == HybridMode::AllCpu || (cfg_.mode == HybridMode::FixedFraction && cfg_.cpu_fraction > 0)) && pools_.empty())
    throw ConfigError(std::string("hybrid controller: mode ") + mode_name(cfg_.mode) + " needs at least one R-worker");
  k_.workers.assign(pools_.size(), 1.0);
  pool_used_.assign(pools_.size(), 0);
  load_.w_seqs.assign(pools_.size(), 0);
  load_.w_tokens.assign(pools_.size(), 0);
}

int64_t HybridController::blocks_on(const Placement& p, int64_t peak) const {
  return p.on_gpu ? gpu_.blocks_for(peak) : pools_[size_t(p.worker)].blocks_for(peak);
}

bool HybridController::room(const Placement& p, int64_t peak) const {
  if (p.on_gpu) return gpu_used_ + blocks_on(p, peak) <= gpu_.blocks;
  return pool_used_[size_t(p.worker)] + blocks_on(p, peak) <= pools_[size_t(p.worker)].blocks;
}

void HybridController::place(int64_t id, Seq s) {
  if (s.at.on_gpu) {
    gpu_used_ += blocks_on(s.at, s.peak);
    load_.gpu_seqs += 1;
    load_.gpu_tokens += s.ctx;
  } else {
    const size_t w = size_t(s.at.worker);
    pool_used_[w] += blocks_on(s.at, s.peak);
    load_.w_seqs[w] += 1;
    load_.w_tokens[w] += s.ctx;
  }
  seqs_[id] = s;
}

HybridController::Seq HybridController::unplace(int64_t id) {
  auto it = seqs_.find(id);
  FD_CHECK(it != seqs_.end(), "hybrid controller: sequence " << id << " is not running");
  const Seq s = it->second;
  seqs_.erase(it);
  if (s.at.on_gpu) {
    gpu_used_ -= blocks_on(s.at, s.peak);
    load_.gpu_seqs -= 1;
    load_.gpu_tokens -= s.ctx;
  } else {
    const size_t w = size_t(s.at.worker);
    pool_used_[w] -= blocks_on(s.at, s.peak);
    load_.w_seqs[w] -= 1;
    load_.w_tokens[w] -= s.ctx;
  }
  return s;
}

double HybridController::cost_now() const {
  HybridLoad l = load_;
  l.move_tokens = 0;
  return step_cost(r_, k_, l).step;
}

double HybridController::cost_if(const Placement& p, int64_t ctx, int delta) const {
  HybridLoad l = load_;
  l.move_tokens = 0;
  if (p.on_gpu) {
    l.gpu_seqs += delta;
    l.gpu_tokens += delta * ctx;
  } else {
    l.w_seqs[size_t(p.worker)] += delta;
    l.w_tokens[size_t(p.worker)] += delta * ctx;
  }
  return step_cost(r_, k_, l).step;
}

// The R-worker with room where the sequence's future KV overlaps least with the workers' running sequences (weighted by
// each worker's learned seconds per token): the FastDecode engine's rule (fastdecode/sched/placement.h), so a
// micro-batch spreads and each worker holds the same mix of ages; moves place the same way.
int HybridController::best_worker(int64_t ctx, int64_t peak) const {
  const size_t n = pools_.size();
  if (n == 0) return -1;
  std::vector<int64_t> load(n, 0);
  std::vector<bool> full(n, false);
  std::vector<double> speed(n, 0.0);
  std::vector<PlacedLoad> running;
  int64_t longest = peak;
  for (const auto& [id, s] : seqs_) {
    longest = std::max(longest, s.peak);
    if (s.at.on_gpu) continue;
    load[size_t(s.at.worker)] += s.peak;
    running.push_back({size_t(s.at.worker), double(s.ctx), double(s.peak - s.ctx)});
  }
  bool any = false;
  for (size_t w = 0; w < n; ++w) {
    full[w] = !room({false, int(w)}, peak);
    any = any || !full[w];
    speed[w] = k_.workers[w] * r_.workers[w].s_per_token;
  }
  if (!any) return -1;
  if (std::any_of(speed.begin(), speed.end(), [](double v) { return !(v > 0); })) speed.clear();  // rates unknown: equal
  return int(place_sequence(load, full, running, double(ctx), double(std::max<int64_t>(1, peak - ctx)), peak, longest, speed));
}

// Does some split of the running sequences beat GPU-only by min_gain? Candidates: the longest-first
// prefixes (a sequence's CPU cost per context token, r + o/ctx, falls with its length, and moving it frees
// the most GPU memory), each put on the least-loaded R-worker with room. GPU-only not fitting counts as
// "engaged".
bool HybridController::decide_engaged() const {
  if (pools_.empty() || seqs_.empty()) return false;
  std::vector<const Seq*> order;
  for (const auto& [id, s] : seqs_) order.push_back(&s);
  std::stable_sort(order.begin(), order.end(), [](const Seq* a, const Seq* b) { return a->ctx > b->ctx; });
  HybridLoad l;
  l.w_seqs.assign(pools_.size(), 0);
  l.w_tokens.assign(pools_.size(), 0);
  int64_t gpu_blocks = 0;
  for (const Seq* s : order) {
    l.gpu_seqs += 1;
    l.gpu_tokens += s->ctx;
    gpu_blocks += gpu_.blocks_for(s->peak);
  }
  std::vector<int64_t> used(pools_.size(), 0);
  const double gpu_only = gpu_blocks <= gpu_.blocks ? step_cost(r_, k_, l).step : std::numeric_limits<double>::infinity();
  double best = std::numeric_limits<double>::infinity();
  for (const Seq* s : order) {
    int bw = -1;
    double bl = 0;
    for (size_t w = 0; w < pools_.size(); ++w) {
      if (used[w] + pools_[w].blocks_for(s->peak) > pools_[w].blocks) continue;
      const double lw = k_.workers[w] * r_.workers[w].cost(l.w_tokens[w] + s->ctx, l.w_seqs[w] + 1);
      if (bw < 0 || lw < bl) bw = int(w), bl = lw;
    }
    if (bw < 0) break;
    used[size_t(bw)] += pools_[size_t(bw)].blocks_for(s->peak);
    l.gpu_seqs -= 1;
    l.gpu_tokens -= s->ctx;
    gpu_blocks -= gpu_.blocks_for(s->peak);
    l.w_seqs[size_t(bw)] += 1;
    l.w_tokens[size_t(bw)] += s->ctx;
    if (gpu_blocks <= gpu_.blocks) best = std::min(best, step_cost(r_, k_, l).step);
  }
  if (!std::isfinite(gpu_only)) return true;
  return best < (1 - cfg_.min_gain) * gpu_only;
}

Admission HybridController::admit(int64_t id, int64_t context, int64_t peak) {
  FD_CHECK(!seqs_.count(id), "hybrid controller: sequence " << id << " is already running");
  if (context < 0 || peak < context || peak < 1)
    throw ConfigError("hybrid controller: sequence " + std::to_string(id) + ": context " + std::to_string(context) +
                      " and peak " + std::to_string(peak) + " (need 0 <= context <= peak, peak >= 1)");
  Admission a;
  const Placement gpu{true, -1};
  const int bw = best_worker(context, peak);
  const bool gpu_room = room(gpu, peak);
  auto take = [&](const Placement& p) {
    a.admitted = true;
    a.where = p;
    place(id, {context, peak, p});
    if (!p.on_gpu) load_.move_tokens += context;  // the prefill's KV goes to the R-worker in this step
    return a;
  };
  switch (cfg_.mode) {
    case HybridMode::AllGpu:
      if (gpu_room) return take(gpu);
      a.reason = "GPU KV pool full (all-gpu)";
      return a;
    case HybridMode::AllCpu:
      if (bw >= 0) return take({false, bw});
      a.reason = "every R-worker's memory full (all-cpu)";
      return a;
    case HybridMode::FixedFraction: {
      const int64_t want_cpu = int64_t(std::llround(cfg_.cpu_fraction * double(running() + 1)));
      if (cpu_running() < want_cpu) {
        if (bw >= 0) return take({false, bw});
        a.reason = "every R-worker's memory full (fixed-fraction)";
      } else {
        if (gpu_room) return take(gpu);
        a.reason = "GPU KV pool full (fixed-fraction)";
      }
      return a;
    }
    case HybridMode::Auto: break;
  }
  // Auto: the side with the lower modelled step (the CPU side's prompt move amortized over the sequence's
  // projected life); the GPU alone while the CPUs have nothing to gain. With the GPU full, an overflow to
  // the CPUs must not lower the modelled tokens/s ((n + 1) / step' >= n / step), or the sequence waits
  // for GPU room as it would in GPU-only.
  const double now = cost_now();
  const double life = double(std::max<int64_t>(1, peak - context));
  const double cpu_cost = bw >= 0 ? cost_if({false, bw}, context, +1) +
                                        k_.move * r_.move_s_per_token * double(context) / life
                                  : std::numeric_limits<double>::infinity();
  const double gpu_cost = gpu_room ? cost_if(gpu, context, +1) : std::numeric_limits<double>::infinity();
  Placement pick = gpu;
  double cost = gpu_cost;
  if (!gpu_room || (engaged_ && cpu_cost < gpu_cost)) pick = {false, bw}, cost = cpu_cost;
  if (!std::isfinite(cost)) {
    a.reason = "no room: GPU KV pool and every R-worker full";
    return a;
  }
  const double n = double(running());
  if (!gpu_room && n > 0 && (n + 1) / cost < n / now) {
    a.reason = "placing it would lower the modelled tokens/s";
    return a;
  }
  take(pick);
  engaged_ = decide_engaged();
  return a;
}

void HybridController::finish(int64_t id) { unplace(id); }

void HybridController::move(int64_t id, const Placement& to, std::vector<Move>& out) {
  Seq s = unplace(id);
  out.push_back({id, s.at, to, s.ctx});
  s.at = to;
  place(id, s);
  load_.move_tokens += s.ctx;
  ++moves_total_;
}

std::vector<Move> HybridController::plan_moves() {
  std::vector<Move> out;
  if (cfg_.mode == HybridMode::AllGpu || cfg_.mode == HybridMode::AllCpu) return out;
  if (cfg_.mode == HybridMode::FixedFraction) {
    // Hold round(f·n) on the CPUs: the longest GPU sequences go out, the shortest CPU ones come back.
    for (int64_t i = 0; i < cfg_.max_moves_per_step; ++i) {
      const int64_t want = int64_t(std::llround(cfg_.cpu_fraction * double(running())));
      const int64_t have = cpu_running();
      if (have == want) break;
      int64_t pick = -1, pick_ctx = 0;
      for (const auto& [id, s] : seqs_) {
        if (have < want && s.at.on_gpu && (pick < 0 || s.ctx > pick_ctx) && best_worker(s.ctx, s.peak) >= 0)
          pick = id, pick_ctx = s.ctx;
        if (have > want && !s.at.on_gpu && (pick < 0 || s.ctx < pick_ctx) && room({true, -1}, s.peak))
          pick = id, pick_ctx = s.ctx;
      }
      if (pick < 0) break;
      const Seq& s = seqs_.at(pick);
      move(pick, have < want ? Placement{false, best_worker(s.ctx, s.peak)} : Placement{true, -1}, out);
    }
    return out;
  }
  engaged_ = decide_engaged();
  // Auto: the single move with the largest net benefit (modelled gain per step x the sequence's remaining
  // steps - payback x its move cost), while one pays; when the CPUs have nothing to gain, only moves back
  // to the GPU that cut the step.
  for (int64_t i = 0; i < cfg_.max_moves_per_step; ++i) {
    const double now = cost_now();
    double best_net = 0;
    int64_t pick = -1;
    Placement pick_to;
    for (const auto& [id, s] : seqs_) {
      Placement to;
      if (s.at.on_gpu) {
        if (!engaged_) continue;
        const int w = best_worker(s.ctx, s.peak);
        if (w < 0) continue;
        to = {false, w};
      } else {
        if (!room({true, -1}, s.peak)) continue;
        to = {true, -1};
      }
      HybridLoad l = load_;
      l.move_tokens = 0;
      auto shift = [&](const Placement& p, int d) {
        if (p.on_gpu) l.gpu_seqs += d, l.gpu_tokens += d * s.ctx;
        else l.w_seqs[size_t(p.worker)] += d, l.w_tokens[size_t(p.worker)] += d * s.ctx;
      };
      shift(s.at, -1);
      shift(to, +1);
      const double gain = now - step_cost(r_, k_, l).step;
      if (!(gain > 1e-9 * now)) continue;
      const double net = gain * double(std::max<int64_t>(1, s.peak - s.ctx)) -
                         cfg_.payback * k_.move * r_.move_s_per_token * double(s.ctx);
      if (net > best_net) best_net = net, pick = id, pick_to = to;
    }
    if (pick < 0) break;
    move(pick, pick_to, out);
  }
  return out;
}

StepCost HybridController::predict() const { return step_cost(r_, k_, load_); }

void HybridController::observe(const StepMeasure& m) {
  if (m.layers < 1) throw ConfigError("hybrid controller: measured step: layers must be >= 1");
  if (!m.workers.empty() && m.workers.size() != pools_.size())
    throw ConfigError("hybrid controller: measured step has " + std::to_string(m.workers.size()) + " workers, expected " +
                      std::to_string(pools_.size()));
  const double L = double(m.layers), w = cfg_.ewma;
  auto update = [&](double& k, double measured_s, double prior_s) {
    if (measured_s < 0 || !(prior_s > 0) || !std::isfinite(measured_s)) return;
    k = w * k + (1 - w) * (measured_s / L) / prior_s;  // ratio of the measured per-layer time to the prior rates'
  };
  if (m.batch > 0) update(k_.s_part, m.s_part_s, r_.s_part.at(double(m.batch)));
  if (m.gpu_seqs > 0)
    update(k_.gpu, m.gpu_attn_s, r_.gpu_s_per_token * double(m.gpu_tokens) + r_.gpu_s_per_seq * double(m.gpu_seqs));
  for (size_t i = 0; i < m.workers.size(); ++i)
    if (m.workers[i].seqs > 0)
      update(k_.workers[i], m.workers[i].compute_s, r_.workers[i].cost(m.workers[i].tokens, m.workers[i].seqs));
  if (m.move_tokens > 0) update(k_.move, m.move_s, r_.move_s_per_token * double(m.move_tokens));
}

void HybridController::advance() {
  for (auto& [id, s] : seqs_) {
    if (s.ctx + 1 > s.peak)
      FD_THROW("hybrid controller: sequence " << id << " grew past its projected peak " << s.peak
                                              << " (its reservation); finish() it at its last token");
    s.ctx += 1;
  }
  load_.gpu_tokens += load_.gpu_seqs;
  for (size_t w = 0; w < pools_.size(); ++w) load_.w_tokens[w] += load_.w_seqs[w];
  load_.move_tokens = 0;
}

Placement HybridController::where(int64_t id) const {
  auto it = seqs_.find(id);
  FD_CHECK(it != seqs_.end(), "hybrid controller: sequence " << id << " is not running");
  return it->second.at;
}

int64_t HybridController::cpu_running() const { return running() - load_.gpu_seqs; }

int64_t HybridController::combined_capacity_tokens() const {
  int64_t c = gpu_.blocks * gpu_.block_tokens;
  for (const KvPool& p : pools_) c += p.blocks * p.block_tokens;
  return c;
}

HybridRates HybridController::learned_rates() const {
  HybridRates r = r_;
  std::vector<std::pair<double, double>> pts = r.s_part.points();
  for (auto& [b, t] : pts) t *= k_.s_part;
  r.s_part = TTable(pts);
  r.gpu_s_per_token *= k_.gpu;
  r.gpu_s_per_seq *= k_.gpu;
  for (size_t w = 0; w < r.workers.size(); ++w) {
    r.workers[w].s_per_token *= k_.workers[w];
    r.workers[w].s_per_seq *= k_.workers[w];
    r.workers[w].s_per_call *= k_.workers[w];
  }
  r.move_s_per_token *= k_.move;
  return r;
}

// ---- the static model ----
HybridPlan model_hybrid(const HybridModelInput& in) {
  FD_CHECK(!in.t.empty(), "hybrid model: T(n) table is empty");
  if (in.layers < 1 || in.batch < 1) throw ConfigError("hybrid model: layers and batch must be >= 1");
  if (!(in.context >= 0) || !(in.reserve_tokens >= in.context) || !(in.reserve_tokens > 0))
    throw ConfigError("hybrid model: need 0 <= context <= reserve_tokens, reserve_tokens > 0");
  if (!(in.gpu_s_per_token > 0) || !(in.cpu_s_per_token > 0) || !(in.cpu_s_per_seq >= 0) || !(in.engage_s >= 0) ||
      !(in.cpu_s_per_call >= 0) || !(in.gpu_s_per_seq >= 0))
    throw ConfigError("hybrid model: GPU and CPU rates must be > 0 (per-sequence, per-call and engage costs >= 0)");
  const double N = double(in.layers), c = in.context;
  auto cap = [&](double tokens) {
    return std::isinf(tokens) ? in.batch : std::min<int64_t>(in.batch, int64_t(std::floor(tokens / in.reserve_tokens)));
  };
  const int64_t gpu_cap = cap(in.gpu_capacity_tokens), cpu_cap = cap(in.cpu_capacity_tokens);
  auto point = [&](int64_t b, int64_t k) {  // b running, k of them on the CPUs
    HybridModelPoint p;
    p.batch = b;
    p.cpu_seqs = k;
    if (b == 0) return p;
    const double g = in.t.at(double(b)) + (in.gpu_s_per_token * c + in.gpu_s_per_seq) * double(b - k);
    // Whole sequences: with W workers the busiest holds ceil(k / W) of them (k < W: one worker's whole time).
    const double held = in.cpu_workers > 0 ? double(in.cpu_workers) * std::ceil(double(k) / double(in.cpu_workers)) : double(k);
    const double cpu = k > 0 ? in.engage_s + in.cpu_s_per_call + (in.cpu_s_per_token * c + in.cpu_s_per_seq) * held : 0;
    p.step_s = N * std::max(g, cpu);
    p.tokens_per_s = double(b) / p.step_s;
    p.binds = cpu > g ? "cpu" : "gpu";
    return p;
  };
  HybridPlan plan;
  plan.gpu_only = point(gpu_cap, 0);
  plan.fastdecode = point(cpu_cap, cpu_cap);  // every sequence's attention on the CPUs
  // The best (batch <= B, split) by tokens/s: a batch past GPU memory pays only when the CPUs carry it.
  const int64_t b_max = std::min(in.batch, gpu_cap + cpu_cap);
  HybridModelPoint best;
  for (int64_t b = 1; b <= b_max; ++b)
    for (int64_t k = std::max<int64_t>(0, b - gpu_cap); k <= std::min(b, cpu_cap); ++k) {
      const HybridModelPoint p = point(b, k);
      if (best.batch == 0 || p.tokens_per_s > best.tokens_per_s) best = p;
    }
  // Nothing to gain: GPU-only's point unless the best beats it by min_gain.
  if (gpu_cap > 0 && !(best.tokens_per_s * (1 - in.min_gain) > plan.gpu_only.tokens_per_s)) best = plan.gpu_only;
  plan.hybrid = best;
  return plan;
}

HybridModelInput hybrid_model_input(const HybridRates& r) {
  r.validate();
  if (r.workers.empty()) throw ConfigError("hybrid rates: no R-worker");
  HybridModelInput in;
  in.t = r.s_part;
  in.gpu_s_per_token = r.gpu_s_per_token;
  in.gpu_s_per_seq = r.gpu_s_per_seq;
  in.engage_s = r.engage_s;
  double inv_tok = 0, inv_seq = 0;
  bool seq_free = false;
  for (const WorkerCost& w : r.workers) {
    inv_tok += 1 / w.s_per_token;
    if (w.s_per_seq > 0) inv_seq += 1 / w.s_per_seq; else seq_free = true;
    in.cpu_s_per_call = std::max(in.cpu_s_per_call, w.s_per_call);
  }
  in.cpu_s_per_token = 1 / inv_tok;
  in.cpu_s_per_seq = seq_free || inv_seq == 0 ? 0 : 1 / inv_seq;
  in.cpu_workers = int64_t(r.workers.size());
  return in;
}

HybridRates hybrid_rates_from_json(const json& j, const std::string& what) {
  const json* p = &j;
  if (p->is_object() && p->contains("engine_info")) p = &(*p)["engine_info"];
  if (p->is_object() && p->contains("prior")) p = &(*p)["prior"];
  if (!p->is_object()) throw ConfigError(what + ": expected a hybrid run's summary.json, its engine_info or its prior");
  const auto num = [&](const json& o, const char* key, const std::string& where) {
    if (!o.contains(key) || !o[key].is_number()) throw ConfigError(what + ": " + where + key + ": expected a number");
    return o[key].get<double>();
  };
  HybridRates r;
  if (!p->contains("s_part_per_layer") || !(*p)["s_part_per_layer"].is_array())
    throw ConfigError(what + ": s_part_per_layer: expected [[batch, seconds], ...] (is this a hybrid run's summary?)");
  std::vector<std::pair<double, double>> pts;
  for (const json& x : (*p)["s_part_per_layer"]) {
    if (!x.is_array() || x.size() != 2 || !x[0].is_number() || !x[1].is_number())
      throw ConfigError(what + ": s_part_per_layer: expected [[batch, seconds], ...]");
    pts.push_back({x[0].get<double>(), x[1].get<double>()});
  }
  r.s_part = TTable(pts);
  r.gpu_s_per_token = num(*p, "gpu_s_per_token", "");
  r.gpu_s_per_seq = num(*p, "gpu_s_per_seq", "");
  r.engage_s = num(*p, "engage_s", "");
  r.move_s_per_token = num(*p, "move_s_per_token", "");
  if (!p->contains("workers") || !(*p)["workers"].is_array()) throw ConfigError(what + ": workers: expected a list");
  for (size_t w = 0; w < (*p)["workers"].size(); ++w) {
    const json& x = (*p)["workers"][w];
    const std::string where = "workers[" + std::to_string(w) + "].";
    WorkerCost c;
    c.s_per_token = num(x, "s_per_token", where);
    c.s_per_seq = num(x, "s_per_seq", where);
    c.s_per_call = x.contains("s_per_call") ? num(x, "s_per_call", where) : 0;  // older runs: none measured
    r.workers.push_back(c);
  }
  try {
    r.validate();
  } catch (const ConfigError& e) {
    throw ConfigError(what + ": " + e.what());
  }
  return r;
}

static json point_json(const HybridModelPoint& p) {
  return {{"batch", p.batch}, {"cpu_seqs", p.cpu_seqs}, {"step_s", p.step_s}, {"tokens_per_s", p.tokens_per_s},
          {"binds", p.binds}};
}

json to_json(const HybridPlan& p) {
  return {{"modelled", true}, {"hybrid", point_json(p.hybrid)}, {"gpu_only", point_json(p.gpu_only)},
          {"fastdecode", point_json(p.fastdecode)}};
}

std::string format_hybrid_line(const HybridPlan& p) {
  char buf[512];
  const double frac = p.hybrid.batch > 0 ? double(p.hybrid.cpu_seqs) / double(p.hybrid.batch) : 0;
  std::snprintf(buf, sizeof buf,
                "hybrid (MODELLED): %lld of B = %lld sequences on the CPUs (%.0f %%); tokens/s %.0f vs gpu-only %.0f "
                "(B = %lld) and FastDecode %.0f (B = %lld); %s side binds",
                (long long)p.hybrid.cpu_seqs, (long long)p.hybrid.batch, 100 * frac, p.hybrid.tokens_per_s,
                p.gpu_only.tokens_per_s, (long long)p.gpu_only.batch, p.fastdecode.tokens_per_s,
                (long long)p.fastdecode.batch, p.hybrid.binds.empty() ? "no" : p.hybrid.binds.c_str());
  return buf;
}

}  // namespace fd
