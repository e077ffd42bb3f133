// The FastDecode engine, class FastDecodeEngine: the S-Part (CPU or CUDA backend) batched over all running
// sequences, the R-Part on R-worker processes that hold the KV-cache, in the two mini-batch pipeline. The engine is the
// leader: it owns the sequences and their placement on R-worker indices, cuts each step into a StepPlan (srank.h) that
// its S-ranks run, emits the tokens, and recovers from a lost R-worker (fastdecode_engine.cpp: set-up and the step;
// rworker_launch.cpp: the set-up's R-worker launch; fastdecode_engine_recovery.cpp: recovery and shutdown). Its config section is fastdecode_config.h; the harness makes
// it through make_fastdecode_engine.
#pragma once
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fastdecode/engine/engine.h"
#include "fastdecode/sworker/fastdecode_config.h"
#include "fastdecode/sworker/netemu.h"
#include "fastdecode/sworker/rworker_spawn.h"
#include "fastdecode/sworker/srank.h"
#include "fastdecode/spart/rank_layout.h"

namespace fd {

// Applies the run's hardware balance: R-worker count and threads (pinned) for spawned workers, SMs for the
// CUDA S-Part.
std::unique_ptr<Engine> make_fastdecode_engine(const FastDecodeConfig& c, const EngineContext& ctx);

class FastDecodeEngine : public Engine {
 public:
  FastDecodeEngine(const FastDecodeConfig& config, const EngineContext& ctx);
  ~FastDecodeEngine() override;

  std::string name() const override { return "fastdecode"; }
  json info() const override;
  EngineCapacity capacity(int64_t min_prompt, int64_t max_len) const override;
  void add(const std::vector<Request>& requests) override;
  bool done() const override { return queued_.empty() && running_.empty(); }
  StepResult step() override;
  void shutdown() override;
  // Each rank's decode slots (mini_batches x waves), each of at most min(B, ceil(B / slots) + workers) rows: each
  // worker's sequences alternate over the slots (plan_decode).
  json warm_up(int64_t max_batch) override {
    const int64_t slots = ec_.mini_batches * ec_.parallel.wave_count();
    const int64_t rows = std::min<int64_t>(max_batch, (max_batch + slots - 1) / slots + int64_t(load_.size()));
    int64_t graphs = 0;
    for (auto& r : ranks_) graphs += r->warm_up(int(slots), rows);
    return graphs ? json{{"graphs", graphs}, {"rows_per_slot", rows}} : json::object();
  }

 private:
  // A sequence as the leader holds it.
  struct Sequence {
    Request req;
    size_t worker = 0;
    int64_t len = 0;  // tokens in the KV-cache
    int64_t generated = 0;
    int32_t last = 0;                   // the next input (its KV is not cached yet)
    std::vector<int32_t> fed;           // the inputs decode steps have cached after the prompt (for a rebuild)
    bool rebuilding = false;            // re-placed by a recovery that has not completed yet
    int32_t emitted_before = -1;        // planted fault shift_tokens only: the token emitted in its place
  };
  // Construction, in vLLM's order. check_setup resolves and checks everything with nothing started: the rank layout
  // (fastdecode/spart/rank_layout.h), the R-worker groups, each rank's GPU and weights, the pinned cores, the CURVE
  // keys. launch_rworkers (rworker_launch.cpp) then finds or starts every group's workers: registered, listed, or
  // spawned (spawn_group), on emulated hosts (emulate_hosts). build_ranks makes the communicators, S-Parts, clients
  // and S-ranks on them.
  struct Setup {
    RankLayout layout;
    std::vector<ModelWeights> weights;  // per rank
    std::vector<int64_t> first_cpus;    // per group: the first core of its pinned spawned workers, or -1
    RWorkerClientOptions client;        // every rank's R-worker link (emulated hosts turn its shm lane off)
    std::vector<int> sworker_cpus;      // engine.sworker_cpus resolved (empty: the process stays as started)
  };
  Setup check_setup(const EngineContext& ctx);
  std::vector<std::vector<std::string>> launch_rworkers(Setup& s, const NetworkLink& link);
  std::vector<std::vector<std::string>> registered_rworkers(size_t G) const;  // group 0's, when register is set
  void emulate_hosts(const NetworkLink& link, const std::vector<std::vector<std::string>>& registered,
                     RWorkerClientOptions& client);
  void spawn_group(size_t g, const RWorkersConfig& r, const std::string& bin, int64_t first_cpu, size_t& next_host,
                   std::vector<std::string>& endpoints);
  void build_ranks(Setup& s, const std::vector<std::vector<std::string>>& endpoints, const HardwareBalance& hw);

  void plan_decode(StepPlan& plan, std::vector<std::vector<Sequence*>>& mbs);
  void plan_prefill(StepPlan& plan, std::vector<Sequence*>& fresh);
  // Runs the plan on every rank; a lost R-worker's index lands in *lost (and the step throws).
  std::vector<RankStep> run_ranks(const StepPlan& plan, std::vector<size_t>* lost = nullptr);
  void emit(const std::vector<Sequence*>& seqs, const std::vector<int32_t>& tok, const std::vector<float>& recorded,
            StepResult& out);
  void release_finished(const StepResult& out);
  // Where a new (or rebuilt) sequence goes (docs/SCHEDULING.md, "Placement"): among the live workers whose projected
  // load (load_) stays within one longest sequence of the mean, the one whose running sequences overlap its future the
  // least: the smallest sum over its next max_new_tokens steps of (its KV tokens then) x (the new sequence's then).
  size_t place(const Sequence& s) const;

  // Recovery (fastdecode_engine_recovery.cpp): after a step failed with workers `lost`, undoes it on the survivors
  // (the new sequences back to the queue, the running ones cut back to their length, the finished ones freed) and
  // rebuilds the lost workers' sequences on the survivors; the step is then run again. Throws when recovery is not
  // possible (on_failure fail, engine.parallel, no survivor), naming the workers.
  void recover(std::vector<size_t> lost, const StepPlan& failed, const std::vector<uint64_t>& admitted,
               const std::string& why, StepResult& out);
  void recover_once(const StepPlan& failed, const std::vector<uint64_t>& admitted, StepResult& out);
  std::string lost_names(const std::vector<size_t>& lost) const;

  FastDecodeConfig ec_;
  ModelConfig cfg_;
  SamplingParams sampling_;
  proto::WireDType wire_;
  std::unique_ptr<EmulatedHosts> hosts_;  // hardware.network: the spawned workers' emulated hosts (outlive them)
  std::vector<std::unique_ptr<SpawnedRWorker>> spawned_;
  std::vector<std::vector<SpawnedRWorker*>> spawned_of_;  // per group, per worker index (null: listed)
  RankComms comms_;  // the ranks' tensor groups and stage hand-offs
  std::vector<bool> group_spawned_;  // per group: spawned here (shut down at the end), or listed by the user
  std::vector<std::unique_ptr<SRank>> ranks_;  // rank g = p * T + t
  std::vector<int> devices_;  // cuda: the GPU of rank g
  std::vector<int64_t> load_;  // projected tokens per worker index (prompt + max new of its sequences)
  int64_t longest_ = 0;        // the longest prompt + max new placed so far (place's memory bound)
  std::vector<bool> dead_;     // per worker index: lost (no sequence is placed there again)
  std::deque<Request> queued_;
  std::map<uint64_t, Sequence> running_;
  std::vector<std::pair<size_t, std::vector<uint64_t>>> frees_;  // finished last step, freed at the next
  std::vector<uint64_t> admitted_;  // the last plan's new requests, in queue order
};

}  // namespace fd
