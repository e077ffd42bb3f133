// fd-bench profile: the two micro-benchmarks of the performance model, measured on this machine.
#pragma once
#include <string>
#include <vector>

#include "fastdecode/core/json_util.h"
#include "fastdecode/model/model_config.h"

namespace fd {

// T(B): seconds of one layer's S-Part (attention input + output and MLP, with the host transfers the
// engine does) for B decode tokens, on `backend` (cpu | cuda), median of reps. R: seconds per context token per layer of decode attention for ONE
// CPU, measured with r_threads CPUs working together (they share the memory bus: R at the deployment's
// CPU count is what predicts it), per KV dtype, at `context` tokens per sequence over enough sequences to
// read from DRAM. Returns profile.json's content (fastdecode/sched/perf_model.h format + provenance).
json measure_profile(const ModelConfig& model, const std::vector<int64_t>& batches, const std::vector<std::string>& kv_dtypes,
                     int64_t context, int reps, const std::string& backend, int r_threads, const std::string& command_line);

}  // namespace fd
