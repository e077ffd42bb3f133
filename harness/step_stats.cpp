#include "harness/step_stats.h"

#include <algorithm>

#include "fastdecode/core/error.h"
#include "harness/runner.h"

namespace fd {

namespace {

// The step times of `steps` (those passing `keep`), or nullopt when one of them is unknown.
template <class Keep>
std::optional<std::vector<double>> times(const std::vector<StepStat>& steps, size_t begin, size_t end, Keep keep) {
  std::vector<double> v;
  for (size_t i = begin; i < end; ++i) {
    if (!keep(steps[i])) continue;
    if (!steps[i].step_ms) return std::nullopt;
    v.push_back(*steps[i].step_ms);
  }
  return v;
}

double sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

// tokens over the summed step time (ms); 0 for no time, null when a time is unknown.
json rate(int64_t tokens, const std::optional<std::vector<double>>& ms) {
  if (!ms) return nullptr;
  const double total = sum(*ms);
  return total > 0 ? double(tokens) / (total / 1e3) : 0.0;
}

json dist_or_null(const std::optional<std::vector<double>>& ms) { return ms ? distribution(*ms) : json(nullptr); }

}  // namespace

bool decode_only(const StepStat& s) { return s.prefill_tokens == 0 && s.decode_tokens > 0; }

SteadyWindow steady_window(const std::vector<StepStat>& steps) {
  SteadyWindow w;
  std::optional<int64_t> last_admit, first_finish;
  for (const auto& s : steps) {
    if (s.admitted > 0) last_admit = s.step;
    if (s.finished > 0 && !first_finish) first_finish = s.step;
  }
  if (last_admit && first_finish) {
    const int64_t lo = std::min(*last_admit, *first_finish), hi = std::max(*last_admit, *first_finish);
    w.begin = steps.size();
    for (size_t i = 0; i < steps.size(); ++i) {
      if (steps[i].step <= lo || steps[i].step >= hi) continue;
      if (w.begin == steps.size()) w.begin = i;
      w.end = i + 1;
    }
    const std::string la = "last admission (step " + std::to_string(*last_admit) + ")",
                      ff = "first finish (step " + std::to_string(*first_finish) + ")";
    if (w.end > 0) {
      w.rule = *last_admit < *first_finish ? "after the " + la + ", before the " + ff
                                           : "after the " + ff + ", before the " + la;
    } else {
      w.rule = "whole run: no step lies strictly between the " + la + " and the " + ff;
      w.whole_run = true;
    }
  } else {
    w.rule = std::string("whole run: ") + (steps.empty() ? "no step" : !last_admit ? "no admission" : "no request finished");
    w.whole_run = true;
  }
  if (w.whole_run) w.begin = 0, w.end = steps.size();
  if (w.end > w.begin) w.first_step = steps[w.begin].step, w.last_step = steps[w.end - 1].step;
  return w;
}

json worker_imbalance_stats(const std::vector<StepStat>& steps, const std::vector<double>& per_step) {
  FD_CHECK(per_step.size() == steps.size(), "worker_imbalance_stats: " << per_step.size() << " values for " << steps.size() << " steps");
  std::vector<double> dec, steady;
  const SteadyWindow win = steady_window(steps);
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!decode_only(steps[i]) || per_step[i] <= 0) continue;
    dec.push_back(per_step[i]);
    if (win.whole_run || (i >= win.begin && i < win.end)) steady.push_back(per_step[i]);
  }
  if (dec.empty()) return nullptr;
  return {{"decode_only", distribution(dec)}, {"steady", distribution(steady)}};
}

json slo_stats(std::optional<double> ttft_ms, std::optional<double> tpot_ms, std::optional<double> e2e_ms,
               const std::vector<RequestLatency>& requests, double duration_s) {
  const auto opt = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
  if (!ttft_ms && !tpot_ms && !e2e_ms)
    return {{"limits", nullptr}, {"requests", requests.size()}, {"good_requests", nullptr}, {"attainment", nullptr},
            {"goodput_requests_per_s", nullptr}, {"goodput_tokens_per_s", nullptr}};
  int64_t good = 0, good_tokens = 0;
  for (const RequestLatency& r : requests) {
    const double tpot = r.output_tokens > 1 ? (r.e2e_ms - r.ttft_ms) / double(r.output_tokens - 1) : 0.0;
    const bool ok = (!ttft_ms || r.ttft_ms <= *ttft_ms) && (!tpot_ms || tpot <= *tpot_ms) && (!e2e_ms || r.e2e_ms <= *e2e_ms);
    if (ok) ++good, good_tokens += r.output_tokens;
  }
  const bool timed = duration_s > 0;
  return {{"limits", {{"ttft_ms", opt(ttft_ms)}, {"tpot_ms", opt(tpot_ms)}, {"e2e_ms", opt(e2e_ms)}}},
          {"requests", requests.size()},
          {"good_requests", good},
          {"attainment", requests.empty() ? json(nullptr) : json(double(good) / double(requests.size()))},
          {"goodput_requests_per_s", timed ? json(double(good) / duration_s) : json(nullptr)},
          {"goodput_tokens_per_s", timed ? json(double(good_tokens) / duration_s) : json(nullptr)}};
}

json decode_only_stats(const std::vector<StepStat>& steps) {
  int64_t n = 0, tokens = 0;
  for (const auto& s : steps)
    if (decode_only(s)) ++n, tokens += s.decode_tokens;
  const auto ms = times(steps, 0, steps.size(), decode_only);
  return {{"steps", n}, {"tokens", tokens}, {"tokens_per_s", rate(tokens, ms)}, {"step_ms", dist_or_null(ms)}};
}

json steady_stats(const std::vector<StepStat>& steps) {
  const SteadyWindow w = steady_window(steps);
  int64_t tokens = 0;
  double batch = 0, ctx = 0;
  for (size_t i = w.begin; i < w.end; ++i) {
    tokens += steps[i].new_tokens;
    batch += double(steps[i].decode_tokens);
    ctx += double(steps[i].total_context);
  }
  const size_t n = w.end - w.begin;
  const auto ms = times(steps, w.begin, w.end, [](const StepStat&) { return true; });
  return {{"first_step", w.first_step},
          {"last_step", w.last_step},
          {"steps", n},
          {"rule", w.rule},
          {"tokens", tokens},
          {"tokens_per_s", rate(tokens, ms)},
          {"step_ms", dist_or_null(ms)},
          {"decode_step_ms", dist_or_null(times(steps, w.begin, w.end, decode_only))},
          {"mean_batch", n ? batch / double(n) : 0.0},
          {"mean_total_context", n ? ctx / double(n) : 0.0}};
}

json full_depth_equivalent(int64_t layers, int64_t full_layers, const json& results) {
  if (layers <= 0 || layers >= full_layers) return nullptr;
  const double f = double(layers) / double(full_layers);
  // results[a][b] scaled by f; null when absent or not a number (e.g. no decode-only step time).
  auto scaled = [&](const char* a, const char* b = nullptr) -> json {
    if (!results.contains(a)) return nullptr;
    const json& v = b ? (results[a].is_object() && results[a].contains(b) ? results[a][b] : json()) : results[a];
    return v.is_number() ? json(v.get<double>() * f) : json(nullptr);
  };
  return {{"layers", layers},
          {"full_layers", full_layers},
          {"factor", f},
          {"output_throughput", scaled("output_throughput")},
          {"decode_tokens_per_s", scaled("decode_only", "tokens_per_s")},
          {"steady_tokens_per_s", scaled("steady", "tokens_per_s")},
          {"basis", "extrapolated, not measured: the measured rate x layers / full_layers, assuming step time linear "
                    "in the layer count with no fixed part (Fig. 8); that is an upper bound of the full-depth step "
                    "time, so these rates are lower bounds"}};
}

}  // namespace fd
