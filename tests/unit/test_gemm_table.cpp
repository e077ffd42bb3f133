// The GEMM table (fastdecode/spart/gemm_table.h): its file read and written back, lookups, errors that name the file
// and the entry; hardware.gpu.gemm_table in an experiment config and its resolution (harness/engines.h). The table's
// algorithms on the device: tests/gpu/test_cuda_gemm_table.cpp; the engines with a table:
// tests/gpu/test_gpu_only.cpp (GreedyTokensWithAGemmTable).
#include "fastdecode/spart/gemm_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness/engines.h"
#include "harness/experiment.h"
#include "test_helpers.h"

using namespace fd;
using fd::test::error_message;
using fd::test::repo_path;
using ::testing::HasSubstr;

namespace {

json table_json() {
  return json::parse(R"({
    "device": "NVIDIA H200", "cublaslt_version": 130100, "notes": {"made_by": "test"},
    "entries": [
      {"out": 12288, "in": 4096, "rows": 64, "dtype": "fp16", "y_fp32": false, "accumulate": false, "algo": 2,
       "us": 28.4, "default_us": 31.9},
      {"out": 4096, "in": 11008, "rows": 64, "dtype": "fp16", "y_fp32": true, "accumulate": true, "algo": 4},
      {"out": 4096, "in": 11008, "rows": 64, "dtype": "bf16", "y_fp32": true, "accumulate": true, "algo": 1}
    ]})");
}

std::string table_error(const std::function<void(json&)>& edit) {
  json j = table_json();
  edit(j);
  return error_message<ConfigError>([&] { GemmTable::from_json(j, "t.json"); });
}

}  // namespace

TEST(GemmTable, FindsEachProblemExactly) {
  const GemmTable t = GemmTable::from_json(table_json(), "t.json");
  EXPECT_EQ(t.device, "NVIDIA H200");
  EXPECT_EQ(t.cublaslt_version, 130100);
  EXPECT_EQ(t.size(), 3u);
  EXPECT_EQ(t.find({12288, 4096, 64, DType::F16, false, false}), 2);
  EXPECT_EQ(t.find({4096, 11008, 64, DType::F16, true, true}), 4);
  EXPECT_EQ(t.find({4096, 11008, 64, DType::BF16, true, true}), 1);
  // Any other rows, type, output or accumulation: cuBLAS's default.
  EXPECT_EQ(t.find({12288, 4096, 63, DType::F16, false, false}), -1);
  EXPECT_EQ(t.find({12288, 4096, 64, DType::BF16, false, false}), -1);
  EXPECT_EQ(t.find({4096, 11008, 64, DType::F16, true, false}), -1);
  EXPECT_EQ(t.find({4096, 11008, 64, DType::F16, false, true}), -1);
}

TEST(GemmTable, WritesBackWhatItRead) {
  const GemmTable t = GemmTable::from_json(table_json(), "t.json");
  const json out = t.to_json();
  const GemmTable u = GemmTable::from_json(out, "again.json");
  EXPECT_EQ(u.to_json(), out);
  EXPECT_EQ(u.find({12288, 4096, 64, DType::F16, false, false}), 2);
  EXPECT_EQ(out["entries"][2]["us"], 28.4);  // the timings kept (entries sorted by problem)
  GemmTable v = u;
  v.erase({12288, 4096, 64, DType::F16, false, false});
  EXPECT_EQ(v.find({12288, 4096, 64, DType::F16, false, false}), -1);
  EXPECT_EQ(v.size(), 2u);
}

TEST(GemmTable, BadFilesNameTheEntry) {
  EXPECT_THAT(table_error([](json& j) { j["entries"][1]["dtype"] = "fp8"; }), HasSubstr("t.json: entries[1].dtype"));
  EXPECT_THAT(table_error([](json& j) { j["entries"][0]["algo"] = 64; }), HasSubstr("entries[0].algo"));
  EXPECT_THAT(table_error([](json& j) { j["entries"][2]["rows"] = 0; }), HasSubstr("entries[2].rows"));
  EXPECT_THAT(table_error([](json& j) { j["entries"][0]["tile"] = 3; }), HasSubstr("entries[0].tile"));
  EXPECT_THAT(table_error([](json& j) { j["entries"][0].erase("y_fp32"); }), HasSubstr("entries[0].y_fp32"));
  EXPECT_THAT(table_error([](json& j) { j["entries"].push_back(j["entries"][0]); }), HasSubstr("the same problem twice"));
  EXPECT_THAT(table_error([](json& j) { j.erase("device"); }), HasSubstr("device"));
  EXPECT_THAT(table_error([](json& j) { j["entries"] = 3; }), HasSubstr("entries"));
  EXPECT_THAT(error_message<ConfigError>([] { GemmTable::load("/nonexistent/t.json"); }), HasSubstr("/nonexistent/t.json"));
}

TEST(GemmTable, FileNamesFromDeviceNames) {
  EXPECT_EQ(gemm_table_file_name("NVIDIA H200"), "nvidia-h200.json");
  EXPECT_EQ(gemm_table_file_name("NVIDIA GeForce RTX 4090"), "nvidia-geforce-rtx-4090.json");
  EXPECT_EQ(gemm_table_file_name("  A10 (PCIe)  "), "a10-pcie.json");
  EXPECT_EQ(gemm_table_file_name(""), "unnamed.json");
}

TEST(GemmTable, ExperimentKeyAndResolution) {
  const std::string file = repo_path("experiments/test.json");
  json j = json::parse(R"({"name": "t", "model": {"config": "models/tiny-llama.json", "weights": {"seed": 3}},
                           "workload": {"requests": 1, "prompt_len": 2, "gen_len": 2}, "engine": {"type": "reference"}})");
  EXPECT_EQ(parse_experiment(j, file).hardware.gpu_gemm_table, "auto");  // the default
  j["hardware"] = {{"gpu", {{"gemm_table", "none"}}}};
  EXPECT_EQ(parse_experiment(j, file).hardware.gpu_gemm_table, "none");
  j["hardware"]["gpu"]["gemm_table"] = "../configs/gemm/x.json";  // a file, relative to the config's folder
  EXPECT_EQ(parse_experiment(j, file).hardware.gpu_gemm_table, repo_path("configs/gemm/x.json"));
  j["hardware"]["gpu"]["gemm_table"] = "";
  EXPECT_THAT(error_message<ConfigError>([&] { parse_experiment(j, file); }), HasSubstr("hardware.gpu.gemm_table"));
  EXPECT_EQ(resolve_gemm_table("none"), "");
  EXPECT_EQ(resolve_gemm_table("/some/table.json"), "/some/table.json");
  // "auto": the first device's table in configs/gemm/ where one answers and the file exists, else none.
  const std::string a = resolve_gemm_table("auto");
  EXPECT_TRUE(a.empty() || a.find("/configs/gemm/") != std::string::npos) << a;
}
