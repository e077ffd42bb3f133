// The Engine interface (DESIGN §3): the harness drives every engine (reference, FastDecode, GPU-only,
// baselines) through these few calls. The harness owns the workload, clock, recorder and progress
// display; an engine owns memory and devices.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fastdecode/core/json_util.h"
#include "fastdecode/model/model_config.h"
#include "fastdecode/core/sampling.h"
#include "fastdecode/model/weights.h"

namespace fd {

struct Request {
  uint64_t id = 0;
  std::vector<int32_t> prompt;  // token ids, non-empty
  int64_t max_new_tokens = 1;   // generation stops after this many tokens
  bool stop_at_eos = false;     // also stop when the model emits its eos_token_id
};

struct GeneratedToken {
  uint64_t request_id = 0;
  int32_t token = 0;
  bool finished = false;  // last token of the request; its resources are freed
};

// A timed interval inside a step, drawn as one event on `track` in trace.json.
struct Span {
  std::string track;  // e.g. "reference", later "gpu stream 0", "rworker 1"
  std::string name;   // e.g. "prefill", "decode"
  int64_t start_ns = 0;  // fd::now_ns() clock
  int64_t dur_ns = 0;
};

struct StepResult {
  std::vector<GeneratedToken> tokens;  // one per sequence that advanced this step
  int64_t prefill_tokens = 0;          // prompt tokens processed this step
  int64_t decode_tokens = 0;           // single-token decode inputs processed this step
  int64_t total_context = 0;           // sum of context lengths attended over this step
  std::vector<Span> spans;
  // Where the step's time went, by name (ms), e.g. s_compute, r_wait, r_compute_max (engine-defined).
  std::map<std::string, double> breakdown_ms;
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual std::string name() const = 0;
  // What the engine runs on (backend, devices, workers), for summary.json.
  virtual json info() const { return json::object(); }
  // Queues requests; they start on a following step(). Throws fd::Error for a request the engine cannot
  // run (token outside the vocabulary, longer than the model's positions); nothing is queued then.
  virtual void add(const std::vector<Request>& requests) = 0;
  // Runs one iteration over everything running (and starts queued requests).
  virtual StepResult step() = 0;
  // True when nothing is queued or running.
  virtual bool done() const = 0;
  // Frees resources; the engine may not be used afterwards. Idempotent.
  virtual void shutdown() = 0;
};

// R-workers of the FastDecode engine: spawned locally, or reached at endpoints started by the user.
struct RWorkersConfig {
  std::vector<std::string> endpoints;  // when set, use these and spawn nothing
  int64_t spawn = 2;                   // local fd-rworker processes otherwise
  int64_t threads = 1;                 // compute threads per spawned worker
  std::string kv_dtype = "fp16";       // fp16 | int8 | int4 (spawned workers)
  double memory_gb = 1.0;              // KV memory per spawned worker
  bool pin = false;                    // pin spawned worker i to CPUs [i*threads, (i+1)*threads)
  int64_t timeout_ms = 60000;          // per-step deadline of every R-worker reply
  std::string binary;                  // fd-rworker to spawn; default: next to the running program
};

// Engine settings from the experiment config's "engine" object.
struct EngineConfig {
  std::string type = "reference";
  int64_t threads = 0;  // CPU threads for the engine's own compute; 0 = all cores
  std::string kv_dtype = "fp32";  // reference engine: K/V rounded through this as they are cached
  // fastdecode and gpu-only engines: prompt tokens prefilled per step at most (whole prompts, at least
  // one); the rest start on the following steps
  int64_t prefill_tokens = 16384;
  // fastdecode engine
  std::string backend = "cpu";   // S-Part backend: cpu | cuda ("auto" in a config: cuda when a GPU answers)
  int64_t mini_batches = 2;      // 2 = the two mini-batch pipeline; 1 = no overlap
  std::string wire_dtype = "fp32";
  RWorkersConfig rworkers;
  // gpu-only engine: cache positions reserved per sequence (0 = the model's max_position_embeddings)
  int64_t max_context = 0;
  // gpu-only engine and the fastdecode engine's cuda backend: decode batches of at most 128 rows replayed
  // from CUDA graphs, one per batch size padded to a power of two (gpu-only: the whole greedy step;
  // fastdecode: each S-Part stage between R-Part round trips)
  bool cuda_graphs = true;
  // gpu-only engine and the fastdecode engine's cuda backend: 16-bit type of the GPU weights and
  // activations, fp16 | bf16 (accumulation and the residual stream are fp32 either way)
  std::string dtype = "fp16";
  // Hardware balance (DESIGN §8), set from the experiment's "hardware.gpu" for every engine of a run:
  // GPU memory budget (GB = 1e9 bytes; 0 = the device's) and SMs the engine's GPU work may use (0 = all).
  double gpu_memory_gb = 0;
  int64_t gpu_sm_count = 0;
};

// Checks a request against a model (shared by engines and the harness's up-front validation).
void validate_request(const Request& r, const ModelConfig& model);

}  // namespace fd
