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

// One request read from a workload file (workload.prompts, workload.score or workload.trace).
struct FileRequest {
  std::string where;             // "FILE:LINE", for error messages
  double arrival_s = 0.0;        // used with "arrival": "trace"
  std::vector<int32_t> prompt;   // the line's token ids; empty = seeded tokens of prompt_len (trace)
  int64_t prompt_len = 0;
  int64_t gen_len = 1;           // tokens generated
  int64_t max_gen_len = 1;       // what the scheduler is told (default gen_len)
  std::vector<int32_t> forced;   // workload.score: the continuation, teacher-forced
  // Per-request sampling overrides, merged over the run's "sampling" (Request::sampling).
  std::optional<double> temperature, top_p;
  std::optional<int64_t> top_k;
  std::optional<uint64_t> seed;
  bool has_sampling() const { return temperature || top_p || top_k || seed; }
};

// workload.slo: per-request latency limits (ms); a request meets the SLO when every limit given holds (vLLM's bench
// serve --goodput and AIPerf's goodput; docs/EXPERIMENTS.md, "Goodput").
struct SloLimits {
  std::optional<double> ttft_ms, tpot_ms, e2e_ms;
  bool any() const { return ttft_ms || tpot_ms || e2e_ms; }
};
// The --slo flag of fd-bench run and fd-sim: "ttft:MS,tpot:MS,e2e:MS" (any of them). ConfigError naming the flag.
SloLimits parse_slo_flag(const std::string& spec);

struct WorkloadConfig {
  int64_t requests = 1;
  LengthDist prompt_len{16, 16};
  LengthDist gen_len{16, 16};
  uint64_t seed = 0;
  std::string arrival = "offline";  // offline: all at t = 0; poisson: at `rate` requests/s (seeded);
                                    // trace: each file line's arrival_s
  double rate = 0;                  // poisson arrivals per second
  // Where the requests come from: "random" (seeded, prompt_len / gen_len), or one of the files.
  std::string source = "random";    // random | trace | prompts | score
  std::string trace_file;           // workload.trace: JSONL of arrival_s, prompt_len | prompt, gen_len, ...
  std::string prompts_file;         // workload.prompts: JSONL of prompt, gen_len, ...
  std::string score_file;           // workload.score: JSONL of prompt, continuation[, arrival_s]
  std::vector<FileRequest> file_requests;  // the file's requests (the first `requests` lines)
  bool stop_at_eos = false;
  SloLimits slo;
};

// output.logits: which requests record their logits, and what the run folder gets from them.
struct LogitsOutput {
  bool write = false;               // output.logits given: logits.jsonl (+ logits/request_ID.npy)
  std::vector<uint64_t> requests;   // ids that record logits (sorted); a score run records all by default
  int64_t top_k = 0;                // top-K [token, logprob] per position in logits.jsonl; 0 = none
  bool full = true;                 // logits/request_ID.npy, fp32 [positions, vocab]
  int64_t full_requests = -1;       // with full: the npy of the first N recorded requests only (-1: every one)
  json spec;                        // output.logits as given (for the resolved config)
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
  LogitsOutput logits;                 // output.logits
  std::vector<std::string> overrides;  // fd-bench --set KEY=VALUE, as given (applied to raw before parsing)
  json raw;                            // the file as read
  json resolved() const;               // the config with defaults filled in (echoed in summary.json)
};

// Parses and validates everything (model config included) before any work starts. Relative paths are
// resolved against the config file's folder. Throws ConfigError naming the file and key.
// `overrides` are fd-bench's --set "dotted.key=VALUE" strings, applied in order (apply_override) to the
// file's JSON before it is validated.
ExperimentConfig load_experiment(const std::string& path, const std::vector<std::string>& overrides = {});
ExperimentConfig parse_experiment(const json& j, const std::string& path);

// Sets one "a.b.c=VALUE" in a config: VALUE is parsed as JSON when it parses, else taken as a string;
// missing intermediate objects are created. Throws ConfigError naming the override (no '=', an empty
// key, or a path through a value that is not an object, naming that key).
void apply_override(json& config, const std::string& assignment);

// Reads a workload file; kind is "prompts", "score" or "trace". Strict: every line a JSON object with
// the kind's keys only. with_arrivals: "arrival": "trace" (arrival_s required, non-decreasing), else
// arrival_s is refused. Throws ConfigError "FILE:LINE: what". Token ids and lengths against the model
// are checked by parse_experiment (validate_request).
std::vector<FileRequest> load_workload_file(const std::string& path, const std::string& kind, bool with_arrivals);

// Arrival time of each request (seconds from the run's start): 0 offline; seeded Poisson otherwise.
std::vector<double> arrival_times(const WorkloadConfig& w);

// The requests of a workload: seeded prompt tokens and lengths. Token ids avoid the model's
// special ids (bos/eos and below) so no prompt is cut short by a stop token.
// Requests from a file take its prompts (or seeded tokens of a trace line's prompt_len), forced
// continuations and sampling overrides (merged over `run_sampling`, the experiment's "sampling").
std::vector<Request> make_requests(const WorkloadConfig& w, const ModelConfig& m,
                                   const SamplingParams& run_sampling = {});

// Opens the weights an experiment names.
std::unique_ptr<TensorSource> open_weights(const ExperimentConfig& e);

}  // namespace fd
