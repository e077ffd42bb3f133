// What an S-rank measures of its step, kept out of the step pipeline: srank.cpp says what a step does (embed,
// S-Part stages, ATTENDs, replies, sampling, appends) and calls this recorder around each piece; the recorder says
// how long each took and what the trace shows. The engine folds every rank's RankTiming into the step's breakdown
// (add_rank_timing). Only timing lives here: nothing the step computes depends on it.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fastdecode/core/clock.h"
#include "fastdecode/engine/engine.h"
#include "fastdecode/spart/spart.h"
#include "fastdecode/wire/rworker_client.h"

namespace fd {

class Communicator;

// One rank's step, timed. Host wall time unless said otherwise.
struct RankTiming {
  std::vector<Span> spans;  // the trace: the S-Part's stages (host and device), R-worker compute, waits, sends
  int64_t s_ns = 0;       // the S-Part's stages (embedding, attention input, output+MLP, sampling; prefill whole)
  int64_t r_wait_ns = 0;  // waiting for R-worker replies (ATTEND, and prefill's APPEND_KV)
  int64_t comm_ns = 0;    // pipeline-stage hand-offs (the communicator's busy time)
  // Decode only: the S-Part's copies (device time, inside s_ns), the wire (per layer and mini-batch, of the wait for
  // replies, what the reply taken last spent beyond its worker's compute) and the rank's decode wall time.
  int64_t d2h_ns = 0, h2d_ns = 0, wire_ns = 0, decode_ns = 0, decode_s_ns = 0;  // decode_s_ns: s_ns's decode part
  int64_t send_ns = 0;  // decode: the S-worker's time handing ATTENDs to the client (copies into regions included)
  std::vector<int64_t> worker_ns;  // compute per R-worker of this rank's group (as each worker reports it)
  // Tensor bytes of this step's requests through the shared-memory lanes: copied into a region by the client, or
  // sent where they lay (written there by the S-Part).
  int64_t shm_bytes_copied = 0, shm_bytes_in_place = 0;
  // Requests put in and replies taken from the lanes' rings (with engine.rworkers.spin_us: docs/RWORKER.md, "Rings").
  int64_t ring_requests = 0, ring_replies = 0;
  int64_t append_requests = 0;  // prefill: APPEND_KV messages sent (per layer and worker, one per chunk)
};

class RankRecorder {
 public:
  // layer_begin: the rank's first layer's global index (span names); track_suffix: "" or " t0 p1" (one rank's
  // tracks apart from another's); worker_prefix: worker w's track is prefix + w.
  RankRecorder(SPart& spart, RWorkerClient& client, Communicator* pp, int64_t layer_begin, std::string track_suffix,
               std::string worker_prefix);

  // A step's timing goes to `out` from begin() to end(); end() adds the stage hand-offs, the lanes' bytes and the
  // S-Part's device timeline.
  void begin(RankTiming& out);
  void end();

  // "L3 mb1 attention input", with the global layer index.
  std::string name(int l, int slot, const char* what) const;

  // Runs f, S-Part work: its time goes to s_ns, and a span to `track` when `span_name` is not empty.
  template <class F>
  void s_part(const char* track, const std::string& span_name, F&& f) {
    const int64_t t = now_ns();
    f();
    const int64_t dt = now_ns() - t;
    out_->s_ns += dt;
    if (!span_name.empty()) add_span(track, span_name, t, dt);
  }
  // Runs f and draws it on `track`; its time is counted by what encloses it.
  template <class F>
  void span(const char* track, const std::string& span_name, F&& f) {
    const int64_t t = now_ns();
    f();
    add_span(track, span_name, t, now_ns() - t);
  }
  // Runs f, a wait for R-worker replies outside decode's ATTEND (prefill's appends): r_wait, and a span.
  template <class F>
  void wait(const char* track, const std::string& span_name, F&& f) {
    const int64_t t = now_ns();
    f();
    const int64_t dt = now_ns() - t;
    out_->r_wait_ns += dt;
    add_span(track, span_name, t, dt);
  }
  // Runs f, the hand-over of a mini-batch's ATTENDs to the client (send_ns); f calls sent() after each.
  template <class F>
  void sending(F&& f) {
    const int64_t t = now_ns();
    f();
    out_->send_ns += now_ns() - t;
  }
  // Worker w's ATTEND of decode slot `slot` is with the client now (the wire's start, unless the worker is busy).
  void sent(int slot, size_t w);
  // A decode mini-batch's wait for layer l's replies (reqs: worker and request), and what they say: the wait
  // (r_wait), the wire on its critical path, each worker's compute and its span. Returns the replies, in reqs' order.
  std::vector<RWorkerReply> attend_replies(int l, int slot, const std::vector<std::pair<size_t, uint64_t>>& reqs);

  // The decode part of a step: between the two, its wall time, the copies' device time and s_ns's decode share.
  void decode_begin();
  void decode_end();
  // The prefill part: its wall time up to the last appends' wait goes to s_ns (the waits inside it too, as they are
  // drawn), f (that wait, and the hand-on to the next stage) to r_wait.
  void prefill_begin();
  template <class F>
  void prefill_end(F&& last_waits) {
    const int64_t t1 = now_ns();
    last_waits();
    const int64_t t2 = now_ns();
    add_span("s-worker", "prefill append wait (last layers)", t1, t2 - t1);
    out_->r_wait_ns += t2 - t1;
    out_->s_ns += t1 - prefill_t0_;
    add_span("s-worker", "prefill", prefill_t0_, t2 - prefill_t0_);
  }
  void appends(int64_t n) { out_->append_requests += n; }

 private:
  void add_span(const char* track, std::string span_name, int64_t start, int64_t dur);
  void lane_counts(int64_t& copied, int64_t& in_place, int64_t& ring_requests, int64_t& ring_replies) const;

  SPart& spart_;
  RWorkerClient& client_;
  Communicator* pp_;
  int64_t layer_begin_;
  std::string suffix_, worker_prefix_;
  RankTiming* out_ = nullptr;
  int64_t copied0_ = 0, in_place0_ = 0, ring_requests0_ = 0, ring_replies0_ = 0;
  std::vector<int64_t> worker_free_ns_;         // per worker: the receipt of its latest ATTEND reply (decode's wire)
  std::vector<std::vector<int64_t>> sent_ns_;   // [slot][worker]: when its latest ATTEND went to the client
  int64_t decode_t0_ = 0, decode_s0_ = 0, prefill_t0_ = 0;
  SPart::CopyTimes copies0_{};
};

// The step's breakdown from every rank's timing (each term the largest over the ranks: the step waits for the
// slowest) and its counts, into out.breakdown_ms / out.counts; the ranks' spans move into out.spans.
void add_rank_timing(std::vector<RankTiming>& ranks, bool decoded, StepResult& out);

}  // namespace fd
