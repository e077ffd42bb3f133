#include "fastdecode/sched/perf_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "fastdecode/core/error.h"

namespace fd {

TTable::TTable(std::vector<std::pair<double, double>> points) : pts_(std::move(points)) {
  if (pts_.empty()) throw ConfigError("T(B) table: no points");
  for (size_t i = 0; i < pts_.size(); ++i) {
    const auto [b, t] = pts_[i];
    if (!(std::isfinite(b) && b >= 1)) throw ConfigError("T(B) table: point " + std::to_string(i) + ": B must be >= 1");
    if (!(std::isfinite(t) && t > 0)) throw ConfigError("T(B) table: point " + std::to_string(i) + ": time must be > 0");
    if (i > 0 && !(b > pts_[i - 1].first))
      throw ConfigError("T(B) table: B must be strictly increasing (point " + std::to_string(i) + ")");
  }
}

double TTable::at(double b) const {
  FD_CHECK(!pts_.empty(), "T(B) table is empty");
  if (b <= pts_.front().first) return pts_.front().second;  // floor: reading the weights costs T(B_first)
  if (pts_.size() == 1) return pts_.front().second * b / pts_.front().first;  // one point: proportional above
  size_t i = 1;
  while (i + 1 < pts_.size() && b > pts_[i].first) ++i;
  // b in (B_{i-1}, B_i], or beyond the last point (i = last): the same line, extrapolated.
  const auto [b0, t0] = pts_[i - 1];
  const auto [b1, t1] = pts_[i];
  return std::max(t0 + (t1 - t0) * (b - b0) / (b1 - b0), 1e-300);
}

Profile parse_profile(const json& j, const std::string& file) {
  StrictObject o(j, file, "");
  Profile p;
  const json& tb = o.get_raw("t_b");
  if (!tb.is_array() || tb.empty()) o.fail("t_b", "must be a non-empty array of [B, seconds] pairs");
  std::vector<std::pair<double, double>> pts;
  for (size_t i = 0; i < tb.size(); ++i) {
    const json& e = tb[i];
    if (!e.is_array() || e.size() != 2 || !e[0].is_number() || !e[1].is_number())
      o.fail("t_b", "entry " + std::to_string(i) + " must be [B, seconds]");
    pts.emplace_back(e[0].get<double>(), e[1].get<double>());
  }
  try {
    p.t = TTable(std::move(pts));
  } catch (const ConfigError& e) {
    o.fail("t_b", e.what());
  }
  const json& r = o.get_raw("r_s_per_token_layer");
  if (!r.is_object() || r.empty()) o.fail("r_s_per_token_layer", "must be an object {kv_dtype: seconds}");
  for (const auto& [k, v] : r.items()) {
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
      o.fail("r_s_per_token_layer", k + " must be a number > 0");
    p.r_s_per_token_layer[k] = v.get<double>();
  }
  p.layers = o.get_int("layers", 1, 1 << 20, 0);
  o.accept({"provenance", "method", "backend", "r_threads", "sm_count", "r_service", "head_b"});  // written by fd-bench profile
  o.finish();
  return p;
}

Profile load_profile(const std::string& path) { return parse_profile(read_json_file(path), path); }

double e_of_b(const TTable& t, double b) { return b / t.at(b); }

int64_t knee_batch(const TTable& t, double fraction) {
  FD_CHECK(fraction > 0 && fraction <= 1, "knee fraction must be in (0, 1]");
  const int64_t lo = int64_t(std::ceil(t.b_first())), hi = int64_t(std::floor(t.b_last()));
  double emax = 0;
  for (int64_t b = lo; b <= hi; ++b) emax = std::max(emax, e_of_b(t, double(b)));
  for (int64_t b = lo; b <= hi; ++b)
    if (e_of_b(t, double(b)) >= fraction * emax) return b;
  return hi;
}

int64_t latency_batch(const TTable& t, int64_t layers, int64_t seq, double latency_s) {
  const int64_t lo = int64_t(std::ceil(t.b_first())), hi = int64_t(std::floor(t.b_last()));
  // 2·N·S·T(B) <= L, with a relative tolerance of 1e-12 so a bound met exactly on paper is met here.
  for (int64_t b = hi; b >= lo; --b)
    if (2.0 * double(layers) * double(seq) * t.at(double(b)) <= latency_s * (1 + 1e-12)) return b;
  return 0;
}

double cpus_needed(double batch, double seq, double r, double t_b) { return batch * seq * r / (2.0 * t_b); }

double tokens_per_s_s_bound(double batch, int64_t layers, double t_b) { return batch / (double(layers) * t_b); }

double tokens_per_s_r_bound(double cpus, int64_t layers, double seq, double r) {
  return 2.0 * cpus / (double(layers) * seq * r);
}

Plan make_plan(const PlanInput& in) {
  FD_CHECK(!in.t.empty(), "plan: T(B) table is empty");
  FD_CHECK(in.layers >= 1 && in.seq >= 1 && in.r_s_per_token_layer > 0, "plan: layers, seq and R must be positive");
  FD_CHECK(in.socket_cores >= 0, "plan: socket_cores must be >= 0");
  FD_CHECK(!in.cpus_available || *in.cpus_available > 0, "plan: cpus_available must be > 0");
  Plan p;
  p.socket_cores = in.socket_cores;
  p.socket_name = in.socket_name;
  if (in.latency_s) {
    p.batch_rule = "latency";
    p.batch = latency_batch(in.t, in.layers, in.seq, *in.latency_s);
  } else {
    p.batch_rule = "knee";
    p.batch = knee_batch(in.t, in.knee_fraction);
  }
  const int64_t lo = int64_t(std::ceil(in.t.b_first())), hi = int64_t(std::floor(in.t.b_last()));
  for (int64_t b = lo; b <= hi; ++b) p.e_max = std::max(p.e_max, e_of_b(in.t, double(b)));
  if (p.batch == 0) return p;  // nothing meets the latency bound
  const double B = double(p.batch), S = double(in.seq), R = in.r_s_per_token_layer;
  p.t_b_s = in.t.at(B);
  p.e_b = B / p.t_b_s;
  p.seq_latency_s = 2.0 * double(in.layers) * S * p.t_b_s;
  p.cpus_needed = cpus_needed(B, S, R, p.t_b_s);
  if (in.cpus_available) {
    p.cpus_used = *in.cpus_available;
    p.cpus_used_reason = "--cpus-available";
  } else if (p.cpus_needed < 1) {
    p.cpus_used = 1;  // an R-worker is at least one CPU, however little R-Part work there is
    p.cpus_used_reason = "at least one R-worker CPU";
  } else {
    p.cpus_used = std::ceil(p.cpus_needed);
    if (p.cpus_used != p.cpus_needed) p.cpus_used_reason = "rounded up to whole CPUs";
  }
  if (p.socket_cores > 0) p.sockets_needed = p.cpus_needed / double(p.socket_cores);
  p.tokens_per_s_s_bound = tokens_per_s_s_bound(B, in.layers, p.t_b_s);
  p.tokens_per_s_r_bound = tokens_per_s_r_bound(p.cpus_used, in.layers, S, R);
  p.tokens_per_s = std::min(p.tokens_per_s_s_bound, p.tokens_per_s_r_bound);
  p.binds = std::string(1, p.tokens_per_s_s_bound <= p.tokens_per_s_r_bound ? 'S' : 'R');  // (a const char* here: GCC 12's -Wstringop-overflow false positive)
  return p;
}

json to_json(const Plan& p) {
  return {{"batch", p.batch},
          {"batch_rule", p.batch_rule},
          {"t_b_s", p.t_b_s},
          {"e_b", p.e_b},
          {"e_max", p.e_max},
          {"seq_latency_s", p.seq_latency_s},
          {"cpus_needed", p.cpus_needed},
          {"cpus_used", p.cpus_used},
          {"cpus_used_reason", p.cpus_used_reason},
          {"sockets_needed", p.socket_cores > 0 ? json(p.sockets_needed) : json(nullptr)},
          {"socket_cores", p.socket_cores > 0 ? json(p.socket_cores) : json(nullptr)},
          {"socket_name", p.socket_cores > 0 ? json(p.socket_name) : json(nullptr)},
          {"tokens_per_s_s_bound", p.tokens_per_s_s_bound},
          {"tokens_per_s_r_bound", p.tokens_per_s_r_bound},
          {"tokens_per_s", p.tokens_per_s},
          {"binds", p.binds}};
}

std::string format_count(double x) {
  char buf[64];
  if (std::fabs(x) >= 100) std::snprintf(buf, sizeof buf, "%.0f", x);
  else std::snprintf(buf, sizeof buf, "%.3g", x);
  return buf;
}

std::string format_cpus_line(const Plan& p) {
  std::string s = "CPUs needed P = B·S·R/(2·T(B)) = " + format_count(p.cpus_needed) + " cores";
  if (p.socket_cores > 0)
    s += " = " + format_count(p.sockets_needed) + " sockets of " + p.socket_name + " (" + std::to_string(p.socket_cores) +
         " cores each)";
  s += "; using " + format_count(p.cpus_used);
  if (!p.cpus_used_reason.empty()) s += " (" + p.cpus_used_reason + ")";
  return s;
}

}  // namespace fd
