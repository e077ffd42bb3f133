#include "fastdecode/sched/schedule.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <unordered_set>

#include "fastdecode/core/error.h"
#include "fd_fault_sls_projection_drops_last_step.h"  // planted fault (scripts/fault-check.sh; fastdecode/core/fault.h)
#include "fastdecode/core/json_util.h"
#include "fastdecode/core/splitmix64.h"

namespace fd {

namespace {
constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

[[noreturn]] void config_fail(const std::string& what) { throw ConfigError(what); }
}  // namespace

AdmitMode parse_admit_mode(const std::string& s) {
  if (s == "all-at-once") return AdmitMode::AllAtOnce;
  if (s == "fixed-interval") return AdmitMode::FixedInterval;
  if (s == "load-control") return AdmitMode::LoadControl;
  config_fail("unknown scheduling mode '" + s + "' (all-at-once, fixed-interval, load-control)");
}

std::string to_string(AdmitMode m) {
  switch (m) {
    case AdmitMode::AllAtOnce: return "all-at-once";
    case AdmitMode::FixedInterval: return "fixed-interval";
    case AdmitMode::LoadControl: return "load-control";
  }
  return "?";
}

void validate(const SchedulerConfig& c) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) config_fail("scheduler: " + what);
  };
  need(c.batch >= 1, "batch must be >= 1, got " + std::to_string(c.batch));
  need(c.seq >= 1, "seq must be >= 1, got " + std::to_string(c.seq));
  need(c.interval >= 1, "interval must be >= 1, got " + std::to_string(c.interval));
  need(c.micro_batch >= 0, "micro_batch must be >= 0, got " + std::to_string(c.micro_batch));
  need(c.min_gap >= 0, "min_gap must be >= 0, got " + std::to_string(c.min_gap));
  need(c.max_running >= 0, "max_running must be >= 0, got " + std::to_string(c.max_running));
  need(c.kv_capacity_tokens >= 0, "kv_capacity_tokens must be >= 0, got " + std::to_string(c.kv_capacity_tokens));
  if (c.mode == AdmitMode::LoadControl) need(c.w_lim >= 1, "load-control needs w_lim >= 1, got " + std::to_string(c.w_lim));
}

int64_t fixed_interval_slot_size(int64_t batch, int64_t interval, int64_t seq, int64_t slot) {
  const __int128 bf = __int128(batch) * interval;
  const __int128 hi = (__int128(slot) + 1) * bf / seq, lo = __int128(slot) * bf / seq;
  return int64_t(hi - lo);
}

Scheduler::Scheduler(const SchedulerConfig& cfg) : cfg_(cfg) {
  validate(cfg_);
  if (cfg_.micro_batch == 0) {  // ceil(B·F/S), at least 1
    const __int128 bf = __int128(cfg_.batch) * cfg_.interval;
    cfg_.micro_batch = std::max<int64_t>(1, int64_t((bf + cfg_.seq - 1) / cfg_.seq));
  }
}

int64_t Scheduler::load_limit() const {
  int64_t lim = kNoLimit;
  if (cfg_.mode == AdmitMode::LoadControl) lim = std::min(lim, cfg_.w_lim);
  if (cfg_.kv_capacity_tokens > 0) lim = std::min(lim, cfg_.kv_capacity_tokens);
  return lim;
}

void Scheduler::submit(const SchedRequest& r) {
  const std::string who = "request " + std::to_string(r.id);
  if (!(std::isfinite(r.arrival_s) && r.arrival_s >= 0.0)) config_fail(who + ": arrival_s must be finite and >= 0");
  if (r.arrival_s < last_arrival_)
    config_fail(who + ": arrival_s " + std::to_string(r.arrival_s) + " < previous " + std::to_string(last_arrival_) +
                " (submit in arrival order)");
  if (r.prompt_len < 0) config_fail(who + ": prompt_len must be >= 0");
  if (r.max_gen_len < 1) config_fail(who + ": max_gen_len must be >= 1");
  // Alone, the sequence peaks at p + g on its last step: if that exceeds the limit it can never start.
  const int64_t lim = load_limit();
  if (r.prompt_len + r.max_gen_len > lim)
    config_fail(who + ": its own peak context prompt_len + max_gen_len = " + std::to_string(r.prompt_len + r.max_gen_len) +
                " exceeds the admission limit " + std::to_string(lim) + " (w_lim / kv capacity): it could never start");
  last_arrival_ = r.arrival_s;
  queue_.push_back(r);
}

int64_t Scheduler::arrived(double now_s) const {
  int64_t n = 0;
  for (const auto& r : queue_) {
    if (r.arrival_s > now_s) break;
    ++n;
  }
  return n;
}

std::optional<double> Scheduler::next_arrival_s() const {
  if (queue_.empty()) return std::nullopt;
  return queue_.front().arrival_s;
}

int64_t Scheduler::projected_load(int64_t t) const {
  int64_t w = 0;
  for (const auto& [id, s] : running_)
    if (t >= s.admit_step && t <= s.last_step()) w += s.prompt_len + (t - s.admit_step + 1);
  return w;
}

std::vector<int64_t> Scheduler::projected_profile(int64_t from, int64_t n, const std::vector<SchedRequest>& batch) const {
  // W(t) = sum over alive sequences of (p - a + 1) + t: difference arrays of the constant part and the
  // number alive, O(#sequences + n).
  std::vector<int64_t> dc(size_t(n) + 1, 0), dn(size_t(n) + 1, 0);
  auto add = [&](int64_t a, int64_t p, int64_t g) {
#ifdef FD_FAULT_SLS_PROJECTION_DROPS_LAST_STEP  // planted fault: each sequence's projected life ends a step early,
    const int64_t lo = std::max(a, from), hi = std::min(a + g - 2, from + n - 1);  // so its peak (last step) is not counted
#else
    const int64_t lo = std::max(a, from), hi = std::min(a + g - 1, from + n - 1);
#endif
    if (lo > hi) return;
    dc[size_t(lo - from)] += p - a + 1;
    dc[size_t(hi - from + 1)] -= p - a + 1;
    dn[size_t(lo - from)] += 1;
    dn[size_t(hi - from + 1)] -= 1;
  };
  for (const auto& [id, s] : running_) add(s.admit_step, s.prompt_len, s.max_gen_len);
  for (const auto& r : batch) add(from, r.prompt_len, r.max_gen_len);
  std::vector<int64_t> w(static_cast<size_t>(n), 0);
  int64_t c = 0, k = 0;
  for (int64_t i = 0; i < n; ++i) {
    c += dc[size_t(i)];
    k += dn[size_t(i)];
    w[size_t(i)] = c + k * (from + i);
  }
  return w;
}

namespace {
int64_t horizon(int64_t from, int64_t max_last_step, const std::vector<SchedRequest>& batch) {
  int64_t n = std::max<int64_t>(1, max_last_step - from + 1);
  for (const auto& r : batch) n = std::max(n, r.max_gen_len);
  return n;
}
}  // namespace

bool Scheduler::fits(int64_t s, const std::vector<SchedRequest>& batch) const {
  const int64_t lim = load_limit();
  if (lim == kNoLimit) return true;
  int64_t last = -1;
  for (const auto& [id, r] : running_) last = std::max(last, r.last_step());
  const auto w = projected_profile(s, horizon(s, last, batch), batch);
  return *std::max_element(w.begin(), w.end()) <= lim;
}

int64_t Scheduler::earliest_feasible_step(int64_t from, const std::vector<SchedRequest>& batch) const {
  int64_t last = from;
  for (const auto& [id, r] : running_) last = std::max(last, r.last_step());
  // Past the last running sequence's end the batch is alone: feasible then or never.
  for (int64_t s = from; s <= last + 1; ++s)
    if (fits(s, batch)) return s;
  return -1;
}

int64_t Scheduler::fitting_prefix(int64_t step, double now_s, int64_t limit) const {
  int64_t n = 0;
  for (const auto& r : queue_) {
    if (n >= limit || r.arrival_s > now_s) break;
    ++n;
  }
  const int64_t lim = load_limit();
  if (n == 0 || lim == kNoLimit) return n;
  int64_t last = -1;
  for (const auto& [id, r] : running_) last = std::max(last, r.last_step());
  int64_t gmax = 1;
  for (int64_t i = 0; i < n; ++i) gmax = std::max(gmax, queue_[size_t(i)].max_gen_len);
  std::vector<int64_t> w = projected_profile(step, std::max(gmax, std::max<int64_t>(1, last - step + 1)), {});
  if (*std::max_element(w.begin(), w.end()) > lim) return 0;
  // Adding requests one at a time only raises the profile on the new request's own life.
  for (int64_t i = 0; i < n; ++i) {
    const auto& r = queue_[size_t(i)];
    for (int64_t k = 1; k <= r.max_gen_len; ++k)
      if (w[size_t(k - 1)] + r.prompt_len + k > lim) return i;
    for (int64_t k = 1; k <= r.max_gen_len; ++k) w[size_t(k - 1)] += r.prompt_len + k;
  }
  return n;
}

void Scheduler::start(const SchedRequest& r, int64_t step, std::vector<RequestId>& out) {
  FD_CHECK(running_.count(r.id) == 0, "request " << r.id << " is already running");
  running_.emplace(r.id, Running{step, r.prompt_len, r.max_gen_len, !cfg_.deferred_starts});
  out.push_back(r.id);
}

std::vector<RequestId> Scheduler::admit(int64_t step, double now_s) {
  FD_CHECK(step > last_step_, "admit: steps must increase (got " << step << " after " << last_step_ << ")");
  for (auto& [id, s] : running_) {
    if (!s.started) s.admit_step = std::max(s.admit_step, step);  // not started yet: its life slides
    FD_CHECK(s.last_step() >= step,
             "sequence " << id << " ran past its max length (last step " << s.last_step() << ") without on_finished");
  }
  last_step_ = step;
  std::vector<RequestId> out;
  auto take = [&](int64_t k) {
    for (int64_t i = 0; i < k; ++i) {
      start(queue_.front(), step, out);
      queue_.pop_front();
    }
  };
  switch (cfg_.mode) {
    case AdmitMode::AllAtOnce:
      if (running_.empty()) take(fitting_prefix(step, now_s, cfg_.batch));
      break;
    case AdmitMode::FixedInterval:
      if (step >= next_slot_) {
        const int64_t k = fitting_prefix(step, now_s, fixed_interval_slot_size(cfg_.batch, cfg_.interval, cfg_.seq, slot_));
        if (k > 0) {
          take(k);
          ++slot_;
          next_slot_ = step + cfg_.interval;
        }
      }
      break;
    case AdmitMode::LoadControl:
      for (;;) {
        if (cfg_.min_gap > 0 && last_lc_admit_ >= 0 && step < last_lc_admit_ + cfg_.min_gap) break;
        const size_t before = out.size();
        int64_t cap = cfg_.micro_batch;
        if (cfg_.max_running > 0) cap = std::min(cap, cfg_.max_running - running());
        if (cap <= 0) break;
        std::vector<SchedRequest> batch;
        for (const auto& r : queue_) {
          if (int64_t(batch.size()) >= cap || r.arrival_s > now_s) break;
          batch.push_back(r);
        }
        if (batch.empty()) break;
        if (!fits(step, batch)) {
          // Nothing running and still too big for the limit: start the longest prefix that fits (at
          // least one request fits alone, submit() checked), so the queue cannot block forever.
          if (running_.empty()) take(fitting_prefix(step, now_s, int64_t(batch.size())));
          if (out.size() > before) last_lc_admit_ = step;
          break;
        }
        take(int64_t(batch.size()));
        last_lc_admit_ = step;
        if (cfg_.min_gap > 0) break;  // paced: one micro-batch per step
      }
      break;
  }
  return out;
}

void Scheduler::on_started(RequestId id, int64_t step) {
  auto it = running_.find(id);
  FD_CHECK(it != running_.end(), "on_started: request " << id << " is not running");
  FD_CHECK(!it->second.started, "on_started: request " << id << " already started");
  FD_CHECK(step >= it->second.admit_step, "on_started: request " << id << " started at step " << step
                                                                   << " before its admission at " << it->second.admit_step);
  it->second.admit_step = step;
  it->second.started = true;
}

void Scheduler::on_step_done(const std::vector<RequestId>& advanced) {
  std::unordered_set<RequestId> got(advanced.begin(), advanced.end());
  for (auto& [id, s] : running_)
    if (s.started && !got.count(id)) ++s.admit_step;
}

void Scheduler::on_finished(RequestId id, int64_t step) {
  auto it = running_.find(id);
  FD_CHECK(it != running_.end(), "on_finished: request " << id << " is not running");
  FD_CHECK(step >= it->second.admit_step && step <= it->second.last_step(),
           "on_finished: request " << id << " finished at step " << step << " outside its life ["
                                   << it->second.admit_step << ", " << it->second.last_step() << "]");
  running_.erase(it);
}

// ---- arrivals ---------------------------------------------------------------------------------------

std::vector<double> poisson_arrivals(int64_t n, double rate_per_s, uint64_t seed) {
  if (n < 0) config_fail("poisson arrivals: n must be >= 0");
  if (!(std::isfinite(rate_per_s) && rate_per_s > 0)) config_fail("poisson arrivals: rate must be finite and > 0");
  std::vector<double> t(static_cast<size_t>(n), 0.0);
  const uint64_t base = splitmix64(seed ^ 0x706f6973736f6e00ull);  // "poisson"
  double now = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double u = double(splitmix64(base + uint64_t(i)) >> 11) * 0x1p-53;  // [0, 1)
    now += -std::log1p(-u) / rate_per_s;                                     // Exp(rate) by inverse CDF
    t[size_t(i)] = now;
  }
  return t;
}

std::vector<TraceRequest> load_trace_jsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) config_fail(path + ": cannot open trace file");
  std::vector<TraceRequest> out;
  std::string line;
  int64_t lineno = 0;
  double prev = 0.0;
  static const std::set<std::string> kKeys = {"arrival_s", "prompt_len", "gen_len", "max_gen_len"};
  while (std::getline(in, line)) {
    ++lineno;
    const std::string where = path + ":" + std::to_string(lineno) + ": ";
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::parse_error& e) {
      config_fail(where + "bad JSON: " + e.what());
    }
    if (!j.is_object()) config_fail(where + "expected a JSON object");
    for (const auto& [k, v] : j.items())
      if (!kKeys.count(k)) config_fail(where + "unknown key '" + k + "' (arrival_s, prompt_len, gen_len, max_gen_len)");
    auto get_int = [&](const char* k, bool required, int64_t lo, int64_t def) -> int64_t {
      if (!j.contains(k)) {
        if (required) config_fail(where + "missing key '" + k + "'");
        return def;
      }
      const json& v = j[k];
      if (!v.is_number_integer()) config_fail(where + "'" + k + "' must be an integer");
      const int64_t x = v.get<int64_t>();
      if (x < lo) config_fail(where + "'" + k + "' = " + std::to_string(x) + " must be >= " + std::to_string(lo));
      return x;
    };
    TraceRequest r;
    if (!j.contains("arrival_s")) config_fail(where + "missing key 'arrival_s'");
    if (!j["arrival_s"].is_number()) config_fail(where + "'arrival_s' must be a number");
    r.arrival_s = j["arrival_s"].get<double>();
    if (!(std::isfinite(r.arrival_s) && r.arrival_s >= 0)) config_fail(where + "'arrival_s' must be finite and >= 0");
    if (r.arrival_s < prev) config_fail(where + "'arrival_s' decreases (trace must be sorted by arrival)");
    prev = r.arrival_s;
    r.prompt_len = get_int("prompt_len", true, 0, 0);
    r.gen_len = get_int("gen_len", true, 1, 1);
    r.max_gen_len = get_int("max_gen_len", false, r.gen_len, r.gen_len);
    out.push_back(r);
  }
  if (out.empty()) config_fail(path + ": trace holds no requests");
  return out;
}

}  // namespace fd
