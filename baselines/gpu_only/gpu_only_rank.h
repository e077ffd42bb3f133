// One S-rank of the GPU-only baseline (CUDA builds only): CudaModel on its GPU (the whole model, or tensor part t
// of pipeline stage p's layers: fastdecode/model/shard.h) with the KV-cache of its heads and layers in that GPU's
// memory, running a step's waves and its prefill. The engine (gpu_only_engine.cpp, the leader) owns the
// sequences, their cache slots and the emitted tokens; with one rank it runs it inline (CUDA graphs for small
// greedy batches), with several each rank runs the step on its own thread (fastdecode/parallel/ranks.h):
// tensor ranks all-reduce inside CudaModel, a stage hands each wave's residual stream on to the next stage.
#pragma once
#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "fastdecode/engine/engine.h"
#include "fastdecode/parallel/comm.h"
#include "fastdecode/spart/cuda_model.h"
#include "fastdecode/spart/spart.h"
#include "kernels/cuda/green_context.h"

namespace fd {

// One wave of decode rows, or the prefill batch, as every rank runs it (the same for all ranks).
struct GoRows {
  std::vector<int32_t> tokens;  // the first stage's input: decode: each row's last token; prefill: prompts, packed
  std::vector<int64_t> pos;     // per token
  std::vector<int32_t> slots;   // per token: its sequence's cache slot
  std::vector<int32_t> lens;    // decode: per row, the context attended (pos + 1)
  std::vector<int32_t> starts;  // prefill: the first token of each prompt, then the total
  std::vector<int32_t> sample;  // the rows sampled: decode every row, prefill each prompt's last token
  int64_t max_len = 0;          // prefill: the longest prompt
  RowDraws draws;               // the sampled rows' draws
};

// The GPU-only engine's step plan: its decode waves and its prefill, the same for every rank. The role of the
// FastDecode engine's StepPlan (fastdecode/sworker/srank.h), not its type: a row here is a sequence's cache slot on
// this GPU (slots, lens), with no R-worker and no commands to one.
struct GpuOnlyStepPlan {
  std::vector<GoRows> waves;  // decode, in order: stage p + 1 works on wave w while stage p works on wave w + 1
  bool has_prefill = false;
  GoRows prefill;
};

// A rank's part of a step. Tokens and recorded logits come from the last stage's tensor rank 0 (its tensor
// peers pick the same ones).
struct GoRankStep {
  std::vector<std::vector<int32_t>> tokens;   // per wave
  std::vector<std::vector<float>> recorded;   // per wave: [draws.record.size(), V]
  std::vector<int32_t> prefill_tokens;
  std::vector<float> prefill_recorded;
  double attention_ms = 0, decode_ms = 0, prefill_ms = 0, comm_ms = 0;
  std::vector<Span> spans;
};

struct GoRankOptions {
  int device = 0;
  int sm_count = 0;            // > 0: a green context of that many SMs (hardware balance)
  DType act = DType::F16;
  bool cuda_graphs = false;    // only a lone rank (no tensor group, no stages) replays greedy decode graphs
  int64_t max_ctx = 0;         // cache positions per slot
  Communicator* tp = nullptr;  // the tensor group (null or size 1: none)
  Communicator* pp = nullptr;  // the stage hand-off group (null: one stage)
  int pp_rank = 0, pp_size = 1;
  std::string track = "gpu stream 0";  // trace track of its spans
  std::string comm_track;              // trace track of its stage hand-offs (pipeline parallel)
  std::string gemm_table;              // a GEMM table file (fastdecode/spart/gemm_table.h), "" for none
};

class GpuOnlyRank {
 public:
  // Uploads the weights to o.device. The cache comes with allocate().
  GpuOnlyRank(const ModelWeights& w, const GoRankOptions& o);
  virtual ~GpuOnlyRank();
  GpuOnlyRank(const GpuOnlyRank&) = delete;
  GpuOnlyRank& operator=(const GpuOnlyRank&) = delete;

  // Device bytes one slot takes in this (reduced-layer) run: its cache of the layers run, one row's activations,
  // its attention workspace.
  double run_bytes_per_slot() const;
  // The cache for `slots` sequences (+ one padding slot for the graphs), workspaces, the graphs' buffers.
  void allocate(int64_t slots);
  GoRankStep run(const GpuOnlyStepPlan& plan);

  // Asynchronous greedy decode (one rank with graphs; the engine's engine.async_steps). launch_decode enqueues a
  // wave's graph and the copy of its picks to pinned host memory, and returns; wait_decode waits for the oldest
  // launch's picks (T of them, valid until the launch after next) and adds its device time to out.decode_ms.
  // feed[i] >= 0: row i's input token is row feed[i]'s pick of the launch just before (read on the device, from
  // that graph's argmax output; it must have been a launch_decode too), else r.tokens[i]. At most two launches
  // are outstanding.
  // A launchable wave: all-greedy, no recorded logits, within the graphs' rows, and (captured_only) its graph
  // captured already (a first capture inside a step that emits tokens would hold those tokens back).
  bool can_launch(const GoRows& r, bool captured_only = false) const {
    const int64_t T = int64_t(r.pos.size());
    return graphs_ && r.draws.greedy && r.draws.record.empty() && T <= graph_rows_ &&
           (!captured_only || graphs_->has(uint64_t(std::min(GraphCache::bucket(T), graph_rows_))));
  }
  void launch_decode(const GoRows& r, const std::vector<int32_t>& feed);
  const int32_t* wait_decode(GoRankStep& out);
  size_t launched() const { return launched_.size(); }
  const ModelConfig& config() const { return model_->config(); }
  int device() const { return o_.device; }
  int sm_count() const { return streams_->sm_count(); }
  bool sm_limited() const { return streams_->limited(); }
  bool graphs() const { return graphs_ != nullptr; }
  // Captures the decode graphs of every padded size up to max_rows' (capped at the graphs' rows) before the run, so
  // that the first step of each size costs what later ones do; returns how many it captured (0 without graphs).
  int64_t warm_up(int64_t max_rows);
  const CudaModel& model() const { return *model_; }

 protected:  // the hybrid engine's rank (extensions/hybrid) adds rows whose KV lives on R-workers
  bool last_stage() const { return o_.pp_rank + 1 == o_.pp_size; }
  void current() const;
  // Per-layer GPU work of a decode batch on a (inputs on the device): no host synchronisation and no allocation,
  // so it can be captured into a graph. Positions: a.pos (the new token's k and v go to (d_slots, a.pos) of the
  // cache). `timed`: attention events per layer (eager only).
  void decode_body(DevActs& a, int64_t Tb, const int32_t* d_slots, const int32_t* d_lens, bool timed);
  void graph_body(int64_t Tb);
  void replay_graph(const GoRows& r, const std::vector<int32_t>* feed, cudaEvent_t start, cudaEvent_t end);
  void decode_graph(const GoRows& r, int32_t* tok, float* recorded, GoRankStep& out);
  // Batch i of a step (waves 0..W-1, then the prefill) has its own activations, row arrays and hand-off buffer.
  void decode_wave(size_t i, const GoRows& r, GoRankStep& out);
  void prefill(size_t i, const GoRows& r, GoRankStep& out);
  // The batch's first-layer input: the first stage uploads tokens and positions (embedded in the body), a later
  // stage sizes the batch, uploads positions and receives x from the stage before.
  void take_input(size_t i, DevActs& a, const GoRows& r, GoRankStep& out);
  void hand_on(size_t i, DevActs& a, GoRankStep& out);  // x to the next stage
  DevActs& acts(size_t i);
  DeviceBuffer<int32_t>& aux(size_t i);  // slots | positions | lengths
  HostBuffer& mirror(size_t i, size_t bytes);

  GoRankOptions o_;
  std::unique_ptr<cuda::SmLimitedStreams> streams_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CudaModel> model_;
  int64_t slots_ = 0, graph_rows_ = 0;
  std::vector<DeviceBuffer<__half>> k_cache_, v_cache_;
  DeviceBuffer<float> workspace_;
  std::vector<std::unique_ptr<DeviceBuffer<int32_t>>> aux_;  // per batch
  DeviceBuffer<int32_t> graph_in_;  // a graph step's inputs: five arrays of Tb int32 (replay_graph)
  DevActs graph_dec_;
  std::unique_ptr<GraphCache> graphs_;
  std::vector<std::unique_ptr<DevActs>> acts_;  // per batch
  std::vector<HostBuffer> mirrors_;             // per batch, pinned: stage hand-offs
  std::vector<cudaEvent_t> events_;
  // launch_decode's, per outstanding launch (a ring of two): its pinned picks and CUDA events (graph start, graph
  // end, picks copied); launched_: the ring indices outstanding.
  struct Launch {
    HostBuffer picks;
    cudaEvent_t start = nullptr, end = nullptr, copied = nullptr;
  };
  Launch ring_[2];
  std::deque<int> launched_;
};

}  // namespace fd
