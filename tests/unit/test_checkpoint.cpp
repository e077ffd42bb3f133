// Checkpoints on disk (fastdecode/model/checkpoint.h): sharded == single file == the seeded generator,
// the HF sharding rule and layout, and one test per kind of bad checkpoint, each an fd::ConfigError
// naming the file and the tensor.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "fastdecode/core/json_util.h"
#include "fastdecode/model/checkpoint.h"
#include "test_helpers.h"

using namespace fd;
using fd::test::error_message;
using fd::test::repo_path;
using fd::test::TempDir;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

ModelConfig tiny(const char* name = "tiny-llama-gqa") {
  return load_model_config(repo_path(std::string("experiments/models/") + name + ".json"));
}

std::string config_error(const std::function<void()>& f) {
  return error_message<ConfigError>(f);
}

void expect_parts(const std::string& msg, std::initializer_list<std::string> parts) {
  for (const auto& p : parts) EXPECT_THAT(msg, HasSubstr(p));
}

int64_t bytes_of(const TensorSpec& s, DType dt) {
  return s.numel() * int64_t(dtype_size(dt));
}

// Writes `shards` (file name -> specs, values from the seeded generator) into dir, and an index with
// the true weight_map unless `index` is false. Returns the weight_map written.
json write_layout(const fs::path& dir, const std::vector<std::pair<std::string, std::vector<TensorSpec>>>& shards,
                  bool index = true, DType dt = DType::BF16) {
  fs::create_directories(dir);
  json wm = json::object();
  for (const auto& [file, specs] : shards) {
    std::vector<TensorInfo> infos;
    for (const auto& s : specs) infos.push_back({s.name, dt, s.shape});
    SafetensorsWriter w((dir / file).string(), infos, {{"format", "pt"}});
    for (const auto& s : specs) {
      std::vector<char> b(size_t(bytes_of(s, dt)));
      random_tensor_bytes(s, 1, dt, b.data());
      w.write(s.name, b.data(), b.size());
      wm[s.name] = file;
    }
    w.finish();
  }
  if (index) write_json_file((dir / kIndexFileName).string(), {{"metadata", {{"total_size", 0}}}, {"weight_map", wm}});
  return wm;
}

// The model's specs split over two shards (first half, second half).
std::vector<std::pair<std::string, std::vector<TensorSpec>>> two_shards(std::vector<TensorSpec> specs) {
  const size_t h = specs.size() / 2;
  return {{shard_file_name(1, 2), {specs.begin(), specs.begin() + long(h)}},
          {shard_file_name(2, 2), {specs.begin() + long(h), specs.end()}}};
}

void expect_same_weights(const ModelConfig& c, TensorSource& a, TensorSource& b) {
  for (const auto& s : model_tensor_specs(c)) {
    const std::vector<float> x = a.read(s), y = b.read(s);
    ASSERT_EQ(x.size(), y.size()) << s.name;
    EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * sizeof(float))) << s.name;  // bit-equal fp32
  }
}

}  // namespace

TEST(Checkpoint, ShardPlanFollowsTheHfRule) {
  using Plan = std::vector<std::vector<size_t>>;
  EXPECT_EQ(plan_shards({3, 3, 3}, 6), (Plan{{0, 1}, {2}}));
  EXPECT_EQ(plan_shards({3, 3, 3}, 9), (Plan{{0, 1, 2}}));             // exactly the limit still fits
  EXPECT_EQ(plan_shards({4, 2}, 5), (Plan{{0}, {1}}));                 // 4 + 2 > 5
  EXPECT_EQ(plan_shards({2, 10, 2, 2}, 5), (Plan{{0}, {1}, {2, 3}}));  // too big: a shard of its own
  EXPECT_EQ(plan_shards({10, 11}, 5), (Plan{{0}, {1}}));
  EXPECT_EQ(plan_shards({}, 5), Plan{});
  EXPECT_EQ(shard_file_name(2, 13), "model-00002-of-00013.safetensors");
}

TEST(Checkpoint, ShardedEqualsSingleFileEqualsGenerator) {
  TempDir d("ckpt_rt");
  const ModelConfig c = tiny();
  const int64_t max_shard = 60000;  // bytes: several shards, and the 81920-byte embeddings get their own
  write_random_weights(c, 9, DType::BF16, d.file("single"));
  write_random_weights(c, 9, DType::BF16, d.file("sharded"), nullptr, max_shard);
  ASSERT_FALSE(fs::exists(d.file("single/") + kIndexFileName));
  ASSERT_TRUE(fs::exists(d.file("sharded/") + kIndexFileName));
  ASSERT_FALSE(fs::exists(d.file("sharded/") + kSingleFileName));

  auto gen = make_random_source(9, DType::BF16);
  for (const std::string p : {d.file("sharded"), d.file("sharded/") + kIndexFileName}) {
    auto single = open_safetensors_source(d.file("single"));
    auto sharded = open_safetensors_source(p);
    check_tensor_source(c, *single);
    check_tensor_source(c, *sharded);
    expect_same_weights(c, *sharded, *single);
    expect_same_weights(c, *sharded, *gen);
  }
  // A single file given as a file works too.
  auto file = open_safetensors_source(d.file("single/") + kSingleFileName);
  check_tensor_source(c, *file);
  expect_same_weights(c, *file, *gen);
}

TEST(Checkpoint, ShardedLayoutIsTheHubLayout) {
  TempDir d("ckpt_layout");
  const ModelConfig c = tiny();
  const DType dt = DType::F16;
  const int64_t max_shard = 70000;
  write_random_weights(c, 4, dt, d.path.string(), nullptr, max_shard);
  const auto specs = model_tensor_specs(c);
  const json index = read_json_file(d.file(kIndexFileName));
  const json& wm = index["weight_map"];
  int64_t total = 0;
  for (const auto& s : specs) total += bytes_of(s, dt);
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), total);
  EXPECT_EQ(wm.size(), specs.size());

  const Checkpoint ck = Checkpoint::open(d.path.string());
  const size_t n = ck.shards().size();
  ASSERT_GE(n, 3u);
  // Shards in order, tensors in spec order across them, each in exactly one shard (open checks that).
  size_t next = 0;
  int64_t prev_bytes = -1;
  for (size_t k = 0; k < n; ++k) {
    const SafetensorsFile& f = ck.shards()[k];
    EXPECT_EQ(fs::path(f.path()).filename().string(), shard_file_name(int64_t(k) + 1, int64_t(n)));
    EXPECT_EQ(f.metadata().at("format"), "pt");
    int64_t bytes = 0;
    for (const auto& t : f.tensors()) {
      ASSERT_LT(next, specs.size());
      EXPECT_EQ(t.name, specs[next].name);
      EXPECT_EQ(wm[t.name], fs::path(f.path()).filename().string());
      bytes += int64_t(t.nbytes);
      ++next;
    }
    // Over the limit only as a lone tensor; and the previous shard was closed because this shard's
    // first tensor did not fit in it.
    if (bytes > max_shard) EXPECT_EQ(f.tensors().size(), 1u) << f.path();
    if (prev_bytes >= 0) EXPECT_GT(prev_bytes + int64_t(f.tensors().front().nbytes), max_shard) << f.path();
    prev_bytes = bytes;
  }
  EXPECT_EQ(next, specs.size());

  // Everything fits in one shard: a plain model.safetensors and no index (as huggingface_hub).
  TempDir one("ckpt_one");
  write_random_weights(c, 4, dt, one.path.string(), nullptr, int64_t(1) << 40);
  EXPECT_TRUE(fs::exists(one.file(kSingleFileName)));
  EXPECT_FALSE(fs::exists(one.file(kIndexFileName)));
}

TEST(Checkpoint, RewritingWithOtherShardingLeavesOneCheckpoint) {
  TempDir d("ckpt_stale");
  const ModelConfig c = tiny();
  write_random_weights(c, 1, DType::F16, d.path.string(), nullptr, 50000);
  const size_t sharded = checkpoint_files_in(d.path.string()).size();
  EXPECT_GT(sharded, 3u);
  write_random_weights(c, 2, DType::F16, d.path.string(), nullptr, 0);
  EXPECT_EQ(checkpoint_files_in(d.path.string()), std::vector<std::string>{kSingleFileName});
  write_random_weights(c, 3, DType::F16, d.path.string(), nullptr, 100000);
  const auto files = checkpoint_files_in(d.path.string());
  EXPECT_EQ(std::count(files.begin(), files.end(), std::string(kSingleFileName)), 0);
  auto src = open_safetensors_source(d.path.string());
  check_tensor_source(c, *src);
  auto gen = make_random_source(3, DType::F16);
  expect_same_weights(c, *src, *gen);
}

TEST(Checkpoint, ReducedLayersLoadFromTheFullCheckpoint) {
  TempDir d("ckpt_layers");
  const ModelConfig c = tiny();
  write_random_weights(c, 6, DType::F16, d.path.string(), nullptr, 60000);
  const ModelConfig one = with_layers(c, 1);
  auto src = open_safetensors_source(d.path.string());
  check_tensor_source(one, *src);  // layers 1 and 2 are in the files and skipped, not "unused"
  auto gen = make_random_source(6, DType::F16);
  expect_same_weights(one, *src, *gen);
}

// ---- bad checkpoints: each an fd::ConfigError naming the file and the tensor ----

TEST(CheckpointBad, TruncatedShard) {
  TempDir d("ckpt_trunc");
  const auto layout = two_shards(model_tensor_specs(tiny()));
  write_layout(d.path, layout);
  const std::string s2 = d.file(shard_file_name(2, 2));
  fs::resize_file(s2, fs::file_size(s2) - 1);  // the last tensor's data now reach past the end
  std::string msg = config_error([&] { Checkpoint::open(d.path.string()); });
  expect_parts(msg, {s2, layout[1].second.back().name, "truncated"});
  fs::resize_file(s2, 20);  // now the header length itself reaches past the end
  msg = config_error([&] { Checkpoint::open(d.path.string()); });
  expect_parts(msg, {s2, "header length", "exceeds the file"});
}

TEST(CheckpointBad, IndexNamesAMissingShard) {
  TempDir d("ckpt_noshard");
  const auto layout = two_shards(model_tensor_specs(tiny()));
  write_layout(d.path, layout);
  fs::remove(d.file(shard_file_name(2, 2)));
  std::string first = layout[1].second.front().name;  // the first of its tensors in the (sorted) index
  for (const auto& s : layout[1].second) first = std::min(first, s.name);
  const std::string msg = config_error([&] { open_safetensors_source(d.path.string()); });
  expect_parts(msg, {d.file(kIndexFileName), d.file(shard_file_name(2, 2)), "does not exist", "'" + first + "'"});
}

TEST(CheckpointBad, IndexMapsATensorToAShardThatDoesNotHoldIt) {
  TempDir d("ckpt_wrongmap");
  const auto layout = two_shards(model_tensor_specs(tiny()));
  json wm = write_layout(d.path, layout);
  const std::string moved = layout[0].second[1].name;
  wm[moved] = shard_file_name(2, 2);
  write_json_file(d.file(kIndexFileName), {{"metadata", {{"total_size", 0}}}, {"weight_map", wm}});
  std::string msg = config_error([&] { Checkpoint::open(d.path.string()); });
  expect_parts(msg, {d.file(kIndexFileName), moved, shard_file_name(2, 2), "does not hold it", shard_file_name(1, 2)});
  // A tensor no shard holds at all.
  wm = write_layout(d.path, layout);
  wm["model.layers.7.mlp.up_proj.weight"] = shard_file_name(1, 2);
  write_json_file(d.file(kIndexFileName), {{"weight_map", wm}});
  msg = config_error([&] { Checkpoint::open(d.path.string()); });
  expect_parts(msg, {d.file(kIndexFileName), "model.layers.7.mlp.up_proj.weight", "does not hold it"});
}

TEST(CheckpointBad, TensorInTwoShards) {
  TempDir d("ckpt_twice");
  auto layout = two_shards(model_tensor_specs(tiny()));
  const TensorSpec dup = layout[0].second.back();
  layout[1].second.push_back(dup);
  write_layout(d.path, layout);  // the index maps it to shard 2, the later one
  const std::string msg = config_error([&] { Checkpoint::open(d.path.string()); });
  expect_parts(msg, {dup.name, "two shards", d.file(shard_file_name(1, 2)), d.file(shard_file_name(2, 2))});
}

TEST(CheckpointBad, ShardTensorTheIndexDoesNotList) {
  TempDir d("ckpt_unlisted");
  const auto layout = two_shards(model_tensor_specs(tiny()));
  json wm = write_layout(d.path, layout);
  const std::string hidden = layout[1].second[2].name;
  wm.erase(hidden);
  write_json_file(d.file(kIndexFileName), {{"weight_map", wm}});
  const std::string msg = config_error([&] { Checkpoint::open(d.file(kIndexFileName)); });
  expect_parts(msg, {d.file(shard_file_name(2, 2)), hidden, "not listed in the index"});
}

TEST(CheckpointBad, UnsupportedDtype) {
  TempDir d("ckpt_dtype");
  const auto layout = two_shards(model_tensor_specs(tiny()));
  json wm = write_layout(d.path, layout);
  // A third shard with an I64 tensor, listed in the index.
  const std::string header = R"({"model.layers.0.step":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char(uint64_t(header.size()) >> (8 * i));
  std::ofstream(d.file("extra.safetensors"), std::ios::binary) << bytes << header << std::string(8, '\0');
  wm["model.layers.0.step"] = "extra.safetensors";
  write_json_file(d.file(kIndexFileName), {{"weight_map", wm}});
  const std::string msg = config_error([&] { Checkpoint::open(d.path.string()); });
  expect_parts(msg, {d.file("extra.safetensors"), "model.layers.0.step", "unsupported dtype \"I64\""});
}

TEST(CheckpointBad, ShapeTheConfigDoesNotImply) {
  TempDir d("ckpt_shape");
  const ModelConfig c = tiny();
  auto specs = model_tensor_specs(c);
  for (auto& s : specs)
    if (s.name == "model.layers.2.self_attn.k_proj.weight") s.shape = {128, 128};  // MHA, but the config is GQA
  write_layout(d.path, two_shards(specs));
  auto src = open_safetensors_source(d.path.string());
  const std::string msg = config_error([&] { check_tensor_source(c, *src); });
  expect_parts(msg,
               {d.file(shard_file_name(2, 2)), "model.layers.2.self_attn.k_proj.weight", "[128, 128]", "[64, 128]"});
}

TEST(CheckpointBad, TensorTheModelNeedsIsMissing) {
  TempDir d("ckpt_missing");
  const ModelConfig c = tiny();
  auto specs = model_tensor_specs(c);
  std::erase_if(specs, [](const TensorSpec& s) { return s.name == "model.layers.1.mlp.gate_proj.weight"; });
  write_layout(d.path, two_shards(specs));
  auto src = open_safetensors_source(d.path.string());
  const std::string msg = config_error([&] { check_tensor_source(c, *src); });
  expect_parts(msg, {d.file(kIndexFileName), "model.layers.1.mlp.gate_proj.weight", "does not have it"});
}

TEST(CheckpointBad, TensorTheModelDoesNotUse) {
  TempDir d("ckpt_unused");
  const ModelConfig c = tiny();
  auto specs = model_tensor_specs(c);
  // Harmless rotary buffers are accepted...
  specs.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", {16}, 0, 0});
  write_layout(d.file("ok"), two_shards(specs));
  auto ok = open_safetensors_source(d.file("ok"));
  check_tensor_source(c, *ok);
  // ...anything else is not.
  specs.push_back({"model.layers.0.self_attn.q_norm.weight", {32}, 1, 0});
  write_layout(d.file("bad"), two_shards(specs));
  auto bad = open_safetensors_source(d.file("bad"));
  const std::string msg = config_error([&] { check_tensor_source(c, *bad); });
  expect_parts(msg, {d.file("bad/") + shard_file_name(2, 2), "model.layers.0.self_attn.q_norm.weight",
                     "not a tensor of this model"});
  // Layers beyond the config's depth are unused too (here: a 4-layer checkpoint for a 3-layer config).
  json j = read_json_file(repo_path("experiments/models/tiny-llama-gqa.json"));
  j["num_hidden_layers"] = 4;
  write_random_weights(model_config_from_json(j, "deeper.json"), 1, DType::F16, d.file("deeper"), nullptr, 60000);
  auto deeper = open_safetensors_source(d.file("deeper"));
  expect_parts(config_error([&] { check_tensor_source(c, *deeper); }),
               {"model.layers.3.", "not a tensor of this model"});
}

TEST(CheckpointBad, AmbiguousOrEmptyFolderAndBadIndex) {
  TempDir d("ckpt_folder");
  expect_parts(config_error([&] { Checkpoint::open(d.path.string()); }), {d.path.string(), "neither"});
  expect_parts(config_error([&] { Checkpoint::open(d.file("nope")); }), {d.file("nope"), "no such file"});
  const auto layout = two_shards(model_tensor_specs(tiny()));
  write_layout(d.path, layout);
  // An old caller passing dir/model.safetensors is told to pass the folder.
  expect_parts(config_error([&] { Checkpoint::open(d.file(kSingleFileName)); }), {"pass the folder"});
  write_layout(d.path, {{kSingleFileName, layout[0].second}}, false);
  expect_parts(config_error([&] { Checkpoint::open(d.path.string()); }), {"both", "ambiguous"});
  fs::remove(d.file(kSingleFileName));
  std::ofstream(d.file(kIndexFileName)) << R"({"weight_map": {"a": "x.safetensors", "a": "y.safetensors"}})";
  expect_parts(config_error([&] { Checkpoint::open(d.path.string()); }), {kIndexFileName, "'a'", "more than once"});
  std::ofstream(d.file(kIndexFileName)) << R"({"weight_map": {"a": "../x.safetensors"}})";
  expect_parts(config_error([&] { Checkpoint::open(d.path.string()); }), {kIndexFileName, "'a'", "relative path"});
  std::ofstream(d.file(kIndexFileName)) << R"({"metadata": {}})";
  expect_parts(config_error([&] { Checkpoint::open(d.path.string()); }), {kIndexFileName, "weight_map"});
  std::ofstream(d.file(kIndexFileName)) << "{not json";
  expect_parts(config_error([&] { Checkpoint::open(d.path.string()); }), {kIndexFileName, "not valid JSON"});
}

// Issue 16: a NaN or Inf weight is refused at load, naming the file and the tensor, in every stored dtype
// (NaN weights used to run to exit 0 with every token 0). Values are planted in the bytes on disk.
TEST(CheckpointBad, NonFiniteWeightsRefusedAtLoad) {
  TempDir d("ckpt_nonfinite");
  const ModelConfig c = tiny();
  const auto specs = model_tensor_specs(c);
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    for (const char* what : {"nan", "inf"}) {
      const std::string dir = d.file(std::string(dtype_name(dt)) + "_" + what);
      write_layout(dir, {{kSingleFileName, specs}}, false, dt);
      const char* victim = std::string(what) == "nan" ? "model.layers.1.mlp.up_proj.weight" : "model.norm.weight";
      {  // plant the value at element 5 of the tensor (our writer leaves no bytes after the last tensor)
        const SafetensorsFile f = SafetensorsFile::open(dir + "/" + kSingleFileName);
        size_t data_bytes = 0;
        for (const auto& x : f.tensors()) data_bytes = std::max(data_bytes, x.offset + x.nbytes);
        const size_t pos = f.file_size() - data_bytes + f.get(victim).offset + 5 * dtype_size(dt);
        const float v = std::string(what) == "nan" ? std::nanf("") : INFINITY;
        char b[4];
        convert_from_f32(dt, &v, b, 1);
        std::fstream io(dir + "/" + kSingleFileName, std::ios::in | std::ios::out | std::ios::binary);
        io.seekp(std::streamoff(pos));
        io.write(b, std::streamsize(dtype_size(dt)));
      }
      auto src = open_safetensors_source(dir);
      check_tensor_source(c, *src);  // the tensor set is fine: the values are not
      const std::string msg = config_error([&] { load_model_weights(c, *src); });
      expect_parts(msg, {dir + "/" + kSingleFileName, victim, "1 non-finite value",
                         std::string(what) == "nan" ? "NaN first at element 5" : "Inf first at element 5"});
    }
  }
  // The unplanted checkpoint loads.
  write_layout(d.file("ok"), {{kSingleFileName, specs}}, false);
  auto ok = open_safetensors_source(d.file("ok"));
  EXPECT_NO_THROW(load_model_weights(c, *ok));
}
