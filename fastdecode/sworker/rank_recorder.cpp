#include "fastdecode/sworker/rank_recorder.h"

#include <algorithm>
#include <cstdio>
#include <iterator>

#include "fastdecode/parallel/comm.h"

namespace fd {

RankRecorder::RankRecorder(SPart& spart, RWorkerClient& client, Communicator* pp, int64_t layer_begin,
                           std::string track_suffix, std::string worker_prefix)
    : spart_(spart), client_(client), pp_(pp), layer_begin_(layer_begin), suffix_(std::move(track_suffix)),
      worker_prefix_(std::move(worker_prefix)), worker_free_ns_(client.size(), 0) {
  spart_.trace_device(true);
}

void RankRecorder::lane_counts(int64_t& copied, int64_t& in_place, int64_t& ring_requests, int64_t& ring_replies) const {
  for (size_t w = 0; w < client_.size(); ++w) {
    const ShmLaneStats st = client_.shm_stats(w);
    copied += int64_t(st.bytes_copied), in_place += int64_t(st.bytes_in_place);
    ring_requests += int64_t(st.requests_ring), ring_replies += int64_t(st.replies_ring);
  }
}

void RankRecorder::begin(RankTiming& out) {
  out_ = &out;
  copied0_ = in_place0_ = ring_requests0_ = ring_replies0_ = 0;
  lane_counts(copied0_, in_place0_, ring_requests0_, ring_replies0_);
  out.worker_ns.assign(client_.size(), 0);
  if (pp_) pp_->busy_ms_and_reset();
}

void RankRecorder::end() {
  RankTiming& out = *out_;
  if (pp_) out.comm_ns = int64_t(pp_->busy_ms_and_reset() * 1e6);
  lane_counts(out.shm_bytes_copied, out.shm_bytes_in_place, out.ring_requests, out.ring_replies);
  out.shm_bytes_copied -= copied0_, out.shm_bytes_in_place -= in_place0_;
  out.ring_requests -= ring_requests0_, out.ring_replies -= ring_replies0_;
  // The S-Part's device timeline (CUDA: a track per stream, each span a stage of one mini-batch's slot).
  for (const SPart::DeviceSpan& d : spart_.device_spans())
    out.spans.push_back({"gpu stream " + std::to_string(d.stream) + suffix_,
                         d.layer >= 0 ? name(d.layer, d.slot, d.what.c_str()) : "mb" + std::to_string(d.slot) + " " + d.what,
                         d.start_ns, d.dur_ns});
  out_ = nullptr;
}

// snprintf: GCC 12 warns falsely on chained +.
std::string RankRecorder::name(int l, int slot, const char* what) const {
  char buf[96];
  std::snprintf(buf, sizeof buf, "L%lld mb%d%s%s", (long long)(layer_begin_ + l), slot, *what ? " " : "", what);
  return buf;
}

void RankRecorder::add_span(const char* track, std::string span_name, int64_t start, int64_t dur) {
  out_->spans.push_back({std::string(track) + suffix_, std::move(span_name), start, dur});
}

void RankRecorder::sent(int slot, size_t w) {
  if (sent_ns_.size() <= size_t(slot)) sent_ns_.resize(size_t(slot) + 1);
  auto& s = sent_ns_[size_t(slot)];
  if (s.size() < client_.size()) s.resize(client_.size(), 0);
  s[w] = now_ns();
}

std::vector<RWorkerReply> RankRecorder::attend_replies(int l, int slot,
                                                       const std::vector<std::pair<size_t, uint64_t>>& reqs) {
  RankTiming& out = *out_;
  const int64_t t0 = now_ns();
  std::vector<RWorkerReply> replies = client_.wait(reqs);
  const int64_t t1 = now_ns();
  out.r_wait_ns += t1 - t0;
  // The wire on the critical path: of this wait, what the reply it ended on (taken last) spent beyond its worker's
  // compute, from the later of its send and the receipt of that worker's previous reply (before then the worker
  // was still busy with the previous request: queueing, not wire) to its receipt, at most the wait (a reply that
  // came while the S-worker was busy cost nothing).
  size_t last = 0;
  for (size_t i = 1; i < replies.size(); ++i)
    if (replies[i].recv_ns > replies[last].recv_ns) last = i;
  if (!replies.empty()) {
    const RWorkerReply& r = replies[last];
    const size_t w = reqs[last].first;
    const int64_t sent = size_t(slot) < sent_ns_.size() && w < sent_ns_[size_t(slot)].size() ? sent_ns_[size_t(slot)][w] : 0;
    const int64_t start = std::max(sent, worker_free_ns_[w]);
    out.wire_ns += std::clamp<int64_t>(r.recv_ns - start - int64_t(r.h.compute_ns), 0, t1 - t0);
  }
  for (size_t i = 0; i < replies.size(); ++i) {
    const size_t w = reqs[i].first;
    worker_free_ns_[w] = std::max(worker_free_ns_[w], replies[i].recv_ns);
    const int64_t compute = int64_t(replies[i].h.compute_ns);
    out.worker_ns[w] += compute;
    // The worker's own compute time, drawn ending when its reply was in hand (clocks differ between processes; the
    // duration is the worker's, the placement approximate).
    out.spans.push_back({worker_prefix_ + std::to_string(w), name(l, slot, ""), t1 - compute, compute});
  }
  return replies;
}

void RankRecorder::decode_begin() {
  decode_t0_ = now_ns();
  decode_s0_ = out_->s_ns;
  copies0_ = spart_.copy_times();
}

void RankRecorder::decode_end() {
  RankTiming& out = *out_;
  const SPart::CopyTimes c1 = spart_.copy_times();
  out.d2h_ns += c1.d2h_ns - copies0_.d2h_ns, out.h2d_ns += c1.h2d_ns - copies0_.h2d_ns;
  const int64_t t = now_ns();
  out.decode_ns += t - decode_t0_;
  out.decode_s_ns += out.s_ns - decode_s0_;
  add_span("s-worker", "decode step", decode_t0_, t - decode_t0_);
}

void RankRecorder::prefill_begin() { prefill_t0_ = now_ns(); }

// r_compute_max: the busiest R-worker's compute this step (its requests run one after another), the R side's critical
// path; r_wait: time the S-worker waited for replies; s_compute: S-Part time. With several ranks each is the largest
// over the ranks (the step waits for the slowest), plus comm: the longest time a rank spent in stage hand-offs.
// Decode steps also split the S side: d2h / h2d, the S-Part's copies of the R-Part's tensors (device time, inside
// s_compute); wire, per layer and mini-batch, of the S-worker's wait for replies what the reply taken last spent
// beyond its worker's compute (from the later of its send and the receipt of the worker's previous reply, to its
// receipt, minus compute, capped at the wait), summed; idle, the decode's wall time outside the S-Part (the device
// waits: for replies, r_wait, or for the S-worker's own host work); send, the S-worker's time handing the ATTENDs over
// (a copy into each shared-memory region, unless the S-Part wrote q/k/v there: engine.rworkers.shm_in_place), outside
// s_compute. Each the largest over the ranks.
void add_rank_timing(std::vector<RankTiming>& ranks, bool decoded, StepResult& out) {
  int64_t s_ns = 0, r_wait = 0, busiest = 0, comm = 0, d2h = 0, h2d = 0, wire = 0, idle = 0, send = 0;
  int64_t copied = 0, in_place = 0, appends = 0, ring_requests = 0, ring_replies = 0;
  for (RankTiming& r : ranks) {
    s_ns = std::max(s_ns, r.s_ns), r_wait = std::max(r_wait, r.r_wait_ns), comm = std::max(comm, r.comm_ns);
    d2h = std::max(d2h, r.d2h_ns), h2d = std::max(h2d, r.h2d_ns), wire = std::max(wire, r.wire_ns);
    idle = std::max(idle, r.decode_ns - r.decode_s_ns), send = std::max(send, r.send_ns);
    for (int64_t w : r.worker_ns) busiest = std::max(busiest, w);
    copied += r.shm_bytes_copied, in_place += r.shm_bytes_in_place, appends += r.append_requests;
    ring_requests += r.ring_requests, ring_replies += r.ring_replies;
    out.spans.insert(out.spans.end(), std::make_move_iterator(r.spans.begin()), std::make_move_iterator(r.spans.end()));
  }
  out.breakdown_ms["s_compute"] = s_ns / 1e6;
  out.breakdown_ms["r_wait"] = r_wait / 1e6;
  out.breakdown_ms["r_compute_max"] = busiest / 1e6;
  if (decoded) {
    out.breakdown_ms["d2h"] = d2h / 1e6;
    out.breakdown_ms["h2d"] = h2d / 1e6;
    out.breakdown_ms["wire"] = wire / 1e6;
    out.breakdown_ms["idle"] = idle / 1e6;
    out.breakdown_ms["send"] = send / 1e6;
  }
  if (ranks.size() > 1) out.breakdown_ms["comm"] = comm / 1e6;
  // The shared-memory lanes' request bytes (every rank's): copied into a region by the client, or already there.
  if (copied + in_place > 0) out.counts["shm_bytes_copied"] += copied, out.counts["shm_bytes_in_place"] += in_place;
  if (appends > 0) out.counts["append_kv_requests"] += appends;
  // ... and what went through their rings (engine.rworkers.spin_us).
  if (ring_requests + ring_replies > 0) out.counts["ring_requests"] += ring_requests, out.counts["ring_replies"] += ring_replies;
}

}  // namespace fd
