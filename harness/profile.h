// fd-bench profile: the two micro-benchmarks of the performance model, measured on this machine.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "fastdecode/core/json_util.h"
#include "fastdecode/model/model_config.h"
#include "harness/profile_service.h"

namespace fd {

struct ProfileOptions {
  std::vector<int64_t> batches = {1, 2, 4, 8, 16, 32, 64};  // B of T(B), strictly increasing
  std::vector<std::string> kv_dtypes = {"fp16", "int8", "int4"};
  int64_t context = 2048;  // tokens per sequence for R (at least one KV block)
  int reps = 5;
  std::string backend = "cpu";  // S-Part backend for T(B): cpu | cuda
  int r_threads = 1;
  int sm_count = 0;  // > 0: T(B) with the CUDA S-Part on that many SMs (green context); cuda only
  bool service = false;          // also R of R-workers in service (profile_service.h): profile.json's r_service
  ServiceProfileOptions svc;
  std::string command_line;
};

// T(B): seconds of one layer's S-Part (attention input + output and MLP, with the host transfers the
// engine does) for B decode tokens, on the backend, median of reps. R: seconds per context token per layer of decode attention for ONE
// CPU, measured with r_threads CPUs working together (they share the memory bus: R at the deployment's
// CPU count is what predicts it), per KV dtype, at `context` tokens per sequence over enough sequences to
// read from DRAM (r_working_set). Returns profile.json's content (fastdecode/sched/perf_model.h format +
// provenance). Bad options are ConfigErrors naming the flag, raised before any measurement.
json measure_profile(const ModelConfig& model, const ProfileOptions& options);

// Size of the last-level cache: the `size` of the index* entry with the highest `level` under
// `cache_dir` (sysfs: "32768K"); 0 when nothing there can be read.
int64_t read_llc_bytes(const std::string& cache_dir = "/sys/devices/system/cpu/cpu0/cache");
// MemAvailable of /proc/meminfo in bytes; 0 when unreadable.
int64_t read_mem_available_bytes(const std::string& meminfo = "/proc/meminfo");

// How many KV bytes one R measurement reads, so that it streams from DRAM, not from the cache:
//   wanted = max(4 x LLC, 1 GiB, 256 MB x max(1, r_threads / 4))   (LLC unknown (0): 256 MB assumed)
//   bytes  = min(wanted, cap), cap = MemAvailable / 4 (unknown (0): 4 GiB), so the store (one dtype at a
//            time) never takes more than a quarter of the memory free when the profile starts.
struct RWorkingSet {
  int64_t bytes = 0;      // what to read
  int64_t wanted = 0;     // before the cap
  int64_t llc_bytes = 0;  // the LLC size used (the 256 MB fallback when unknown)
  bool llc_known = false;
  int64_t cap_bytes = 0;
  bool capped() const { return bytes < wanted; }
};
constexpr int64_t kRFallbackLLCBytes = 256'000'000;
constexpr int64_t kRMinWorkingSetBytes = int64_t(1) << 30;
RWorkingSet r_working_set(int64_t llc_bytes, int r_threads, int64_t mem_available_bytes);

}  // namespace fd
