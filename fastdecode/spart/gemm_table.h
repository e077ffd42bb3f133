// Which cuBLASLt algorithm the CUDA S-Part runs for each of its weight GEMMs: a table tuned offline on one device
// (fd-spart-bench --tune-gemm), committed, and read at start; without an entry a GEMM runs cuBLAS's own choice
// (cublasGemmEx's default), as it always did. Chosen offline, not by timing at start: the kernel, and so the
// rounding, is the same from run to run. An entry is the index into the list cublasLtMatmulAlgoGetHeuristic returns
// for that problem (deterministic for one cuBLASLt version and device), so a table holds only for the device name and
// cuBLASLt version it records; CudaModel ignores a table made for another, and says so.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "fastdecode/core/dtype.h"
#include "fastdecode/core/json_util.h"

namespace fd {

// y[rows, out] = x[rows, in] · W[out, in]^T (+ y when accumulate), x and W of `dtype`, y of dtype or fp32.
struct GemmProblem {
  int64_t out = 0, in = 0, rows = 0;
  DType dtype = DType::F16;
  bool y_fp32 = false, accumulate = false;
  auto tie() const { return std::tie(out, in, rows, dtype, y_fp32, accumulate); }
  bool operator<(const GemmProblem& o) const { return tie() < o.tie(); }
  bool operator==(const GemmProblem& o) const { return tie() == o.tie(); }
};

class GemmTable {
 public:
  // Reads and checks a table file; ConfigError naming the file and the entry for anything wrong.
  static GemmTable load(const std::string& path);
  static GemmTable from_json(const json& j, const std::string& file);
  json to_json() const;

  // The heuristic index for p, or -1 (cuBLAS's default).
  int find(const GemmProblem& p) const;
  // timing: what the choice was made by ({"us", "default_us"}), kept in the file for its reader.
  void set(const GemmProblem& p, int algo, json timing = json::object()) { algos_[p] = {algo, std::move(timing)}; }
  void erase(const GemmProblem& p) { algos_.erase(p); }
  size_t size() const { return algos_.size(); }

  std::string device;          // cudaDeviceProp::name the table was tuned on
  int64_t cublaslt_version = 0;  // cublasLtGetVersion() it was tuned with
  std::string source;          // the file it came from ("" when made in memory)
  json notes;                  // free-form: the command that made it, per-entry timings

 private:
  std::map<GemmProblem, std::pair<int, json>> algos_;
};

// The table at `path`, shared by the models that use it (each file read once); null for "" (none).
std::shared_ptr<const GemmTable> load_gemm_table(const std::string& path);

// The file name of a device's table in configs/gemm/: its name in lower case, runs of other characters as one
// '-' ("NVIDIA H200" -> "nvidia-h200.json").
std::string gemm_table_file_name(const std::string& device);

}  // namespace fd
