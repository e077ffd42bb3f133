// The Engine interface (docs/ARCHITECTURE.md): the harness drives every engine (reference, FastDecode, GPU-only,
// baselines) through these few calls. The harness owns the workload, clock, recorder and progress
// display; an engine owns memory and devices.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
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
  // This request's sampling; unset = the run's (EngineContext::sampling). The draw stays a pure function
  // of (sampling.seed, id, step), so a request's tokens do not depend on its batch-mates' settings.
  std::optional<SamplingParams> sampling;
  // Teacher forcing (workload.score): when non-empty, the model still picks a token at every step (that
  // pick is what the step emits, GeneratedToken::token), but the token appended to the sequence and fed
  // to the next step is forced[i] for the i-th generated token. max_new_tokens == forced.size() and
  // stop_at_eos == false (validate_request checks both), so every engine scores the same token stream.
  std::vector<int32_t> forced;
  // Record this request's full logits row (fp32 [vocab], as the engine computed them, before sampling)
  // for every generated token, in GeneratedToken::logits. Off = nothing copied, nothing kept.
  bool record_logits = false;

  // The sampling of this request: its own, else the run's.
  const SamplingParams& sampling_or(const SamplingParams& run) const { return sampling ? *sampling : run; }
  // The token the sequence continues with after `pick` was its `generated`-th (0-based) generated token:
  // the pick itself, or the forced one (teacher forcing).
  int32_t next_input(int64_t generated, int32_t pick) const {
    return forced.empty() ? pick : forced[size_t(generated)];
  }
};

// How a batch's rows are sampled, for engines that sample a batch at once: each row with its request's
// sampling (else the run's) and (request id, step); the rows whose logits are recorded, in order; and
// whether every row is greedy.
struct RowDraws {
  std::vector<SamplingParams> params;
  std::vector<uint64_t> ids, steps;
  std::vector<int32_t> record;
  bool greedy = true;
  // Appends the row of request `r`, which has generated `generated` tokens so far.
  void add(const Request& r, int64_t generated, const SamplingParams& run) {
    if (r.record_logits) record.push_back(int32_t(params.size()));
    params.push_back(r.sampling_or(run));
    greedy = greedy && params.back().greedy();
    ids.push_back(r.id), steps.push_back(uint64_t(generated));
  }
};

struct GeneratedToken {
  uint64_t request_id = 0;
  int32_t token = 0;
  bool finished = false;  // last token of the request; its resources are freed
  std::vector<float> logits;  // [vocab] when the request has record_logits, else empty
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
  // Engine-defined event counts of the step, e.g. swap_out_bytes, preempted_swap (paged-swap); the harness
  // writes them per step and sums them per run. Empty = nothing to count.
  std::map<std::string, int64_t> counts;
  // Engines whose KV lives on several workers: the busiest worker's KV tokens attended by this step's decode over
  // the mean of the live workers' (1 = balanced; 0 = the engine has no workers or the step decoded nothing).
  double worker_kv_imbalance = 0;
};

// A sequence's sampled token `pick` into the step's result: the sequence (any struct with `req`, `generated` and
// `last`) continues with the pick or its forced token (teacher forcing), and the request is finished at
// max_new_tokens or at `eos_id` when it stops there. logits: the [vocab] row the pick was made from, when the
// request records them (else null).
template <class Seq>
void emit_pick(Seq& s, int32_t pick, const float* logits, int32_t eos_id, int64_t vocab, StepResult& out) {
  s.last = s.req.next_input(s.generated, pick);
  ++s.generated;
  const bool eos = s.req.stop_at_eos && pick == eos_id;
  out.tokens.push_back({s.req.id, pick, s.generated >= s.req.max_new_tokens || eos, {}});
  if (logits) out.tokens.back().logits.assign(logits, logits + vocab);
}

// How much an engine can hold, for the harness's admission: typed, so the harness needs to know nothing
// of any engine.
struct EngineCapacity {
  int64_t kv_tokens = 0;  // KV tokens it holds in the worst case for the workload; 0 = not bounded here
  int64_t slots = 0;      // sequences it runs at once at most (it queues the rest); 0 = no fixed bound
  std::string note;       // how kv_tokens was derived (printed by the runner)
  std::string error;      // set when one request of the workload cannot fit at all: what to change
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
  // What it can hold for a workload whose prompts have at least `min_prompt` tokens and whose sequences
  // reach at most `max_len` positions (prompt + projected generation); see EngineCapacity.
  virtual EngineCapacity capacity(int64_t min_prompt, int64_t max_len) const { return {}; }
  // Called once before the first step(): sets up now what the run's first steps of up to max_batch sequences would
  // set up on first use (the CUDA graphs of each decode size), so that those steps cost what later ones do. Results
  // are unchanged. Returns what it prepared, for summary.json (empty: nothing).
  virtual json warm_up(int64_t max_batch) { return json::object(); }
  // Remarks for summary.json on how the run's config and hardware apply to this engine (e.g. a GPU
  // budget it does not use), each a sentence.
  const std::vector<std::string>& notes() const { return notes_; }

 protected:
  std::vector<std::string> notes_;
};

// Hardware the engine may use: the experiment's "hardware" object, the same for every engine of a run
// (hardware-balance emulation, docs/EXPERIMENTS.md). Each engine applies what concerns it. 0 = not set.
// The link between the S-worker and each spawned R-worker when they are to run "on other hosts" on one machine
// (fastdecode/sworker/netemu.h: a network namespace per worker behind a veth pair shaped to this rate and delay).
struct NetworkLink {
  std::string name;       // "loopback" (none: the default), a preset ("10gbe", "25gbe", "100gbe", "ib-hdr") or "custom"
  double rate_gbit = 0;   // each direction's rate (Gbit/s, tc tbf); 0 = not shaped
  double delay_ms = 0;    // one-way delay (tc netem); 0 = none
  bool emulated() const { return rate_gbit > 0 || delay_ms > 0; }
};

struct HardwareBalance {
  double gpu_memory_gb = 0;    // GPU memory budget (GB = 1e9 bytes) for its GPU work; 0 = the device's
  int64_t gpu_sm_count = 0;    // SMs its GPU work may use (a CUDA green context); 0 = all
  int64_t rworkers = 0;        // spawned R-workers, pinned to disjoint cores; 0 = the engine's own count
  int64_t rworker_threads = 0; // compute threads (cores) per spawned R-worker
  NetworkLink network;         // spawned R-workers behind an emulated link (multi-host emulation)
  // The CUDA S-Part's GEMM table (fastdecode/spart/gemm_table.h): a file, or "" for none (cuBLAS's default
  // algorithms). Experiment configs say "auto" (the default), which the harness resolves to the device's table in
  // configs/gemm/ when there is one, or "none".
  std::string gpu_gemm_table;
};

// What an engine is made with besides its own config section.
struct EngineContext {
  const ModelConfig& model;
  TensorSource& weights;
  SamplingParams sampling{};
  HardwareBalance hardware{};
};

// Checks a request against a model (shared by engines and the harness's up-front validation).
void validate_request(const Request& r, const ModelConfig& model);

}  // namespace fd
