// Experiment configs (strict JSON) and the workloads they describe.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "fastdecode/engine/engine.h"
#include "fastdecode/sched/schedule.h"
#include "harness/engines.h"

namespace fd {

// A length: fixed, or drawn uniformly from [min, max] (seeded).
struct LengthDist {
  int64_t min = 0, max = 0;
  bool fixed() const { return min == max; }
};

struct WeightsConfig {
  std::string dir;      // a folder with model.safetensors (and config.json); empty = random
  uint64_t seed = 0;    // random weights: seed and storage dtype (values rounded through it)
  DType dtype = DType::F16;
};

struct WorkloadConfig {
  int64_t requests = 1;
  LengthDist prompt_len{16, 16};
  LengthDist gen_len{16, 16};
  uint64_t seed = 0;
  std::string arrival = "offline";  // offline: all at t = 0; poisson: at `rate` requests/s (seeded)
  double rate = 0;                  // poisson arrivals per second
  std::string trace_file;           // arrival "trace": JSONL of arrival_s, prompt_len, gen_len[, max_gen_len]
  std::vector<TraceRequest> trace;  // its requests (gen_len = tokens generated; max_gen_len = what the
                                    // scheduler is told, so a request can finish before its projection)
  bool stop_at_eos = false;
};

struct ExperimentConfig {
  std::string file;  // the config file it came from
  std::string name;
  std::string description;
  std::string model_config_path;  // resolved
  ModelConfig model;              // with the layers override applied
  WeightsConfig weights;
  WorkloadConfig workload;
  SchedulerConfig schedule;
  SamplingParams sampling;
  EngineSpec engine;
  HardwareBalance hardware;  // "hardware": the balance emulation, handed to the engine (docs/EXPERIMENTS.md)
  std::string output_dir = "results";  // parent folder of run folders
  json raw;                            // the file as read
  json resolved() const;               // the config with defaults filled in (echoed in summary.json)
};

// Parses and validates everything (model config included) before any work starts. Relative paths are
// resolved against the config file's folder. Throws ConfigError naming the file and key.
ExperimentConfig load_experiment(const std::string& path);
ExperimentConfig parse_experiment(const json& j, const std::string& path);

// Arrival time of each request (seconds from the run's start): 0 offline; seeded Poisson otherwise.
std::vector<double> arrival_times(const WorkloadConfig& w);

// The requests of a workload: seeded prompt tokens and lengths. Token ids avoid the model's
// special ids (bos/eos and below) so no prompt is cut short by a stop token.
std::vector<Request> make_requests(const WorkloadConfig& w, const ModelConfig& m);

// Opens the weights an experiment names.
std::unique_ptr<TensorSource> open_weights(const ExperimentConfig& e);

}  // namespace fd
