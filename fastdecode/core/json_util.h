// Strict JSON reading for configs: every key must be known, every value typed and range-checked.
// Errors are fd::ConfigError naming the file and the key path ("workload.prompt_len").
#pragma once
#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "fastdecode/core/error.h"

namespace fd {

using json = nlohmann::json;

// Parses a JSON file; throws ConfigError naming the file (missing, unreadable, bad JSON with the byte).
json read_json_file(const std::string& path);
void write_json_file(const std::string& path, const json& j, int indent = 2);

// A view of one JSON object inside a config file. Each getter records the key as known; finish()
// raises an error for any key that no getter asked for. Paths in messages read "file: key.sub".
class StrictObject {
 public:
  StrictObject(const json& obj, std::string file, std::string path);

  bool has(const std::string& key) const;
  // Required values.
  int64_t get_int(const std::string& key, int64_t lo, int64_t hi);
  double get_number(const std::string& key, double lo, double hi);
  std::string get_string(const std::string& key);
  bool get_bool(const std::string& key);
  StrictObject get_object(const std::string& key);
  // Optional values: the default when absent (or null).
  int64_t get_int(const std::string& key, int64_t lo, int64_t hi, int64_t def);
  double get_number(const std::string& key, double lo, double hi, double def);
  std::string get_string(const std::string& key, const std::string& def);
  std::string get_enum(const std::string& key, const std::set<std::string>& allowed,
                       const std::optional<std::string>& def = std::nullopt);
  bool get_bool(const std::string& key, bool def);
  // The raw value (marked as known); null if absent.
  const json& get_raw(const std::string& key);
  // Marks keys as known without reading them (e.g. fields kept only for compatibility).
  void accept(const std::set<std::string>& keys);
  // Throws ConfigError for the first key never asked for.
  void finish() const;

  const std::string& file() const { return file_; }
  std::string where(const std::string& key) const;  // "file: path.key"
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;

 private:
  const json& value(const std::string& key);
  const json& obj_;
  std::string file_, path_;
  std::set<std::string> known_;
};

}  // namespace fd
