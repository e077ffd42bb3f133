#include "fastdecode/model/checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "fastdecode/core/error.h"
#include "fastdecode/core/json_util.h"

namespace fd {

namespace fs = std::filesystem;

namespace {

// Every bad checkpoint is bad input: fd::ConfigError (programs exit 2 before any work).
#define FD_CKPT_ERROR(msg) FD_THROW_BAD_INPUT(msg)

// An index is a few MB at most even for huge models (one line per tensor).
constexpr uintmax_t kMaxIndexBytes = 64ull << 20;

std::string read_small_file(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) FD_CKPT_ERROR("checkpoint index '" << path << "': cannot read: " << ec.message());
  if (size > kMaxIndexBytes)
    FD_CKPT_ERROR("checkpoint index '" << path << "': " << size << " bytes is too large for an index (limit "
                                       << kMaxIndexBytes << "); not an index file?");
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in && !in.eof()) FD_CKPT_ERROR("checkpoint index '" << path << "': cannot read");
  return text;
}

// A shard name from the index: a file beside the index, never a path out of its folder.
bool plain_relative(const std::string& name) {
  if (name.empty() || name.front() == '/') return false;
  for (const auto& part : fs::path(name))
    if (part == "..") return false;
  return true;
}

struct IndexFile {
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name, sorted
  std::vector<std::string> shard_names;           // sorted, unique
};

IndexFile parse_index(const std::string& path) {
  const std::string text = read_small_file(path);
  // nlohmann keeps the last of duplicate keys silently; the callback sees every weight_map key.
  std::string duplicate;
  std::set<std::string> seen;
  bool in_map = false;
  auto cb = [&](int depth, nlohmann::detail::parse_event_t ev, json& j) {
    if (ev == nlohmann::detail::parse_event_t::key) {
      if (depth == 1) in_map = j.get<std::string>() == "weight_map";
      if (depth == 2 && in_map && duplicate.empty() && !seen.insert(j.get<std::string>()).second)
        duplicate = j.get<std::string>();
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text, cb);
  } catch (const json::exception& e) {
    FD_CKPT_ERROR("checkpoint index '" << path << "': not valid JSON: " << e.what());
  }
  if (!j.is_object())
    FD_CKPT_ERROR("checkpoint index '" << path << "': must be a JSON object, found " << j.type_name());
  if (!duplicate.empty())
    FD_CKPT_ERROR("checkpoint index '" << path << "', tensor '" << duplicate
                                       << "': listed more than once in weight_map");
  if (j.contains("metadata")) {
    const json& m = j["metadata"];
    if (!m.is_object()) FD_CKPT_ERROR("checkpoint index '" << path << "': \"metadata\" must be an object");
    if (m.contains("total_size") && !m["total_size"].is_number_unsigned())
      FD_CKPT_ERROR("checkpoint index '" << path << "': metadata.total_size must be a non-negative integer, found "
                                         << m["total_size"].dump());
  }
  if (!j.contains("weight_map") || !j["weight_map"].is_object())
    FD_CKPT_ERROR("checkpoint index '" << path << "': needs \"weight_map\": {tensor name: shard file}");
  IndexFile idx;
  std::set<std::string> shards;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string())
      FD_CKPT_ERROR("checkpoint index '" << path << "', tensor '" << name
                                         << "': shard must be a file name string, found " << file.dump());
    const std::string f = file.get<std::string>();
    if (!plain_relative(f))
      FD_CKPT_ERROR("checkpoint index '" << path << "', tensor '" << name << "': shard '" << f
                                         << "' must be a relative path inside the index's folder");
    idx.weight_map[name] = f;
    shards.insert(f);
  }
  if (idx.weight_map.empty()) FD_CKPT_ERROR("checkpoint index '" << path << "': weight_map is empty");
  idx.shard_names.assign(shards.begin(), shards.end());
  return idx;
}

class CheckpointSource : public TensorSource {
 public:
  explicit CheckpointSource(const std::string& path) : ckpt_(Checkpoint::open(path)) {}
  std::vector<float> read(const TensorSpec& spec) override { return ckpt_.read_f32(spec); }
  std::string describe() const override {
    return ckpt_.index_path().empty() ? ckpt_.shards().front().path() : ckpt_.index_path();
  }
  void check(const std::vector<TensorSpec>& needed, const std::vector<TensorSpec>& skipped) const override {
    ckpt_.check(needed, skipped);
  }

 private:
  Checkpoint ckpt_;
};

}  // namespace

std::string shard_file_name(int64_t shard, int64_t count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05lld-of-%05lld.safetensors", (long long)shard, (long long)count);
  return buf;
}

std::vector<std::vector<size_t>> plan_shards(const std::vector<int64_t>& tensor_bytes, int64_t max_shard_bytes) {
  FD_CHECK(max_shard_bytes > 0, "max_shard_bytes must be > 0, got " << max_shard_bytes);
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> cur;
  int64_t cur_bytes = 0;
  for (size_t i = 0; i < tensor_bytes.size(); ++i) {
    const int64_t b = tensor_bytes[i];
    // A tensor over the limit closes the current shard and, being over the limit itself, gets the next
    // one to itself: whatever follows it overflows. (huggingface_hub appends an oversized tensor's
    // shard and keeps filling the current one; closing it first keeps the tensors in order, and
    // loaders do not care either way.)
    if (cur_bytes + b > max_shard_bytes && !cur.empty()) {
      shards.push_back(std::move(cur));
      cur.clear();
      cur_bytes = 0;
    }
    cur.push_back(i);
    cur_bytes += b;
  }
  if (!cur.empty()) shards.push_back(std::move(cur));
  return shards;
}

bool is_ignorable_buffer(std::string_view name) {
  // Llama's rotary inverse frequencies: a non-learned buffer that older transformers saved per layer
  // (and some conversions as model.rotary_emb.inv_freq); RoPE is computed from rope_theta instead.
  static const std::regex re(R"(model\.(layers\.[0-9]+\.self_attn\.)?rotary_emb\.inv_freq)");
  return std::regex_match(name.begin(), name.end(), re);
}

// ---------------------------------------------------------------------------------------------------
// Checkpoint

Checkpoint Checkpoint::open(const std::string& path) {
  Checkpoint c;
  c.path_ = path;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) {
    std::string hint;
    const fs::path p(path);
    if (p.filename() == kSingleFileName && fs::exists(p.parent_path() / kIndexFileName))
      hint = " (the folder holds a sharded checkpoint, " + std::string(kIndexFileName) + ": pass the folder)";
    FD_CKPT_ERROR("checkpoint '" << path << "': no such file or folder" << hint);
  }
  std::vector<std::string> shard_paths;
  IndexFile idx;
  if (fs::is_directory(st)) {
    const fs::path single = fs::path(path) / kSingleFileName, index = fs::path(path) / kIndexFileName;
    const bool has_single = fs::exists(single), has_index = fs::exists(index);
    if (has_single && has_index)
      FD_CKPT_ERROR("checkpoint folder '" << path << "': holds both " << kSingleFileName << " and " << kIndexFileName
                                          << "; which one is the model is ambiguous: remove one");
    if (!has_single && !has_index)
      FD_CKPT_ERROR("checkpoint folder '" << path << "': has neither " << kSingleFileName << " nor " << kIndexFileName);
    if (has_single)
      shard_paths.push_back(single.string());
    else
      c.index_path_ = index.string();
  } else if (fs::path(path).extension() == ".json") {
    c.index_path_ = path;
  } else {
    shard_paths.push_back(path);
  }

  if (!c.index_path_.empty()) {
    idx = parse_index(c.index_path_);
    const fs::path dir = fs::path(c.index_path_).parent_path();
    for (const auto& s : idx.shard_names) {
      const fs::path sp = dir / s;
      if (!fs::is_regular_file(sp)) {
        std::string first;
        size_t n = 0;
        for (const auto& [t, f] : idx.weight_map)
          if (f == s && n++ == 0) first = t;
        FD_CKPT_ERROR("checkpoint index '" << c.index_path_ << "': shard file '" << sp.string()
                                           << "' does not exist (the index maps tensor '" << first << "'"
                                           << (n > 1 ? " and " + std::to_string(n - 1) + " more" : "") << " to it)");
      }
      shard_paths.push_back(sp.string());
    }
  }

  for (const auto& sp : shard_paths) c.shards_.push_back(SafetensorsFile::open(sp));  // validates each header

  // Every tensor in exactly one shard.
  for (size_t s = 0; s < c.shards_.size(); ++s) {
    const auto& ts = c.shards_[s].tensors();
    for (size_t t = 0; t < ts.size(); ++t) {
      const auto [it, fresh] = c.by_name_.emplace(ts[t].name, c.entries_.size());
      if (!fresh)
        FD_CKPT_ERROR("checkpoint '" << path << "', tensor '" << ts[t].name << "': in two shards, '"
                                     << c.shards_[c.entries_[it->second].shard].path() << "' and '"
                                     << c.shards_[s].path() << "'");
      c.entries_.push_back({ts[t].name, s, t});
    }
  }
  if (c.index_path_.empty()) return c;

  // The index and the shards agree, both ways.
  for (const auto& [name, file] : idx.weight_map) {
    const fs::path sp = fs::path(c.index_path_).parent_path() / file;
    const Entry* e = c.find(name);
    if (!e)
      FD_CKPT_ERROR("checkpoint index '" << c.index_path_ << "', tensor '" << name << "': mapped to shard '"
                                         << sp.string() << "', which does not hold it (no shard does)");
    if (c.shards_[e->shard].path() != sp.string())
      FD_CKPT_ERROR("checkpoint index '" << c.index_path_ << "', tensor '" << name << "': mapped to shard '"
                                         << sp.string() << "', which does not hold it (it is in '"
                                         << c.shards_[e->shard].path() << "')");
  }
  for (const auto& e : c.entries_)
    if (!idx.weight_map.count(e.name))
      FD_CKPT_ERROR("safetensors file '" << c.shards_[e.shard].path() << "', tensor '" << e.name
                                         << "': not listed in the index '" << c.index_path_ << "'");
  return c;
}

const Checkpoint::Entry* Checkpoint::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

int64_t Checkpoint::total_bytes() const {
  int64_t n = 0;
  for (const auto& e : entries_) n += int64_t(info(e).nbytes);
  return n;
}

void Checkpoint::check(const std::vector<TensorSpec>& needed, const std::vector<TensorSpec>& skipped) const {
  const std::string where = index_path_.empty() ? shards_.front().path() : index_path_;
  std::map<std::string_view, const TensorSpec*> known;
  for (const auto& s : needed) {
    const Entry* e = find(s.name);
    if (!e)
      FD_CKPT_ERROR("checkpoint '" << where << "', tensor '" << s.name << "': the model needs it but the checkpoint ("
                                   << entries_.size() << " tensors in " << shards_.size()
                                   << " file(s)) does not have it");
    known[s.name] = &s;
  }
  for (const auto& s : skipped) known.emplace(s.name, &s);
  for (const auto& e : entries_) {
    const auto it = known.find(e.name);
    if (it == known.end()) {
      if (is_ignorable_buffer(e.name)) continue;
      FD_CKPT_ERROR("safetensors file '" << shard_of(e).path() << "', tensor '" << e.name
                                         << "': not a tensor of this model (the config implies " << needed.size()
                                         << " tensors; a checkpoint of another model or architecture?)");
    }
    const TensorInfo& t = info(e);
    if (t.shape != it->second->shape)
      FD_CKPT_ERROR("safetensors file '" << shard_of(e).path() << "', tensor '" << e.name << "': shape "
                                         << shape_to_string(t.shape) << " in the file, but the config implies "
                                         << shape_to_string(it->second->shape));
  }
}

std::vector<float> Checkpoint::read_f32(const TensorSpec& spec) const {
  const Entry* e = find(spec.name);
  if (!e)
    FD_CKPT_ERROR("checkpoint '" << (index_path_.empty() ? shards_.front().path() : index_path_) << "', tensor '"
                                 << spec.name << "': not found (" << entries_.size() << " tensors)");
  return shard_of(*e).read_f32(spec.name, spec.shape);
}

// ---------------------------------------------------------------------------------------------------
// The TensorSource over a checkpoint, and the check the load paths call

std::unique_ptr<TensorSource> open_safetensors_source(const std::string& path) {
  return std::make_unique<CheckpointSource>(path);
}

void check_tensor_source(const ModelConfig& cfg, const TensorSource& src) {
  const std::vector<TensorSpec> needed = model_tensor_specs(cfg);
  std::vector<TensorSpec> skipped;
  if (cfg.full_num_layers > cfg.num_layers) {
    ModelConfig full = cfg;
    full.num_layers = cfg.full_num_layers;
    std::set<std::string_view> have;
    for (const auto& s : needed) have.insert(s.name);
    for (auto& s : model_tensor_specs(full))
      if (!have.count(s.name)) skipped.push_back(std::move(s));
  }
  src.check(needed, skipped);
}

// ---------------------------------------------------------------------------------------------------
// Writing

namespace {

// The file names a checkpoint of ours (or transformers') may have left in a folder: model.safetensors,
// model-NNNNN-of-NNNNN.safetensors, the index, and their .tmp files from an interrupted write.
bool is_checkpoint_file(const std::string& name) {
  static const std::regex re(
      R"(model(\.safetensors|-[0-9]{5}-of-[0-9]{5}\.safetensors|\.safetensors\.index\.json)(\.tmp)?)");
  return std::regex_match(name, re);
}

void write_text_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) FD_THROW("cannot write '" << tmp << "'");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) FD_THROW("cannot rename '" << tmp << "' to '" << path << "': " << ec.message());
}

}  // namespace

std::vector<std::string> checkpoint_files_in(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return names;
  for (const auto& de : fs::directory_iterator(dir))
    if (de.is_regular_file() && is_checkpoint_file(de.path().filename().string()))
      names.push_back(de.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

void remove_checkpoint_files(const std::string& dir) {
  for (const auto& name : checkpoint_files_in(dir)) {
    const fs::path p = fs::path(dir) / name;
    std::error_code ec;
    fs::remove(p, ec);
    if (ec) FD_THROW("cannot remove stale checkpoint file '" << p.string() << "': " << ec.message());
  }
}

void write_random_weights(const ModelConfig& cfg, uint64_t seed, DType dtype, const std::string& dir,
                          const std::function<void(int64_t, int64_t)>& progress, int64_t max_shard_bytes) {
  if (max_shard_bytes < 0)
    throw ConfigError("max_shard_bytes must be >= 0 (0: one file), got " + std::to_string(max_shard_bytes));
  fs::create_directories(dir);
  const auto specs = model_tensor_specs(cfg);
  std::vector<int64_t> bytes;
  int64_t total = 0;
  for (const auto& s : specs) {
    bytes.push_back(s.numel() * int64_t(dtype_size(dtype)));
    total += bytes.back();
  }
  std::vector<std::vector<size_t>> plan;
  if (max_shard_bytes == 0) {
    plan.emplace_back();
    for (size_t i = 0; i < specs.size(); ++i) plan.back().push_back(i);
  } else {
    plan = plan_shards(bytes, max_shard_bytes);
  }
  remove_checkpoint_files(dir);  // so a re-run with other sharding leaves one consistent checkpoint

  const std::map<std::string, std::string> meta = {{"format", "pt"},
                                                   {"fastdecode_generator", "fd-weights random"},
                                                   {"fastdecode_seed", std::to_string(seed)},
                                                   {"fastdecode_model", cfg.name}};
  json weight_map = json::object();  // std::map keys: dumped sorted, as transformers' sort_keys=True
  std::vector<char> buf;
  int64_t done = 0;
  for (size_t k = 0; k < plan.size(); ++k) {
    // One shard: plain model.safetensors and no index (huggingface_hub does the same).
    const std::string file = plan.size() == 1 ? kSingleFileName : shard_file_name(int64_t(k) + 1, int64_t(plan.size()));
    std::vector<TensorInfo> infos;
    for (size_t i : plan[k]) {
      TensorInfo t;
      t.name = specs[i].name;
      t.dtype = dtype;
      t.shape = specs[i].shape;
      infos.push_back(t);
      weight_map[specs[i].name] = file;
    }
    SafetensorsWriter w((fs::path(dir) / file).string(), infos, meta);
    for (size_t i : plan[k]) {
      buf.resize(size_t(bytes[i]));
      random_tensor_bytes(specs[i], seed, dtype, buf.data());
      w.write(specs[i].name, buf.data(), buf.size());
      done += bytes[i];
      if (progress) progress(done, total);
    }
    w.finish();
  }
  if (plan.size() > 1) {
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_text_atomically((fs::path(dir) / kIndexFileName).string(), index.dump(2) + "\n");
  }
  const std::string torch_dtype = dtype == DType::F32 ? "float32" : dtype == DType::F16 ? "float16" : "bfloat16";
  write_json_file((fs::path(dir) / "config.json").string(), model_config_to_hf_json(cfg, torch_dtype));
}

}  // namespace fd
