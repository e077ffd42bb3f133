#include "baselines/paged_swap/scheduler.h"

#include <algorithm>

#include "fastdecode/core/error.h"

namespace fd {

PagedScheduler::PagedScheduler(const PagedSchedulerConfig& c, BlockManager blocks) : cfg_(c), blocks_(std::move(blocks)) {
  FD_CHECK(c.max_num_seqs >= 1, "paged scheduler: max_num_seqs " << c.max_num_seqs << " must be positive");
  FD_CHECK(c.max_num_batched_tokens >= 1,
           "paged scheduler: max_num_batched_tokens " << c.max_num_batched_tokens << " must be positive");
}

void PagedScheduler::add(uint64_t seq, int64_t prompt_tokens, int64_t max_tokens) {
  check(seq, prompt_tokens, max_tokens);
  seqs_[seq] = {next_arrival_++, prompt_tokens};
  waiting_.push_back(seq);
}

void PagedScheduler::check(uint64_t seq, int64_t prompt_tokens, int64_t max_tokens) const {
  if (seqs_.count(seq)) FD_THROW("paged-swap: request " << seq << " is already queued or running");
  if (prompt_tokens < 1 || max_tokens < prompt_tokens)
    FD_THROW("paged-swap: request " << seq << ": " << prompt_tokens << " prompt tokens, " << max_tokens << " positions");
  // A sequence runs with all its blocks on the GPU; it is re-admitted (recompute) over up to max_tokens.
  // Swapping back in asks for one block beyond the table (can_swap_in), so one more must fit, else a
  // sequence swapped out while alone could never come back.
  if (!blocks_.ever_fits(max_tokens + blocks_.block_size()))
    FD_THROW("paged-swap: request " << seq << " needs " << blocks_.blocks_for(max_tokens) << " blocks of "
                                    << blocks_.block_size() << " tokens (" << max_tokens << " positions) + 1 to swap in, more than the "
                                    << blocks_.num_gpu_blocks() << " GPU blocks less the watermark ("
                                    << blocks_.watermark_blocks() << ") hold");
}

// Each sequence's arrival looked up once (not twice per comparison), and no sort when the order holds already (the
// running list usually does: admission appends in arrival order).
void PagedScheduler::sort_by_arrival(std::vector<uint64_t>& v) const {
  std::vector<std::pair<int64_t, uint64_t>> keyed;
  keyed.reserve(v.size());
  for (uint64_t s : v) keyed.emplace_back(seqs_.at(s).arrival, s);
  if (std::is_sorted(keyed.begin(), keyed.end())) return;
  std::sort(keyed.begin(), keyed.end());
  for (size_t i = 0; i < v.size(); ++i) v[i] = keyed[i].second;
}

void PagedScheduler::preempt(uint64_t seq, PagedStepPlan& plan) {
  Preempted p{seq, cfg_.preemption, false};
  if (p.how == Preemption::kSwap && !blocks_.can_swap_out(seq)) p.how = Preemption::kRecompute, p.fallback = true;
  if (p.how == Preemption::kSwap) {
    const BlockMapping m = blocks_.swap_out(seq);
    plan.swap_out.insert(plan.swap_out.end(), m.begin(), m.end());
    swapped_.push_back(seq);
  } else {
    blocks_.free(seq);
    waiting_.push_front(seq);
  }
  plan.preempted.push_back(p);
}

PagedStepPlan PagedScheduler::schedule() {
  PagedStepPlan plan;
  // 1. Admission (only while nothing is swapped out: swapped sequences come back first).
  if (swapped_.empty()) {
    int64_t batched = 0;
    while (!waiting_.empty()) {
      const uint64_t s = waiting_.front();
      const int64_t n = seqs_.at(s).tokens;
      if (!blocks_.can_allocate(n)) break;
      if (!plan.prefill.empty() && batched + n > cfg_.max_num_batched_tokens) break;
      if (int64_t(running_.size()) + 1 > cfg_.max_num_seqs) break;
      waiting_.pop_front();
      blocks_.allocate(s, n);
      running_.push_back(s);
      plan.prefill.push_back(s);
      batched += n;
    }
    if (!plan.prefill.empty()) return plan;
  }
  // 2. Decode every running sequence, oldest first; the youngest are preempted for blocks.
  sort_by_arrival(running_);
  std::deque<uint64_t> queue(running_.begin(), running_.end());
  std::vector<uint64_t> kept;
  while (!queue.empty()) {
    const uint64_t s = queue.front();
    queue.pop_front();
    bool self_preempted = false;
    while (!blocks_.can_append_slot(s)) {
      if (!queue.empty()) {
        const uint64_t victim = queue.back();
        queue.pop_back();
        preempt(victim, plan);
      } else {
        preempt(s, plan);
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) continue;
    blocks_.append_slot(s);
    kept.push_back(s);
  }
  running_ = kept;
  // 3. Swap in (oldest first) when nothing was preempted in this step.
  if (plan.preempted.empty()) {
    sort_by_arrival(swapped_);
    while (!swapped_.empty()) {
      const uint64_t s = swapped_.front();
      if (!blocks_.can_swap_in(s) || int64_t(running_.size()) + 1 > cfg_.max_num_seqs) break;
      const BlockMapping m = blocks_.swap_in(s);
      plan.swap_in.insert(plan.swap_in.end(), m.begin(), m.end());
      blocks_.append_slot(s);
      swapped_.erase(swapped_.begin());
      running_.push_back(s);
    }
  }
  plan.decode = running_;
  return plan;
}

void PagedScheduler::on_token(uint64_t seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) FD_THROW("paged scheduler: token for unknown sequence " << seq);
  ++it->second.tokens;
}

void PagedScheduler::finish(uint64_t seq) {
  if (!seqs_.erase(seq)) FD_THROW("paged scheduler: finish of unknown sequence " << seq);
  if (blocks_.has(seq)) blocks_.free(seq);
  running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
  swapped_.erase(std::remove(swapped_.begin(), swapped_.end(), seq), swapped_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), seq), waiting_.end());
}

}  // namespace fd
