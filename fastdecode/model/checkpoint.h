// Checkpoints on disk in the HuggingFace Hub layout: one model.safetensors, or shards
// model-00001-of-0000N.safetensors listed by model.safetensors.index.json
// ({"metadata": {"total_size": bytes}, "weight_map": {tensor: shard file}}). Opening validates every
// shard header and the index against each other; check() validates the tensor set against a model's
// spec list, so a bad checkpoint fails before any tensor is read. Writing of seeded random weights in
// either layout: write_random_weights (declared in weights.h).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "fastdecode/model/safetensors.h"
#include "fastdecode/model/weights.h"

namespace fd {

inline constexpr const char* kSingleFileName = "model.safetensors";
inline constexpr const char* kIndexFileName = "model.safetensors.index.json";

// "model-00002-of-00005.safetensors" (1-based, five digits, as transformers' save_pretrained).
std::string shard_file_name(int64_t shard, int64_t count);

// The HF sharding rule (huggingface_hub split_state_dict_into_shards), tensors kept in the given
// order: a tensor goes into the current shard unless it would push it over max_shard_bytes, then a new
// shard starts; a tensor bigger than the limit gets a shard of its own. Returns, per shard, the indices
// into `tensor_bytes`. max_shard_bytes must be > 0.
std::vector<std::vector<size_t>> plan_shards(const std::vector<int64_t>& tensor_bytes, int64_t max_shard_bytes);

// Harmless buffers that some checkpoints carry and no model of ours reads (e.g.
// "model.layers.3.self_attn.rotary_emb.inv_freq"): accepted by check() and never loaded.
bool is_ignorable_buffer(std::string_view name);

// The checkpoint files in `dir`: model.safetensors, model-NNNNN-of-NNNNN.safetensors,
// model.safetensors.index.json and their .tmp leftovers (sorted names). remove_checkpoint_files deletes
// them (write_random_weights does, before writing, so a folder never mixes two checkpoints).
std::vector<std::string> checkpoint_files_in(const std::string& dir);
void remove_checkpoint_files(const std::string& dir);

class Checkpoint {
 public:
  struct Entry {
    std::string name;
    size_t shard = 0;   // index into shards()
    size_t tensor = 0;  // index into shards()[shard].tensors()
  };

  // `path`: a folder (model.safetensors, or model.safetensors.index.json and its shards), a
  // .safetensors file, or an index .json file. Every shard is opened (memory-mapped; no tensor data is
  // read) and its header validated. Errors (fd::ConfigError) name the file and the tensor: a missing
  // shard, a tensor the index maps to a shard that does not hold it, a tensor in two shards, a shard
  // tensor the index does not list, a truncated shard or bad header.
  static Checkpoint open(const std::string& path);

  const std::string& path() const { return path_; }              // as given
  const std::string& index_path() const { return index_path_; }  // empty without an index
  const std::vector<SafetensorsFile>& shards() const { return shards_; }
  const std::vector<Entry>& entries() const { return entries_; }  // shard order, then header order
  const Entry* find(std::string_view name) const;
  const TensorInfo& info(const Entry& e) const { return shards_[e.shard].tensors()[e.tensor]; }
  const SafetensorsFile& shard_of(const Entry& e) const { return shards_[e.shard]; }
  int64_t total_bytes() const;  // sum of the tensors' byte sizes

  // Validates the whole tensor set: each of `needed` present with its shape; every other tensor either
  // one of `skipped` (shape checked too: tensors of the model this run does not load, e.g. layers past
  // a `layers` override) or an ignorable buffer. Errors (fd::ConfigError) name the file and tensor.
  void check(const std::vector<TensorSpec>& needed, const std::vector<TensorSpec>& skipped) const;

  // The tensor as fp32 (F32, F16, BF16 converted), shape checked against spec.shape.
  std::vector<float> read_f32(const TensorSpec& spec) const;

 private:
  std::string path_, index_path_;
  std::vector<SafetensorsFile> shards_;
  std::vector<Entry> entries_;
  std::map<std::string, size_t, std::less<>> by_name_;  // name -> position in entries_
};

}  // namespace fd
