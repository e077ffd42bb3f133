#include "harness/sweep.h"

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "fastdecode/core/clock.h"
#include "fastdecode/model/weights.h"
#include "harness/experiment.h"
#include "harness/provenance.h"
#include "harness/runner.h"

namespace fd {

namespace fs = std::filesystem;

namespace {

// A dotted config key as --set takes it: non-empty components, no '='.
void check_key(const StrictObject& o, const std::string& field, const std::string& key) {
  if (key.empty() || key.find('=') != std::string::npos || key.front() == '.' || key.back() == '.' ||
      key.find("..") != std::string::npos)
    o.fail(field, "'" + key + "' is not a dotted config key (e.g. workload.requests)");
}

std::string last_component(const std::string& key) {
  const size_t d = key.rfind('.');
  return d == std::string::npos ? key : key.substr(d + 1);
}

// Every character outside [A-Za-z0-9.-] becomes '-' ('_' joins the axes of a folder name).
std::string filesystem_safe(const std::string& s) {
  std::string out = s;
  for (char& c : out) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-';
    if (!ok) c = '-';
  }
  return out;
}

std::string raw_label(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  std::string s;
  if (v.is_array()) {
    for (const json& x : v) s += (s.empty() ? "" : "-") + raw_label(x);
    return s;
  }
  if (v.is_object()) {
    for (const auto& [k, x] : v.items()) s += (s.empty() ? "" : "-") + k + "-" + raw_label(x);
    return s;
  }
  return v.dump();  // number, true/false, null
}

std::string fmt_duration(double s) {
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%dm%02ds", int(s / 60), int(s) % 60);
  else
    std::snprintf(buf, sizeof buf, "%dh%02dm", int(s / 3600), (int(s) % 3600) / 60);
  return buf;
}

// A run folder whose summary.json reads as JSON holds a finished run (run_experiment writes it last), unless
// it says "status": "failed" or "incomplete" (a run that failed or was killed mid-way keeps its folder and is redone).
bool finished_run(const fs::path& dir, json* summary = nullptr) {
  const fs::path f = dir / "summary.json";
  if (!fs::is_regular_file(f)) return false;
  try {
    json j = read_json_file(f.string());
    if (!j.is_object() || j.value("status", "ok") == "failed" || j.value("status", "ok") == "incomplete") return false;
    if (summary) *summary = std::move(j);
    return true;
  } catch (const Error&) {
    return false;  // cut short while being written: the run is redone
  }
}

void write_index(const fs::path& out, const json& index) {
  const fs::path tmp = out / "index.json.tmp";
  write_json_file(tmp.string(), index);
  fs::rename(tmp, out / "index.json");  // atomic: a killed sweep leaves the previous index whole
}

// A value's label in folder names: its "labels" entry, else made from the value.
std::string axis_label(const SweepAxis& a, size_t i) {
  return a.labels.empty() ? sweep_value_label(a.values[i]) : filesystem_safe(a.labels[i]);
}

// A "quick" entry names a value by the value itself or by its label ("labels" entry or made from the value).
bool quick_matches(const SweepAxis& a, size_t i, const json& entry) {
  if (entry == a.values[i]) return true;
  if (!entry.is_string()) return false;
  return a.labels.empty() ? entry.get<std::string>() == sweep_value_label(a.values[i]) : entry == a.labels[i];
}

// "KEY.PATH=VALUE" strings of a "set" list.
std::vector<std::string> parse_sets(StrictObject& o, const std::string& key) {
  std::vector<std::string> out;
  const json& set = o.get_raw(key);
  if (set.is_null()) return out;
  if (!set.is_array()) o.fail(key, "expected a list of \"KEY.PATH=VALUE\" strings");
  for (const json& x : set) {
    if (!x.is_string() || x.get<std::string>().find('=') == std::string::npos)
      o.fail(key, x.dump() + " is not a \"KEY.PATH=VALUE\" string");
    out.push_back(x.get<std::string>());
  }
  return out;
}

}  // namespace

std::string sweep_value_label(const json& v) {
  const std::string s = filesystem_safe(raw_label(v));
  if (s.size() <= 40) return s;
  char hash[20];
  std::snprintf(hash, sizeof hash, "%08" PRIx64, uint64_t(fnv1a64(v.dump()) & 0xffffffffull));
  return s.substr(0, 24) + "-" + hash;
}

std::string sweep_override(const std::string& key, const json& value) {
  return key + "=" + value.dump();
}

SweepSpec parse_sweep_spec(const json& j, const std::string& path) {
  SweepSpec s;
  s.file = path;
  StrictObject top(j, path, "");
  s.name = top.get_string("name");
  if (s.name.empty()) top.fail("name", "must not be empty");
  s.description = top.get_string("description", "");
  const std::string base = top.get_string("base");
  if (base.empty()) top.fail("base", "must not be empty");
  s.base =
      (fs::path(base).is_absolute() ? fs::path(base) : fs::path(path).parent_path() / base).lexically_normal().string();

  s.set = parse_sets(top, "set");

  const json& axes = top.get_raw("axes");
  if (axes.is_null()) top.fail("axes", "required key is missing");
  if (!axes.is_array() || axes.empty()) top.fail("axes", "expected a non-empty list of axes");
  std::map<std::string, std::string> key_owner, name_owner;  // key / axis name -> the axis that has it
  for (size_t i = 0; i < axes.size(); ++i) {
    const std::string where = "axes[" + std::to_string(i) + "]";
    StrictObject a(axes[i], path, where);
    SweepAxis ax;
    if (a.has("key") == a.has("keys"))
      a.fail("key", "give one of \"key\" (one config key) or \"keys\" (several, varied together)");
    if (a.has("key")) {
      ax.keys = {a.get_string("key")};
      check_key(a, "key", ax.keys[0]);
      a.get_raw("keys");
    } else {
      ax.multi = true;
      const json& ks = a.get_raw("keys");
      a.get_raw("key");
      if (!ks.is_array() || ks.empty()) a.fail("keys", "expected a non-empty list of config keys");
      for (const json& k : ks) {
        if (!k.is_string()) a.fail("keys", k.dump() + " is not a config key (a string)");
        ax.keys.push_back(k.get<std::string>());
        check_key(a, "keys", ax.keys.back());
      }
    }
    const json& vals = a.get_raw("values");
    if (vals.is_null()) a.fail("values", "required key is missing");
    if (!vals.is_array() || vals.empty()) a.fail("values", "expected a non-empty list of values");
    for (const json& v : vals) {
      if (ax.multi && (!v.is_array() || v.size() != ax.keys.size()))
        a.fail("values",
               v.dump() + " must be a list of " + std::to_string(ax.keys.size()) + " values, one per key of \"keys\"");
      ax.values.push_back(v);
    }
    const json& labels = a.get_raw("labels");
    if (!labels.is_null()) {
      if (!labels.is_array() || labels.size() != ax.values.size())
        a.fail("labels", "expected a list of " + std::to_string(ax.values.size()) + " strings, one per value");
      for (const json& l : labels) {
        if (!l.is_string() || l.get<std::string>().empty()) a.fail("labels", l.dump() + " is not a non-empty string");
        for (const std::string& prev : ax.labels)
          if (prev == l.get<std::string>()) a.fail("labels", "'" + prev + "' is given twice");
        ax.labels.push_back(l.get<std::string>());
      }
    }
    std::string def;
    for (const std::string& k : ax.keys) def += (def.empty() ? "" : "-") + last_component(k);
    ax.name = a.get_string("name", def);
    if (ax.name.empty()) a.fail("name", "must not be empty");
    if (auto it = name_owner.find(ax.name); it != name_owner.end())
      a.fail("name", "'" + ax.name + "' is already the name of " + it->second + " (give each axis its own \"name\")");
    name_owner[ax.name] = where;
    for (const std::string& k : ax.keys) {
      if (auto it = key_owner.find(k); it != key_owner.end())
        a.fail(ax.multi ? "keys" : "key", "'" + k + "' is already varied by " + it->second);
      key_owner[k] = where;
    }
    a.finish();
    s.axes.push_back(std::move(ax));
  }
  s.zip = top.get_enum("mode", {"product", "zip"}, std::string("product")) == "zip";
  if (s.zip)
    for (size_t i = 1; i < s.axes.size(); ++i)
      if (s.axes[i].values.size() != s.axes[0].values.size())
        top.fail("axes", "\"mode\": \"zip\" walks the axes together, but axes[" + std::to_string(i) + "] (" +
                             s.axes[i].name + ") has " + std::to_string(s.axes[i].values.size()) +
                             " values and axes[0] (" + s.axes[0].name + ") has " +
                             std::to_string(s.axes[0].values.size()));
  s.repeats = top.get_int("repeats", 1, 1000000, 1);
  s.interleaved = top.get_enum("order", {"interleaved", "grouped"}, std::string("interleaved")) == "interleaved";
  if (top.has("quick")) {  // checked here, used only with --quick (with_quick)
    s.has_quick = true;
    StrictObject q = top.get_object("quick");
    s.quick_set = parse_sets(q, "set");
    if (q.has("values")) {
      StrictObject v = q.get_object("values");
      for (const auto& [name, entries] : q.get_raw("values").items()) {
        size_t d = 0;
        while (d < s.axes.size() && s.axes[d].name != name) ++d;
        if (d == s.axes.size()) v.fail(name, "no axis has this name");
        if (!entries.is_array() || entries.empty())
          v.fail(name, "expected a non-empty list of values or labels of the axis");
        for (const json& e : entries) {
          bool found = false;
          for (size_t i = 0; i < s.axes[d].values.size() && !found; ++i) found = quick_matches(s.axes[d], i, e);
          if (!found) v.fail(name, e.dump() + " is neither a value nor a label of axis " + name);
        }
        v.get_raw(name);
        s.quick_values.emplace_back(name, entries.get<std::vector<json>>());
      }
      v.finish();
    } else {
      q.get_raw("values");
    }
    q.finish();
  } else {
    top.get_raw("quick");
  }
  top.finish();
  return s;
}

SweepSpec load_sweep_spec(const std::string& path) {
  SweepSpec s = parse_sweep_spec(read_json_file(path), path);
  s.base = fs::absolute(s.base).lexically_normal().string();  // index.json names it wherever the sweep ran from
  if (!fs::is_regular_file(s.base)) throw ConfigError(path + ": base: " + s.base + " is not a file");
  return s;
}

json SweepSpec::to_json() const {
  json ax = json::array();
  for (const SweepAxis& a : axes) {
    json o = {{"name", a.name}, {"values", a.values}};
    if (!a.labels.empty()) o["labels"] = a.labels;
    if (a.multi)
      o["keys"] = a.keys;
    else
      o["key"] = a.keys[0];
    ax.push_back(std::move(o));
  }
  json j = {{"name", name},       {"description", description},
            {"base", base},       {"set", set},
            {"axes", ax},         {"mode", zip ? "zip" : "product"},
            {"repeats", repeats}, {"order", interleaved ? "interleaved" : "grouped"}};
  if (has_quick) {
    json qv = json::object();
    for (const auto& [n, entries] : quick_values) qv[n] = entries;
    j["quick"] = {{"set", quick_set}, {"values", qv}};
  }
  // "quick": "set" above already holds the quick "set" and "axes" only the values it keeps.
  j["variant"] = quick_applied ? "quick" : "full";
  if (!only.empty()) j["only"] = only;  // fd-bench sweep --only: "axes" holds only the values it keeps
  return j;
}

namespace {

// The spec with each named axis cut to the entries given for it (an entry matches a value equal to it or
// whose label is it; zip keeps a point only if every named axis keeps it). `what` names the source in errors.
SweepSpec cut_axes(const SweepSpec& s, const std::vector<std::pair<std::string, std::vector<json>>>& values,
                   const std::string& what) {
  SweepSpec q = s;
  std::vector<std::vector<bool>> keep;
  for (const SweepAxis& a : s.axes) keep.emplace_back(a.values.size(), true);
  for (const auto& [name, entries] : values) {
    bool named = false;
    for (size_t d = 0; d < s.axes.size(); ++d) {
      if (s.axes[d].name != name) continue;
      named = true;
      for (const json& e : entries) {
        bool any = false;
        for (size_t i = 0; i < s.axes[d].values.size(); ++i) any = any || quick_matches(s.axes[d], i, e);
        if (!any) {
          std::string labels;
          for (size_t i = 0; i < s.axes[d].values.size(); ++i) {
            if (i) labels += ", ";
            labels += axis_label(s.axes[d], i);
          }
          throw ConfigError(s.file + ": " + what + ": " + e.dump() + " is no value of axis \"" + name + "\" (" +
                            labels + ")");
        }
      }
      for (size_t i = 0; i < s.axes[d].values.size(); ++i) {
        bool k = false;
        for (const json& e : entries) k = k || quick_matches(s.axes[d], i, e);
        keep[d][i] = k;
      }
    }
    if (!named) {
      std::string names;
      for (const SweepAxis& a : s.axes) {
        if (!names.empty()) names += ", ";
        names += a.name;
      }
      throw ConfigError(s.file + ": " + what + ": no axis is named \"" + name + "\" (axes: " + names + ")");
    }
  }
  if (s.zip) {  // a zip point is one index on every axis: kept only if every axis keeps it
    for (size_t i = 0; i < s.axes[0].values.size(); ++i)
      for (size_t d = 1; d < s.axes.size(); ++d) keep[0][i] = keep[0][i] && keep[d][i];
    for (size_t d = 1; d < s.axes.size(); ++d) keep[d] = keep[0];
  }
  for (size_t d = 0; d < q.axes.size(); ++d) {
    SweepAxis& a = q.axes[d];
    a.values.clear();
    a.labels.clear();
    for (size_t i = 0; i < s.axes[d].values.size(); ++i) {
      if (!keep[d][i]) continue;
      a.values.push_back(s.axes[d].values[i]);
      if (!s.axes[d].labels.empty()) a.labels.push_back(s.axes[d].labels[i]);
    }
    if (a.values.empty()) throw ConfigError(s.file + ": " + what + ": keeps no point of the zipped axes");
  }
  return q;
}

}  // namespace

SweepSpec with_quick(const SweepSpec& s) {
  if (!s.has_quick) throw ConfigError(s.file + ": --quick: the spec has no \"quick\" variant");
  SweepSpec q = cut_axes(s, s.quick_values, "quick");
  q.set.insert(q.set.end(), s.quick_set.begin(), s.quick_set.end());
  q.quick_applied = true;
  return q;
}

SweepSpec with_only(const SweepSpec& s, const std::vector<std::string>& only) {
  std::vector<std::pair<std::string, std::vector<json>>> values;
  for (const std::string& o : only) {
    const size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == o.size())
      throw ConfigError("--only " + o + ": expected AXIS=VALUE[,VALUE...] (a value or its label)");
    std::vector<json> entries;
    std::string rest = o.substr(eq + 1);
    for (size_t p = 0; p <= rest.size();) {
      size_t c = rest.find(',', p);
      if (c == std::string::npos) c = rest.size();
      const std::string v = rest.substr(p, c - p);
      if (v.empty()) throw ConfigError("--only " + o + ": an empty value");
      entries.push_back(v);  // a label, or a value's label; a number matches its label too
      p = c + 1;
    }
    values.emplace_back(o.substr(0, eq), entries);
  }
  SweepSpec q = cut_axes(s, values, "--only");
  q.only = only;
  return q;
}

std::vector<SweepPoint> expand_points(const SweepSpec& s, const std::vector<std::string>& extra_sets) {
  // Each point is a choice of one value index per axis.
  std::vector<std::vector<size_t>> choices;
  if (s.zip) {
    for (size_t i = 0; i < s.axes.at(0).values.size(); ++i) choices.push_back(std::vector<size_t>(s.axes.size(), i));
  } else {
    size_t total = 1;
    for (const SweepAxis& a : s.axes) {
      total *= a.values.size();
      if (total > 100000) throw ConfigError(s.file + ": axes: more than 100000 points");
    }
    std::vector<size_t> idx(s.axes.size(), 0);
    for (size_t n = 0; n < total; ++n) {
      choices.push_back(idx);
      for (size_t d = s.axes.size(); d-- > 0;) {  // the last axis varies fastest
        if (++idx[d] < s.axes[d].values.size()) break;
        idx[d] = 0;
      }
    }
  }
  std::vector<SweepPoint> out;
  std::map<std::string, size_t> by_name;
  for (const auto& c : choices) {
    SweepPoint p;
    p.overrides = s.set;
    for (size_t d = 0; d < s.axes.size(); ++d) {
      const SweepAxis& a = s.axes[d];
      const json& v = a.values[c[d]];
      if (!p.name.empty()) p.name += '_';
      p.name += filesystem_safe(a.name);
      p.name += '-';
      p.name += axis_label(a, c[d]);
      for (size_t k = 0; k < a.keys.size(); ++k) p.overrides.push_back(sweep_override(a.keys[k], a.multi ? v[k] : v));
      p.values[a.name] = v;
    }
    p.overrides.insert(p.overrides.end(), extra_sets.begin(), extra_sets.end());
    if (auto it = by_name.find(p.name); it != by_name.end())
      throw ConfigError(s.file + ": axes: the points " + out[it->second].values.dump() + " and " + p.values.dump() +
                        " have the same folder name '" + p.name +
                        "' (values that differ only in characters outside "
                        "[A-Za-z0-9.-]; give the values distinct spellings)");
    by_name[p.name] = out.size();
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<SweepRun> run_order(const SweepSpec& s, size_t num_points) {
  std::vector<SweepRun> out;
  if (s.interleaved) {
    for (int64_t r = 1; r <= s.repeats; ++r)
      for (size_t p = 0; p < num_points; ++p) out.push_back({p, r});
  } else {
    for (size_t p = 0; p < num_points; ++p)
      for (int64_t r = 1; r <= s.repeats; ++r) out.push_back({p, r});
  }
  return out;
}

json sweep_headline(const json& summary) {
  json h = json::object();
  if (!summary.is_object() || !summary.contains("results")) return h;
  const json& res = summary["results"];
  // {headline name, path in results}; dotted names say where each number is in summary.json's results.
  const std::vector<std::pair<std::string, std::vector<std::string>>> fields = {
      {"output_throughput", {"output_throughput"}},
      {"decode_only.tokens_per_s", {"decode_only", "tokens_per_s"}},
      {"steady.tokens_per_s", {"steady", "tokens_per_s"}},
      {"decode_only.step_ms.p99", {"decode_only", "step_ms", "p99"}},
      {"step_ms.p99", {"step_ms", "p99"}},
      {"ttft_ms.p50", {"ttft_ms", "p50"}},
      {"steady.mean_batch", {"steady", "mean_batch"}},
  };
  for (const auto& [name, keys] : fields) {
    const json* cur = &res;
    for (const std::string& k : keys) {
      if (!cur->is_object() || !cur->contains(k)) {
        cur = nullptr;
        break;
      }
      cur = &(*cur)[k];
    }
    if (cur && cur->is_number()) h[name] = *cur;
  }
  return h;
}

int run_sweep(const SweepSpec& spec, const SweepOptions& opt) {
  SweepSpec s = opt.quick ? with_quick(spec) : spec;
  if (!opt.only.empty()) s = with_only(s, opt.only);
  if (opt.repeats > 0) s.repeats = opt.repeats;
  const std::vector<SweepPoint> points = expand_points(s, opt.sets);
  const std::vector<SweepRun> order = run_order(s, points.size());
  const fs::path out = opt.out_dir;
  const auto run_dir = [&](const SweepRun& r) {
    return fs::path(points[r.point].name) / ("rep" + std::to_string(r.rep));
  };

  // Every point's config, validated before anything runs: a bad value in the last point fails at once.
  std::vector<ExperimentConfig> configs;
  for (const SweepPoint& p : points) {
    try {
      configs.push_back(load_experiment(s.base, p.overrides));
    } catch (const Error& e) {
      throw ConfigError(s.file + ": point " + p.name + ": " + e.what());
    }
  }
  // A finished run kept from an earlier invocation must have been made with this point's overrides.
  size_t todo = 0;
  for (const SweepRun& r : order) {
    json summary;
    if (!finished_run(out / run_dir(r), &summary)) {
      ++todo;
      continue;
    }
    const json& o = summary.contains("overrides") ? summary["overrides"] : json();
    if (o != json(points[r.point].overrides))
      throw ConfigError((out / run_dir(r)).string() + " holds a finished run made with other overrides (" + o.dump() +
                        ", this sweep's point has " + json(points[r.point].overrides).dump() +
                        "): choose another --out, or remove that folder");
  }

  if (opt.dry_run) {
    std::printf(
        "sweep %s%s: %zu points x %lld repeats = %zu runs (%s order; %zu without a finished run in %s); base %s\n",
        s.name.c_str(), s.quick_applied ? " (quick)" : "", points.size(), (long long)s.repeats, order.size(),
        s.interleaved ? "interleaved" : "grouped", todo, opt.out_dir.c_str(), s.base.c_str());
    for (const SweepPoint& p : points) {
      std::printf("  %s:", p.name.c_str());
      for (const std::string& o : p.overrides) std::printf(" --set %s", o.c_str());
      std::printf("\n");
    }
    return 0;
  }

  fs::create_directories(out);
  json index = {{"sweep", s.name},
                {"spec", s.to_json()},
                {"spec_file", fs::absolute(s.file).lexically_normal().string()},
                {"command", opt.command_line},
                {"provenance", collect_provenance(opt.command_line)}};
  json pts = json::array();
  for (const SweepPoint& p : points)
    pts.push_back({{"name", p.name}, {"overrides", p.overrides}, {"values", p.values}, {"runs", json::array()}});
  index["points"] = pts;
  write_index(out, index);

  const int64_t t_start = now_ns();
  double ran_s = 0;
  size_t ran = 0, failed = 0, skipped = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const SweepRun& r = order[k];
    const SweepPoint& p = points[r.point];
    const fs::path dir = out / run_dir(r);
    json rec = {{"rep", r.rep}, {"dir", run_dir(r).string()}};
    json summary;
    std::string what;
    if (finished_run(dir, &summary)) {
      rec["status"] = "skipped-existing";
      rec["headline"] = sweep_headline(summary);
      ++skipped;
      what = "skipped, summary.json exists";
      if (rec["headline"].contains("output_throughput")) {
        char buf[48];
        std::snprintf(buf, sizeof buf, " (%.1f tokens/s)", rec["headline"]["output_throughput"].get<double>());
        what += buf;
      }
    } else {
      if (fs::is_directory(dir) && fs::is_empty(dir)) fs::remove(dir);  // a run that failed before writing anything
      if (fs::exists(dir)) {                                            // a run cut short: kept aside, and run again
        fs::path aside;
        for (int n = 1;; ++n) {
          aside = dir;
          aside += ".incomplete-" + std::to_string(n);
          if (!fs::exists(aside)) break;
        }
        fs::rename(dir, aside);
      }
      const int64_t t0 = now_ns();
      RunOptions ro;
      ro.out_dir = dir.string();
      ro.command_line = opt.command_line;
      ro.progress = !opt.quiet;
      try {
        summary = run_experiment(configs[r.point], ro);
        rec["status"] = "ok";
        rec["headline"] = sweep_headline(summary);
      } catch (const std::exception& e) {  // recorded; the sweep goes on (unless --fail-fast)
        rec["status"] = "failed";
        rec["error"] = e.what();
        ++failed;
      }
      const double secs = double(now_ns() - t0) / 1e9;
      rec["wall_s"] = secs;  // the run's wall time in this sweep, weights and R-worker start included
      ran_s += secs;
      ++ran;
      char buf[64];
      if (rec["status"] == "ok") {
        const double tps = rec["headline"].value("output_throughput", 0.0);
        std::snprintf(buf, sizeof buf, "%.1f tokens/s (%.2f s)", tps, secs);
        what = buf;
      } else {
        std::snprintf(buf, sizeof buf, "FAILED (%.2f s): ", secs);
        what = buf + rec["error"].get<std::string>();
      }
    }
    json& runs = index["points"][r.point]["runs"];
    runs.push_back(rec);
    std::stable_sort(runs.begin(), runs.end(), [](const json& a, const json& b) { return a["rep"] < b["rep"]; });
    write_index(out, index);
    if (!opt.quiet) {
      const double elapsed = double(now_ns() - t_start) / 1e9;
      const size_t left = todo - ran;
      const std::string eta = ran > 0 ? fmt_duration(ran_s / double(ran) * double(left)) : (left ? "?" : "0s");
      std::fprintf(stderr, "[%zu/%zu] %s rep %lld/%lld: %s; elapsed %s, ETA %s\n", k + 1, order.size(), p.name.c_str(),
                   (long long)r.rep, (long long)s.repeats, what.c_str(), fmt_duration(elapsed).c_str(), eta.c_str());
    }
    if (opt.fail_fast && rec["status"] == "failed") {
      std::fprintf(stderr, "sweep %s: stopped at the first failed run (--fail-fast)\n", s.name.c_str());
      break;
    }
  }
  std::printf("sweep %s: %zu runs: %zu ok, %zu skipped (finished before), %zu failed, %zu not run; index %s\n",
              s.name.c_str(), order.size(), ran - failed, skipped, failed, order.size() - ran - skipped,
              (out / "index.json").string().c_str());
  return failed > 0 ? 1 : 0;
}

}  // namespace fd
