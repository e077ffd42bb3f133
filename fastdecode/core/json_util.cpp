#include "fastdecode/core/json_util.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

namespace fd {

json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path + ": cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::parse_error& e) {
    throw ConfigError(path + ": invalid JSON: " + e.what());
  }
}

// Written beside the target and renamed over it, so a process killed mid-write (kill -9 of a run) leaves the
// previous file or the new one whole, never half a JSON document.
void write_json_file(const std::string& path, const json& j, int indent) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) FD_THROW(path << ": cannot open for writing");
    out << j.dump(indent) << "\n";
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      FD_THROW(path << ": write failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    FD_THROW(path << ": cannot replace it (" << std::strerror(err) << ")");
  }
}

StrictObject::StrictObject(const json& obj, std::string file, std::string path)
    : obj_(obj), file_(std::move(file)), path_(std::move(path)) {
  if (!obj_.is_object())
    throw ConfigError(file_ + ": " + (path_.empty() ? std::string("top level") : path_) +
                      " must be a JSON object, got " + obj_.type_name());
}

std::string StrictObject::where(const std::string& key) const {
  return file_ + ": " + (path_.empty() ? key : path_ + "." + key);
}

void StrictObject::fail(const std::string& key, const std::string& what) const {
  throw ConfigError(where(key) + ": " + what);
}

bool StrictObject::has(const std::string& key) const {
  return obj_.contains(key) && !obj_.at(key).is_null();
}

const json& StrictObject::value(const std::string& key) {
  known_.insert(key);
  if (!has(key)) fail(key, "required key is missing");
  return obj_.at(key);
}

const json& StrictObject::get_raw(const std::string& key) {
  known_.insert(key);
  static const json null_value;
  return obj_.contains(key) ? obj_.at(key) : null_value;
}

static std::string range_text(double lo, double hi) {
  std::ostringstream os;
  os.precision(17);  // the bounds as they are (1e-06, 16777216), not rounded to 6 digits
  os << "[" << lo << ", " << hi << "]";
  return os.str();
}

static std::string range_text(int64_t lo, int64_t hi) {
  std::ostringstream os;
  os << "[" << lo << ", " << hi << "]";
  return os.str();
}

// Levenshtein distance of two short keys.
static size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

int64_t StrictObject::get_int(const std::string& key, int64_t lo, int64_t hi) {
  const json& v = value(key);
  int64_t x = 0;
  if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else if (v.is_number_float() && std::isfinite(v.get<double>()) &&
             std::floor(v.get<double>()) == v.get<double>() && std::fabs(v.get<double>()) < 9e15) {
    x = static_cast<int64_t>(v.get<double>());
  } else {
    fail(key, std::string("expected an integer, got ") + v.dump());
  }
  if (x < lo || x > hi)
    fail(key, "value " + std::to_string(x) + " out of range " + range_text(lo, hi));
  return x;
}

int64_t StrictObject::get_int(const std::string& key, int64_t lo, int64_t hi, int64_t def) {
  known_.insert(key);
  return has(key) ? get_int(key, lo, hi) : def;
}

double StrictObject::get_number(const std::string& key, double lo, double hi) {
  const json& v = value(key);
  if (!v.is_number()) fail(key, std::string("expected a number, got ") + v.dump());
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    std::ostringstream os;
    os << "value " << x << " out of range " << range_text(lo, hi);
    fail(key, os.str());
  }
  return x;
}

double StrictObject::get_number(const std::string& key, double lo, double hi, double def) {
  known_.insert(key);
  return has(key) ? get_number(key, lo, hi) : def;
}

std::string StrictObject::get_string(const std::string& key) {
  const json& v = value(key);
  if (!v.is_string()) fail(key, std::string("expected a string, got ") + v.dump());
  return v.get<std::string>();
}

std::string StrictObject::get_string(const std::string& key, const std::string& def) {
  known_.insert(key);
  return has(key) ? get_string(key) : def;
}

std::string StrictObject::get_enum(const std::string& key, const std::set<std::string>& allowed,
                                   const std::optional<std::string>& def) {
  known_.insert(key);
  if (!has(key)) {
    if (def) return *def;
    fail(key, "required key is missing");
  }
  const std::string s = get_string(key);
  if (!allowed.count(s)) {
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
    fail(key, "'" + s + "' is not one of: " + list);
  }
  return s;
}

bool StrictObject::get_bool(const std::string& key) {
  const json& v = value(key);
  if (!v.is_boolean()) fail(key, std::string("expected true or false, got ") + v.dump());
  return v.get<bool>();
}

bool StrictObject::get_bool(const std::string& key, bool def) {
  known_.insert(key);
  return has(key) ? get_bool(key) : def;
}

StrictObject StrictObject::get_object(const std::string& key) {
  const json& v = value(key);
  if (!v.is_object()) fail(key, std::string("expected an object, got ") + v.type_name());
  return StrictObject(v, file_, path_.empty() ? key : path_ + "." + key);
}

void StrictObject::accept(const std::set<std::string>& keys) { known_.insert(keys.begin(), keys.end()); }

void StrictObject::finish() const {
  for (auto it = obj_.begin(); it != obj_.end(); ++it) {
    if (known_.count(it.key())) continue;
    // The nearest key this object takes, when it is near (a typo): at most a third of the key's letters off, and 2.
    std::string best;
    size_t best_d = std::min<size_t>(2, std::max<size_t>(1, it.key().size() / 3)) + 1;
    for (const std::string& k : known_) {
      const size_t d = edit_distance(it.key(), k);
      if (d < best_d) best_d = d, best = k;
    }
    throw ConfigError(where(it.key()) + ": unknown key" + (best.empty() ? std::string() : " (did you mean '" + best + "'?)"));
  }
}

}  // namespace fd
