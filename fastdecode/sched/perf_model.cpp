#include "fastdecode/sched/perf_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

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

namespace {

// A [[B, seconds], ...] table of a profile (t_b, head_b).
TTable parse_pairs(StrictObject& o, const std::string& key, const json& a) {
  if (!a.is_array() || a.empty()) o.fail(key, "must be a non-empty array of [B, seconds] pairs");
  std::vector<std::pair<double, double>> pts;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_array() || a[i].size() != 2 || !a[i][0].is_number() || !a[i][1].is_number())
      o.fail(key, "entry " + std::to_string(i) + " must be [B, seconds]");
    pts.emplace_back(a[i][0].get<double>(), a[i][1].get<double>());
  }
  try {
    return TTable(std::move(pts));
  } catch (const ConfigError& e) {
    o.fail(key, e.what());
  }
  return {};
}

// r_service (harness/profile_service.cpp): the options and a row per (KV dtype, B, context); every dtype's grid whole.
ServiceTable parse_service(StrictObject& o, const json& r) {
  ServiceTable t;
  const auto num = [&](const char* k) -> int64_t {
    if (!r.contains(k) || !r[k].is_number_integer() || r[k].get<int64_t>() < 1) o.fail(std::string("r_service.") + k, "must be an integer >= 1");
    return r[k].get<int64_t>();
  };
  t.workers = num("workers"), t.threads = num("threads"), t.layers = num("layers");
  if (!r.contains("rows") || !r["rows"].is_array() || r["rows"].empty()) o.fail("r_service.rows", "must be a non-empty array");
  std::map<std::string, std::map<std::pair<double, double>, std::pair<double, double>>> cells;
  std::set<double> bs, cs;
  for (const json& row : r["rows"]) {
    const bool ok = row.is_object() && row.contains("kv_dtype") && row["kv_dtype"].is_string() && row.contains("batch") &&
                    row["batch"].is_number() && row.contains("context") && row["context"].is_number() &&
                    row.contains("round_s_per_layer") && row["round_s_per_layer"].is_number() && row.contains("first_layer_s") &&
                    row["first_layer_s"].is_number() && row["round_s_per_layer"].get<double>() > 0;
    if (!ok) o.fail("r_service.rows", "each row needs kv_dtype, batch, context, round_s_per_layer > 0 and first_layer_s");
    const double b = row["batch"].get<double>(), c = row["context"].get<double>();
    bs.insert(b), cs.insert(c);
    cells[row["kv_dtype"].get<std::string>()][{b, c}] = {row["round_s_per_layer"].get<double>(), row["first_layer_s"].get<double>()};
  }
  t.batches.assign(bs.begin(), bs.end()), t.contexts.assign(cs.begin(), cs.end());
  for (const auto& [dtype, grid] : cells) {
    auto& rs = t.round_s[dtype];
    auto& fs = t.first_s[dtype];
    for (double b : t.batches)
      for (double c : t.contexts) {
        auto it = grid.find({b, c});
        if (it == grid.end())
          o.fail("r_service.rows", dtype + " has no row at B " + format_count(b) + ", context " + format_count(c) + ": the grid must be whole");
        rs.push_back(it->second.first), fs.push_back(it->second.second);
      }
  }
  return t;
}

// Where x falls on an increasing grid in log space: the two points around it and the fraction between them (held at
// the ends, with *outside set).
void log_cell(const std::vector<double>& xs, double x, size_t* i0, size_t* i1, double* f, bool* outside) {
  if (xs.size() == 1) {
    *i0 = *i1 = 0, *f = 0;
    if (x != xs[0]) *outside = true;
    return;
  }
  if (x < xs.front() || x > xs.back()) *outside = true;
  x = std::min(std::max(x, xs.front()), xs.back());
  size_t i = 1;
  while (i + 1 < xs.size() && x > xs[i]) ++i;
  *i0 = i - 1, *i1 = i;
  *f = (std::log(x) - std::log(xs[i - 1])) / (std::log(xs[i]) - std::log(xs[i - 1]));
}

}  // namespace

double ServiceTable::round_at(const std::string& dtype, double b, double ctx, bool* outside) const {
  auto it = round_s.find(dtype);
  if (it == round_s.end()) FD_THROW("the service profile has no " << dtype << " rows");
  FD_CHECK(b > 0 && ctx > 0, "round_at: B and context must be > 0");
  bool out = false;
  size_t b0, b1, c0, c1;
  double fb, fc;
  log_cell(batches, b, &b0, &b1, &fb, &out);
  log_cell(contexts, ctx, &c0, &c1, &fc, &out);
  const size_t nc = contexts.size();
  const auto lg = [&](size_t i, size_t j) { return std::log(it->second[i * nc + j]); };
  if (outside) *outside = out;
  return std::exp((1 - fb) * (1 - fc) * lg(b0, c0) + fb * (1 - fc) * lg(b1, c0) + (1 - fb) * fc * lg(b0, c1) + fb * fc * lg(b1, c1));
}

StepPrediction predict_step(const Profile& tb, const Profile& svc, const std::string& kv_dtype, double batch, double context,
                            int64_t layers, double busiest) {
  FD_CHECK(!tb.t.empty(), "predict_step: the GPU profile has no T(B)");
  if (svc.service.empty()) FD_THROW("predict_step: the profile has no r_service (fd-bench profile --service)");
  FD_CHECK(batch >= 1 && context > 0 && layers >= 1 && busiest >= 1,
           "predict_step: B >= 1, context > 0, layers >= 1 and busiest / mean >= 1");
  StepPrediction p;
  const double half = tb.t.at(batch / 2);
  p.s_layer_s = 2 * half;
  p.r_layer_s = busiest * svc.service.round_at(kv_dtype, batch, context, &p.outside_grid);
  p.fill_s = half;
  p.head_s = tb.head.empty() ? 0 : tb.head.at(batch);
  p.step_s = double(layers) * std::max(p.s_layer_s, p.r_layer_s) + p.fill_s + p.head_s;
  p.tokens_per_s = batch / p.step_s;
  p.binds = p.r_layer_s > p.s_layer_s ? "R" : "S";
  return p;
}

StepPrediction predict_gpu_only_step(const Profile& tb, double attn_s_per_token_layer, double batch, double context,
                                     int64_t layers) {
  FD_CHECK(!tb.t.empty(), "predict_gpu_only_step: the GPU profile has no T(B)");
  FD_CHECK(batch >= 1 && context > 0 && layers >= 1 && attn_s_per_token_layer > 0,
           "predict_gpu_only_step: B >= 1, context > 0, layers >= 1 and an attention rate > 0");
  StepPrediction p;
  p.s_layer_s = tb.t.at(batch);
  p.r_layer_s = batch * context * attn_s_per_token_layer;
  p.head_s = tb.head.empty() ? 0 : tb.head.at(batch);
  p.step_s = double(layers) * (p.s_layer_s + p.r_layer_s) + p.head_s;
  p.tokens_per_s = batch / p.step_s;
  p.binds = "GPU";
  return p;
}

json to_json(const StepPrediction& p) {
  return {{"s_layer_s", p.s_layer_s}, {"r_layer_s", p.r_layer_s}, {"fill_s", p.fill_s}, {"head_s", p.head_s},
          {"step_s", p.step_s},       {"tokens_per_s", p.tokens_per_s}, {"binds", p.binds}, {"outside_grid", p.outside_grid}};
}

Profile parse_profile(const json& j, const std::string& file) {
  StrictObject o(j, file, "");
  Profile p;
  p.t = parse_pairs(o, "t_b", o.get_raw("t_b"));
  const json& r = o.get_raw("r_s_per_token_layer");
  if (!r.is_object() || r.empty()) o.fail("r_s_per_token_layer", "must be an object {kv_dtype: seconds}");
  for (const auto& [k, v] : r.items()) {
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
      o.fail("r_s_per_token_layer", k + " must be a number > 0");
    p.r_s_per_token_layer[k] = v.get<double>();
  }
  p.layers = o.get_int("layers", 1, 1 << 20, 0);
  if (j.contains("head_b")) p.head = parse_pairs(o, "head_b", j["head_b"]);
  if (j.contains("sm_count") && j["sm_count"].is_number_integer()) p.sm_count = j["sm_count"].get<int64_t>();
  if (j.contains("r_service")) p.service = parse_service(o, j["r_service"]);
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
  if (in.batch) {
    FD_CHECK(*in.batch >= 1, "plan: the batch must be >= 1");
    p.batch_rule = "given";
    p.batch = *in.batch;
  } else if (in.latency_s) {
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
  if (in.r_socket > 0) p.sockets_by_bandwidth = cpus_needed(B, S, in.r_socket, p.t_b_s);
  p.tokens_per_s_s_bound = tokens_per_s_s_bound(B, in.layers, p.t_b_s);
  p.tokens_per_s_r_bound = tokens_per_s_r_bound(p.cpus_used, in.layers, S, R);
  p.tokens_per_s = std::min(p.tokens_per_s_s_bound, p.tokens_per_s_r_bound);
  p.binds = std::string(1, p.tokens_per_s_s_bound <= p.tokens_per_s_r_bound ? 'S' : 'R');  // (a const char* here: GCC 12's -Wstringop-overflow false positive)
  return p;
}

TTable datasheet_t_table(const GpuDatasheet& g, double layer_params, double b_max) {
  FD_CHECK(g.hbm_gbps > 0 && g.dense_tflops > 0 && g.hbm_efficiency > 0 && g.gemm_efficiency > 0 && layer_params > 0,
           "datasheet T(B): HBM GB/s, TFLOP/s, their efficiencies and the layer's parameters must be > 0");
  std::vector<std::pair<double, double>> pts;
  for (double b = 1; b <= std::max(1.0, b_max) * 2; b *= 2)
    pts.emplace_back(b, std::max(2 * 2 * layer_params / (g.hbm_gbps * 1e9 * g.hbm_efficiency),
                                 2 * layer_params * b / (g.dense_tflops * 1e12 * g.gemm_efficiency)));
  return TTable(std::move(pts));
}

double r_socket_s(double kv_bytes_per_token_layer, double socket_gbps) {
  FD_CHECK(kv_bytes_per_token_layer > 0 && socket_gbps > 0, "R of a socket: KV bytes and GB/s must be > 0");
  return kv_bytes_per_token_layer / (socket_gbps * 1e9);
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
          {"sockets_by_bandwidth", p.sockets_by_bandwidth > 0 ? json(p.sockets_by_bandwidth) : json(nullptr)},
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
