// One S-rank of the FastDecode engine: an S-Part (the whole model, or tensor part t of pipeline stage p's
// layers) with its own group of R-workers, which hold the KV of that rank's heads and layers only. The
// engine (fastdecode_engine.cpp, the leader) owns the sequences: it places them, splits each step into
// mini-batches and a prefill batch (a StepPlan, the same for every rank) and emits the tokens; a rank runs
// the plan's S-Part work and R-worker traffic. With one rank (T = P = 1) the leader runs it inline; with
// more, each rank runs the step on its own thread (docs/PARALLEL.md), talking to its tensor group through
// the S-Part's collectives and to its neighbouring stages through `pp` (send/recv of the residual stream).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fastdecode/engine/engine.h"
#include "fastdecode/spart/spart.h"
#include "fastdecode/sworker/rank_recorder.h"
#include "fastdecode/sworker/rworker_spawn.h"
#include "fastdecode/wire/rworker_client.h"

namespace fd {

class Communicator;

// One mini-batch of a step (decode: slot = its index; prefill: the slot after the decode ones). Rows are
// ordered by owning worker index (the same index in every rank's group), so each worker's rows are one
// contiguous range.
struct PlanBatch {
  int slot = 0;
  std::vector<uint64_t> ids;
  std::vector<size_t> workers;     // per row
  std::vector<int32_t> tokens;     // first stage: the tokens to embed (prefill: the prompts, packed)
  std::vector<int64_t> pos;        // per token
  std::vector<int64_t> starts;     // prefill: first token of each sequence, then the total
  std::vector<int32_t> sample_rows;  // the rows sampled (decode: all; prefill: each prompt's last token)
  RowDraws draws;                  // their sampling
};

// The FastDecode engine's step plan: what every S-rank runs in one step, the same for all of them. Each engine that
// cuts a step for its ranks has one, named for the concept: StepPlan here, GpuOnlyStepPlan, HybridStepPlan (and the
// paged-swap scheduler's PagedStepPlan). One role, not one type: a row here is a sequence on an R-worker (its worker
// index, its id) and the plan carries the step's commands to the workers (frees, adds, recovery's drops and
// truncates), where a GPU-only row is a cache slot on the GPU; and one program links every engine, so two layouts may
// not share a name (tests/layering: odr).
struct StepPlan {
  // Recovery only (docs/RELIABILITY.md), before anything else: sequences to free one by one where a worker may or
  // may not hold them (unknown ids ignored), and sequences to cut back to their length before a failed step.
  std::vector<std::pair<size_t, std::vector<uint64_t>>> drop;
  struct Truncate {
    size_t worker = 0;
    std::vector<uint64_t> ids;
    std::vector<uint32_t> lengths;
  };
  std::vector<Truncate> truncates;
  std::vector<std::pair<size_t, std::vector<uint64_t>>> frees;  // FREE_SEQ per worker, before the step's work
  std::vector<PlanBatch> decode;
  // The decode batches in waves: wave w is decode[waves[w], waves[w + 1]). A rank runs one wave after another,
  // each its mini-batches interleaved (the S-Part of one while the R-workers attend for another), and a stage
  // hands a wave on as it finishes it: stage p + 1 works on wave w while stage p works on wave w + 1.
  std::vector<size_t> waves;
  bool has_prefill = false;
  PlanBatch prefill;
  std::vector<std::pair<size_t, std::vector<uint64_t>>> adds;   // ADD_SEQ per worker, for the prefill batch
};

// What a rank gives back from a step. Tokens and recorded logits come from the last stage (every tensor
// rank of it picks the same ones; the leader reads tensor rank 0's).
struct RankStep {
  std::vector<std::vector<int32_t>> decode_tokens;  // per decode batch
  std::vector<std::vector<float>> decode_recorded;  // per decode batch: [record.size(), V]
  std::vector<int32_t> prefill_tokens;
  std::vector<float> prefill_recorded;
  RankTiming timing;  // how long each piece took, the trace (rank_recorder.h)
};

struct SRankOptions {
  int tp_rank = 0, tp_size = 1, pp_rank = 0, pp_size = 1;
  int64_t layer_begin = 0;              // the global index of this rank's first layer (span names)
  proto::WireDType wire = proto::WireDType::F32;
  std::string track_suffix;             // "" (one rank: today's track names) or " t0 p1"
  std::string worker_prefix = "rworker ";  // span track of worker w: prefix + w ("rworker g3." with ranks)
  // Decode: the S-Part writes each worker's ids and q/k/v straight into a block of that worker's shared-memory region
  // when its lane is active and has room (sent where they lie: no copy into the region); false: into this rank's
  // staging, copied into the region at each send (engine.rworkers.shm_in_place, for A/B).
  bool shm_in_place = true;
  // Prefill: the most K and V bytes of one APPEND_KV (whole sequences; a longer prompt goes alone), so that a worker
  // stores one chunk while the next is on its way (engine.rworkers.append_chunk_kb).
  size_t append_chunk_bytes = size_t(8) << 20;
  // Prefill: the host K/V buffers (pinned on a CUDA S-Part) are made for this many tokens when the rank is built,
  // not at the first prefill, whose time to first token they would add to (engine.prefill_tokens; 0: at first use),
  // each at most kPrefillReserveBytes.
  int64_t prefill_reserve_tokens = 0;
};
constexpr size_t kPrefillReserveBytes = size_t(1) << 30;

class SRank {
 public:
  // Says HELLO to every worker of `client` with this rank's shape (its layers, its heads).
  SRank(std::unique_ptr<SPart> spart, std::unique_ptr<RWorkerClient> client, Communicator* pp, SRankOptions o);
  ~SRank();
  SRank(const SRank&) = delete;
  SRank& operator=(const SRank&) = delete;

  // The plan's work for this rank. Throws on a worker error or deadline, or a failed hand-off.
  RankStep run(const StepPlan& plan);
  // Waits for the FREE_SEQ replies still pending (the last step's frees).
  void collect_frees();
  // Workers spawned here (tokens[w]: each one's shutdown token): SHUTDOWN; listed ones: CLOSE (their sessions end,
  // their sequences are freed) and they stay up. Workers known lost are skipped.
  void shutdown(bool spawned, const std::vector<std::string>& tokens);
  // After a failed step: stops using the workers at `dead` indices, collects (and drops) every reply still due
  // from the others, forgets pending frees. The engine then undoes the step with a recovery plan.
  void recover(const std::vector<size_t>& dead);

  RWorkerClient& client() { return *client_; }
  const std::string& endpoint(size_t w) const { return client_->endpoint(w); }
  SPart& spart() { return *spart_; }
  // The S-Part's warm-up (SPart::warm_up) for decode slots 0..slots-1 of up to max_rows rows each, in the wire's dtype;
  // returns the graphs captured.
  int64_t warm_up(int slots, int64_t max_rows);
  const std::vector<json>& hello() const { return hello_; }
  const SRankOptions& options() const { return o_; }
  const ModelConfig& config() const { return spart_->config(); }
  // Whether worker w's shared-memory region is registered with the S-Part's device (its replies copied up by DMA).
  bool region_pinned(size_t w) const { return w < pinned_.size() && pinned_[w].ok; }

 private:
  struct Batch;  // a plan batch in flight: its host buffers and per-worker ranges
  DType host_dtype() const;
  size_t row_bytes(int64_t width) const;
  proto::Header header(proto::MsgType t, int layer, size_t n_seq) const;
  void setup(Batch& b, const PlanBatch& pb);
  void launch(Batch& b, int l);
  void finish(Batch& b, int l);
  void hand_on(int slot);  // not the last stage: the slot's residual to the next stage
  void decode(const StepPlan& plan, RankStep& out);
  void prefill(const PlanBatch& pb, RankStep& out);

  std::unique_ptr<SPart> spart_;
  std::unique_ptr<RWorkerClient> client_;
  Communicator* pp_ = nullptr;
  SRankOptions o_;
  std::vector<json> hello_;
  RankRecorder rec_;  // the step's timing and trace, kept out of the pipeline below
  std::vector<std::unique_ptr<Batch>> batches_;  // decode batches' buffers, kept between steps
  HostBuffer prefill_k_[2], prefill_v_[2];
  struct PendingFree {
    size_t worker;
    uint64_t request;
    std::vector<uint64_t> ids;  // alive until the reply (zero-copy send)
  };
  std::vector<PendingFree> pending_frees_;
  // Per worker: its shared-memory region as last seen active, and whether the S-Part's device took it (register_host).
  struct Pinned {
    std::shared_ptr<const shm::Region> region;
    bool ok = false;
  };
  std::vector<Pinned> pinned_;
  void pin_regions();
};

}  // namespace fd
