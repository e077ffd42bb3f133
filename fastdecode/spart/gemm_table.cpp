#include "fastdecode/spart/gemm_table.h"

#include <cctype>
#include <map>
#include <mutex>

namespace fd {

GemmTable GemmTable::load(const std::string& path) {
  GemmTable t = from_json(read_json_file(path), path);
  t.source = path;
  return t;
}

GemmTable GemmTable::from_json(const json& j, const std::string& file) {
  if (!j.is_object()) throw ConfigError(file + ": a GEMM table is a JSON object");
  StrictObject top(j, file, "");
  GemmTable t;
  t.device = top.get_string("device");
  t.cublaslt_version = top.get_int("cublaslt_version", 1, INT64_MAX);
  t.notes = top.get_raw("notes");
  const json& entries = top.get_raw("entries");
  if (!entries.is_array()) top.fail("entries", "must be an array");
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string at = "entries[" + std::to_string(i) + "]";
    if (!entries[i].is_object()) top.fail(at, "must be an object");
    StrictObject e(entries[i], file, at);
    GemmProblem p;
    p.out = e.get_int("out", 1, INT32_MAX);
    p.in = e.get_int("in", 1, INT32_MAX);
    p.rows = e.get_int("rows", 1, INT32_MAX);
    const std::string dt = e.get_enum("dtype", {"fp16", "bf16"});
    p.dtype = dtype_from_name(dt);
    p.y_fp32 = e.get_bool("y_fp32");
    p.accumulate = e.get_bool("accumulate");
    const int algo = int(e.get_int("algo", 0, 63));
    json timing = json::object();
    for (const char* k : {"us", "default_us"}) {  // what it was chosen by, kept for the reader
      const double v = e.get_number(k, 0.0, 1e9, -1.0);
      if (v >= 0) timing[k] = v;
    }
    e.finish();
    if (t.algos_.count(p)) e.fail("algo", "the same problem twice");
    t.algos_[p] = {algo, timing};
  }
  top.finish();
  return t;
}

json GemmTable::to_json() const {
  json e = json::array();
  for (const auto& [p, a] : algos_) {
    json r = {{"out", p.out}, {"in", p.in}, {"rows", p.rows}, {"dtype", std::string(dtype_name(p.dtype))},
              {"y_fp32", p.y_fp32}, {"accumulate", p.accumulate}, {"algo", a.first}};
    r.update(a.second);
    e.push_back(r);
  }
  return {{"device", device}, {"cublaslt_version", cublaslt_version}, {"notes", notes}, {"entries", e}};
}

int GemmTable::find(const GemmProblem& p) const {
  const auto it = algos_.find(p);
  return it == algos_.end() ? -1 : it->second.first;
}

std::shared_ptr<const GemmTable> load_gemm_table(const std::string& path) {
  if (path.empty()) return nullptr;
  static std::mutex m;
  static std::map<std::string, std::shared_ptr<const GemmTable>> loaded;
  std::lock_guard<std::mutex> lock(m);
  auto& t = loaded[path];
  if (!t) t = std::make_shared<const GemmTable>(GemmTable::load(path));
  return t;
}

std::string gemm_table_file_name(const std::string& device) {
  std::string s;
  for (char c : device) {
    if (std::isalnum(static_cast<unsigned char>(c))) s += char(std::tolower(static_cast<unsigned char>(c)));
    else if (!s.empty() && s.back() != '-') s += '-';
  }
  while (!s.empty() && s.back() == '-') s.pop_back();
  return (s.empty() ? "unnamed" : s) + ".json";
}

}  // namespace fd
