// The FastDecode engine's recovery from a lost R-worker, and its shutdown (docs/RELIABILITY.md).
//
// A step fails when a worker is lost (RWorkerClient: its connection dropped, its heartbeats unanswered, a reply
// past the deadline). With engine.rworkers.on_failure "recover" (the default) and one S-rank, the leader:
//   1. stops using the lost worker indices (their sockets closed: their sessions end on any worker still alive);
//   2. undoes the failed step on the survivors: the sequences it admitted go back to the front of the queue (and are
//      freed where their ADD_SEQ arrived), the running ones are cut back to their length before the step (TRUNCATE:
//      one decode step's append can always be undone), the ones that finished the step before are freed (again:
//      unknown ids ignored);
//   3. re-places every sequence of a lost worker on the least-loaded survivor and rebuilds its KV there by
//      prefilling its prompt and the inputs its decode steps had cached (the S-worker keeps them), without sampling
//      anything new;
//   4. runs the step again. Nothing generated is lost, and the tokens are those of a fault-free run (a rebuilt KV is
//      the prefill's instead of the decode steps': the same values up to the last bits, so a flip needs a near-tie).
// Recovery itself may lose another worker: it starts over with that one lost too. The step that recovered carries
// counts rworkers_lost and sequences_rebuilt and breakdown recovery (ms) in steps.jsonl.
#include <algorithm>
#include <cstdio>
#include <map>

#include "fastdecode/core/clock.h"
#include "fastdecode/sworker/fastdecode_engine.h"

namespace fd {

std::string FastDecodeEngine::lost_names(const std::vector<size_t>& lost) const {
  std::string s;
  for (size_t w : lost) s += (s.empty() ? "" : ", ") + std::string("R-worker ") + std::to_string(w) + " (" + ranks_[0]->endpoint(w) + ")";
  return s;
}

void FastDecodeEngine::recover(std::vector<size_t> lost, const StepPlan& failed, const std::vector<uint64_t>& admitted,
                               const std::string& why, StepResult& out) {
  if (ec_.rworkers.on_failure != "recover")
    FD_THROW(why << " (engine.rworkers.on_failure is fail)");
  if (ranks_.size() > 1)
    FD_THROW(why << " (recovery from a lost R-worker is not built for engine.parallel: the run fails as on_failure fail)");
  const int64_t t0 = now_ns();
  size_t rebuilt = 0, newly_lost = 0;
  for (;;) {
    for (size_t w : lost) newly_lost += dead_[w] ? 0 : 1, dead_[w] = true;
    size_t alive = 0;
    for (bool d : dead_) alive += d ? 0 : 1;
    if (alive == 0) FD_THROW(why << "; no R-worker is left to recover on");
    std::fprintf(stderr, "fastdecode engine: %s lost (%s); recovering on %zu R-worker(s)\n", lost_names(lost).c_str(),
                 why.c_str(), alive);
    // Every sequence of a lost worker (and any an earlier attempt had started to rebuild) is placed anew; the
    // failed step's new sequences are requeued instead (recover_once).
    for (auto& [id, s] : running_)
      if ((dead_[s.worker] || s.rebuilding) && std::find(admitted.begin(), admitted.end(), id) == admitted.end()) {
        if (!s.rebuilding) ++rebuilt;
        load_[s.worker] -= int64_t(s.req.prompt.size()) + s.req.max_new_tokens;
        s.rebuilding = true;
      }
    try {
      for (auto& rk : ranks_) rk->recover(lost);
      recover_once(failed, admitted, out);
      break;
    } catch (const RWorkerLost& e) {  // another worker lost during the recovery: start over with it lost too
      lost = e.workers();
    }
  }
  frees_.clear();  // freed by the recovery (failed.frees)
  out.counts["rworkers_lost"] += int64_t(newly_lost);
  out.counts["sequences_rebuilt"] += int64_t(rebuilt);
  out.breakdown_ms["recovery"] += double(now_ns() - t0) / 1e6;
}

void FastDecodeEngine::recover_once(const StepPlan& failed, const std::vector<uint64_t>& admitted, StepResult& out) {
  (void)out;
  StepPlan fix;
  std::map<size_t, std::vector<uint64_t>> drop;
  // The frees of the step before (sent or not): again, unknown ids ignored.
  for (const auto& [w, ids] : failed.frees)
    if (!dead_[w]) drop[w].insert(drop[w].end(), ids.begin(), ids.end());
  // The failed step's new sequences: back to the front of the queue in their order, dropped where they were added.
  std::vector<Request> back;
  for (uint64_t id : admitted) {
    auto it = running_.find(id);
    if (it == running_.end()) continue;  // an earlier attempt requeued it already
    Sequence& s = it->second;
    if (!dead_[s.worker]) drop[s.worker].push_back(id);
    if (!s.rebuilding) load_[s.worker] -= int64_t(s.req.prompt.size()) + s.req.max_new_tokens;
    back.push_back(std::move(s.req));
    running_.erase(it);
  }
  queued_.insert(queued_.begin(), back.begin(), back.end());
  // Survivors' running sequences: cut back to their length before the step. Rebuilt ones: placed on the survivors
  // as new sequences are (place(); dropped first where an earlier attempt may have added them).
  std::map<size_t, StepPlan::Truncate> cuts;
  std::vector<Sequence*> moved;
  for (auto& [id, s] : running_) {
    if (s.rebuilding) {
      if (!dead_[s.worker]) drop[s.worker].push_back(id);
      moved.push_back(&s);
      continue;
    }
    auto& t = cuts[s.worker];
    t.worker = s.worker;
    t.ids.push_back(id);
    t.lengths.push_back(uint32_t(s.len));
  }
  for (Sequence* s : moved) s->worker = load_.size();  // not placed yet: place() passes over them
  for (Sequence* s : moved) {
    s->worker = place(*s);
    load_[s->worker] += int64_t(s->req.prompt.size()) + s->req.max_new_tokens;
  }
  fix.drop.assign(drop.begin(), drop.end());
  for (auto& [w, t] : cuts) fix.truncates.push_back(std::move(t));
  // The rebuilds: prefills of prompt + cached inputs, at most prefill_tokens per plan (at least one sequence).
  std::stable_sort(moved.begin(), moved.end(), [](const Sequence* a, const Sequence* b) { return a->worker < b->worker; });
  size_t next = 0;
  do {
    StepPlan p = std::move(fix);
    fix = StepPlan{};
    std::map<size_t, std::vector<uint64_t>> adds;
    PlanBatch& pb = p.prefill;
    pb.slot = int(ec_.mini_batches * ec_.parallel.wave_count());
    std::vector<Sequence*> batch;
    int64_t budget = ec_.prefill_tokens;
    while (next < moved.size() && (batch.empty() || moved[next]->len <= budget)) {
      Sequence* s = moved[next++];
      budget -= s->len;
      batch.push_back(s);
      adds[s->worker].push_back(s->req.id);
      pb.starts.push_back(int64_t(pb.tokens.size()));
      pb.ids.push_back(s->req.id), pb.workers.push_back(s->worker);
      for (int64_t t = 0; t < s->len; ++t) {
        const size_t P = s->req.prompt.size();
        pb.tokens.push_back(size_t(t) < P ? s->req.prompt[size_t(t)] : s->fed.at(size_t(t) - P));
        pb.pos.push_back(t);
      }
      pb.sample_rows.push_back(int32_t(pb.tokens.size()) - 1);
      Request greedy;  // the pick is discarded: the sequence continues with its own next input
      greedy.id = s->req.id;
      pb.draws.add(greedy, 0, SamplingParams{});
    }
    pb.starts.push_back(int64_t(pb.tokens.size()));
    p.has_prefill = !batch.empty();
    p.adds.assign(adds.begin(), adds.end());
    std::vector<size_t> lost;
    try {
      run_ranks(p, &lost);
    } catch (const Error& e) {
      if (lost.empty()) throw;
      throw RWorkerLost(lost, e.what());
    }
    for (Sequence* s : batch) s->rebuilding = false;
  } while (next < moved.size());
}

void FastDecodeEngine::shutdown() {
  if (ranks_.empty()) return;
  std::exception_ptr failed;  // a failed FREE_SEQ still lets the workers be shut down, then is reported
  for (auto& rk : ranks_) {
    try {
      rk->collect_frees();
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  frees_.clear();
  running_.clear();
  queued_.clear();
  // Spawned workers: SHUTDOWN with their tokens; listed ones: CLOSE (their sessions' sequences freed, they stay up).
  for (size_t g = 0; g < ranks_.size(); ++g) {
    std::vector<std::string> tokens;
    for (SpawnedRWorker* p : spawned_of_[g]) tokens.push_back(p ? p->token() : std::string());
    try {
      ranks_[g]->shutdown(group_spawned_[g], tokens);
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  // A lost worker (killed, stopped) is not waited for: it is killed at once.
  for (size_t g = 0; g < ranks_.size(); ++g)
    for (size_t w = 0; w < spawned_of_[g].size(); ++w)
      if (SpawnedRWorker* p = spawned_of_[g][w]) p->wait_exit(ranks_[g]->client().lost(w) ? 0 : 10000);
  spawned_.clear();
  spawned_of_.clear();
  hosts_.reset();  // after the workers on them are gone
  ranks_.clear();
  comms_.clear();
  if (failed) std::rethrow_exception(failed);
}

}  // namespace fd
