// vLLM v0.2's iteration-level scheduler (vllm/core/scheduler.py `_schedule`), as the paged-swap baseline
// runs it over BlockManager. Three queues: waiting (FCFS), running, swapped. Each step is EITHER a
// prefill step or a decode step (vLLM v0.2 never mixes them):
//   1. If nothing is swapped, admit waiting sequences in order while the GPU blocks allow it (watermark),
//      while at most max_num_seqs run and the step's prompt tokens stay within max_num_batched_tokens
//      (the first prompt always goes alone, whatever its length). If any was admitted: a prefill step
//      of those alone.
//   2. Else decode every running sequence (oldest first): one that needs a new block when none is free
//      preempts the youngest running sequence (latest arrival), or itself when it is the youngest.
//      Preemption `swap` moves the victim's blocks to the CPU pool (when the CPU pool cannot take them
//      it falls back to recompute, and says so); `recompute` frees them and puts the victim at the FRONT
//      of waiting, to be prefilled again over its prompt and every token generated so far.
//   3. If nothing was preempted in this step, swap in swapped sequences (oldest first) while the GPU
//      blocks and max_num_seqs allow; they decode in this same step.
// A sequence's tokens: its prompt plus the tokens generated so far (the last one not yet in the cache).
// Pure C++ (ids and block numbers only); the engine runs the plan.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "baselines/paged_swap/block_manager.h"

namespace fd {

enum class Preemption { kSwap, kRecompute };

struct PagedSchedulerConfig {
  int64_t max_num_seqs = 256;            // sequences running at once at most
  int64_t max_num_batched_tokens = 4096; // prompt tokens of one prefill step (the first prompt always fits)
  Preemption preemption = Preemption::kSwap;
};

// One preemption: who, and how it was done (a swap that fell back to recompute says so).
struct Preempted {
  uint64_t seq = 0;
  Preemption how = Preemption::kSwap;
  bool fallback = false;  // asked to swap, recomputed because the CPU pool could not take its blocks
};

// What one step runs. Swaps are done before the step's compute (the GPU blocks a swap-out frees may be
// written by this step's decode).
struct PagedStepPlan {
  std::vector<uint64_t> prefill;  // sequences prefilled this step (over all their tokens), admission order
  std::vector<uint64_t> decode;   // sequences decoded this step (one token each), oldest first
  BlockMapping swap_in, swap_out; // (cpu -> gpu), (gpu -> cpu) block copies
  std::vector<Preempted> preempted;
  bool empty() const { return prefill.empty() && decode.empty(); }
};

class PagedScheduler {
 public:
  PagedScheduler(const PagedSchedulerConfig& c, BlockManager blocks);

  // Queues a sequence (FCFS) with `prompt_tokens` tokens that may grow to `max_tokens` cache positions.
  // Throws fd::Error naming it when it could never run: max_tokens positions do not fit the GPU blocks
  // (with the watermark) even with nothing else running. Nothing is queued then.
  void add(uint64_t seq, int64_t prompt_tokens, int64_t max_tokens);
  // The checks of add() alone (so a batch can be checked before any of it is queued).
  void check(uint64_t seq, int64_t prompt_tokens, int64_t max_tokens) const;
  // Plans the next step and applies it to the block tables (allocations, appended slots, swaps).
  PagedStepPlan schedule();
  // The step produced a token for `seq`: one more token.
  void on_token(uint64_t seq);
  // `seq` finished: its blocks are freed and it leaves every queue.
  void finish(uint64_t seq);

  bool idle() const { return waiting_.empty() && running_.empty() && swapped_.empty(); }
  int64_t num_tokens(uint64_t seq) const { return seqs_.at(seq).tokens; }
  const BlockManager& blocks() const { return blocks_; }
  size_t waiting() const { return waiting_.size(); }
  size_t running() const { return running_.size(); }
  size_t swapped() const { return swapped_.size(); }
  const std::deque<uint64_t>& waiting_queue() const { return waiting_; }

 private:
  struct Seq {
    int64_t arrival = 0;  // FCFS rank
    int64_t tokens = 0;   // prompt + generated so far
  };
  void preempt(uint64_t seq, PagedStepPlan& plan);
  void sort_by_arrival(std::vector<uint64_t>& v) const;

  PagedSchedulerConfig cfg_;
  BlockManager blocks_;
  std::map<uint64_t, Seq> seqs_;
  int64_t next_arrival_ = 0;
  std::deque<uint64_t> waiting_;
  std::vector<uint64_t> running_, swapped_;
};

}  // namespace fd
