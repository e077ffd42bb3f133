// The hybrid engine's S-rank (CUDA builds): the GPU-only rank (its model, its KV pool, its kernels and graphs) plus
// rows whose KV lives on R-workers. In a batch the GPU-resident rows come first, then the R-worker rows ordered by
// worker. Per layer, after the [q|k|v] projection of every row: the R-worker rows' q, k, v go down (fp16) and out in
// one ATTEND per worker, the GPU rows attend on the GPU, and once the replies are in their output goes up and the
// rest of the layer runs for all rows. With two mini-batches one's CPU attention overlaps the other's GPU work.
#pragma once
#include <array>
#include <memory>
#include <vector>

#include "baselines/gpu_only/gpu_only_rank.h"
#include "fastdecode/sched/hybrid.h"
#include "fastdecode/wire/rworker_client.h"

namespace fd {

// A batch of the hybrid plan: rows [0, n_gpu) on the GPU (rows.slots valid), the rest on R-workers.
struct HyBatch {
  GoRows rows;
  size_t n_gpu = 0;              // decode: GPU rows; prefill: the GPU sequences' prompt tokens (rows [0, n_gpu))
  struct Part {                  // one R-worker's rows: [begin, end) of the batch's rows
    size_t worker = 0, begin = 0, end = 0;
    std::vector<uint64_t> ids;   // decode: per row; prefill: per sequence
    std::vector<uint32_t> counts;  // prefill: each sequence's prompt tokens
  };
  std::vector<Part> parts;
  bool has_cpu() const { return !parts.empty(); }
};

// The hybrid engine's step plan, the same role as StepPlan and GpuOnlyStepPlan: GPU rows as the GPU-only plan's
// (cache slots), R-worker rows in parts per worker, and the FREE_SEQ / ADD_SEQ commands to the workers.
struct HybridStepPlan {
  std::vector<std::pair<size_t, std::vector<uint64_t>>> frees, adds;  // FREE_SEQ, then ADD_SEQ, per worker
  std::vector<HyBatch> decode;
  bool has_prefill = false;
  HyBatch prefill;
};

struct HyStep {
  std::vector<std::vector<int32_t>> tokens;   // per decode batch
  std::vector<std::vector<float>> recorded;
  std::vector<int32_t> prefill_tokens;
  std::vector<float> prefill_recorded;
  double s_part_ms = 0, gpu_attn_ms = 0, r_wait_ms = 0, decode_ms = 0, prefill_ms = 0;
  std::vector<double> worker_ms;  // decode compute per R-worker (its own clock)
  std::vector<Span> spans;
};

class HybridRank : public GpuOnlyRank {
 public:
  // Says HELLO to every worker of `client` (a config error naming it when none answers).
  HybridRank(const ModelWeights& w, const GoRankOptions& o, std::unique_ptr<RWorkerClient> client);
  ~HybridRank() override;

  HyStep run(const HybridStepPlan& plan);
  // The controller's prior rates, measured here (MODELLED where said): the S-Part per layer at a few batch sizes,
  // the GPU's decode attention per context token and per sequence, each R-worker's attention per token and per
  // sequence (an ATTEND of calibration sequences), the cost of engaging the CPUs (a round trip beyond the worker's
  // compute), and shipping a token of KV to a worker (APPEND_KV).
  HybridRates calibrate(int64_t max_batch);
  RWorkerClient& client() { return *client_; }
  const std::vector<json>& hello() const { return hello_; }
  // Spawned workers: SHUTDOWN with their tokens; listed ones: CLOSE.
  void shutdown(bool spawned, const std::vector<std::string>& tokens);

 private:
  struct Flight {  // one batch's R-worker traffic in flight
    HostBuffer q, k, v;
    std::vector<uint64_t> requests;  // per part
  };
  void launch(size_t i, const HyBatch& b, int l, HyStep& out);
  void finish(size_t i, const HyBatch& b, int l, HyStep& out);
  void decode_pipelined(const HybridStepPlan& plan, HyStep& out);
  void prefill_hybrid(const HyBatch& b, HyStep& out);
  proto::Header header(proto::MsgType t, int layer, size_t n) const;
  cudaEvent_t event(size_t k);  // the k-th timing event of this step (created once)
  void reserve(HostBuffer& h, size_t bytes);

  std::unique_ptr<RWorkerClient> client_;
  std::vector<json> hello_;
  std::vector<Flight> flights_;        // per decode batch
  HostBuffer pk_[2], pv_[2];           // prefill K/V shipped per layer, alternating
  std::vector<cudaEvent_t> timing_;    // s-part / attention spans of a step, summed at its end
  std::vector<std::pair<size_t, size_t>> s_part_spans_, attn_spans_;  // event index pairs
};

}  // namespace fd
