// The R-worker's socket loop: a ROUTER bound to an endpoint, one request at a time through
// RWorkerService, until SHUTDOWN or a stop signal.
#pragma once
#include <atomic>
#include <functional>
#include <vector>
#include <string>

#include "fastdecode/rworker/service.h"
#include "fastdecode/wire/curve.h"

namespace fd {

struct RWorkerServerOptions {
  std::string listen = "tcp://127.0.0.1:5555";
  std::vector<int> cpus;  // pin the compute threads to these CPUs (round robin); empty = no pinning
  int io_threads = 2;
  bool verbose = false;     // log every error reply (no rate limit)
  int log_errors_per_s = 10; // otherwise at most this many error lines per second, then a "suppressed K" line
  long parent_pid = 0;  // > 0: stop serving once this process is no longer our parent (it died: no orphans)
  // ZeroMQ heartbeats (PING every heartbeat_ms, the connection dropped after heartbeat_timeout_ms of silence): a
  // client that died or stopped without closing its connection is seen gone, and its session ends. 0: off.
  int heartbeat_ms = 1000, heartbeat_timeout_ms = 10000;
  CurveKeyPair curve;                      // set: CURVE on every connection (encrypted, authenticated)
  std::vector<std::string> curve_clients;  // the client public keys admitted (ZAP); required with curve
  bool serve_once = false;                 // stop once the first client's session has ended
  size_t shm_max_bytes = size_t(4) << 30;  // largest shared-memory region a client may offer (0: refuse every offer)
};

// What the loop counts about the messages it received (for tests and logs).
struct RouterCounters {
  size_t max_bytes_held = 0;      // the most bytes of one message's frames the loop held at once
  uint64_t refused_too_large = 0; // messages refused for their total size (or frame count) as they arrived
  uint64_t shm_attached = 0;      // SHM_ATTACH offers accepted
  uint64_t shm_refused = 0;       // SHM_ATTACH offers refused
  uint64_t shm_requests = 0;      // requests resolved out of a region and handed on
  uint64_t shm_replies = 0;       // replies written into a region
  uint64_t shm_bad = 0;           // requests flagged as in a region that the loop refused (bad descriptor, ...)
};

// Rate-limited logging: at most `per_second` lines in each one-second window; the lines over that are counted,
// and the first line allowed after such a window is preceded by one "suppressed K" summary. A peer that sends
// bad requests by the million thus writes a bounded log. per_second <= 0: no limit.
class LogLimiter {
 public:
  explicit LogLimiter(int per_second) : per_second_(per_second) {}
  // Whether a line may be printed at `now_ns`; when it may and lines were suppressed before, `*summary` is set
  // to the line to print first (else cleared).
  bool allow(int64_t now_ns, std::string* summary);
  uint64_t suppressed_total() const { return suppressed_total_; }

 private:
  int per_second_;
  int64_t window_start_ = 0;
  int in_window_ = 0;
  uint64_t suppressed_ = 0, suppressed_total_ = 0;
};

// The ROUTER loop every R-worker process runs (fd-rworker; the benchmark's echo R-worker): bind, then
// one request at a time — its frames (routing id stripped) to `handle`, the frames it returns back to
// the sender (a vanished peer just loses its reply) — until `done()` says so (checked after every
// request and every 100 ms of quiet). Frames are taken one at a time and the message's running total is checked
// against max_message_bytes (and kMaxRequestFrames) as each arrives: past the limit the loop stops holding the
// message (it keeps its header frame only), receives and drops each remaining frame at once, and answers an
// ERROR too-large (malformed for too many frames) without calling `handle`. Note: libzmq itself delivers a
// multipart message only once all of its frames are in (docs/SECURITY.md), so this bounds what the loop holds,
// not libzmq's own receive buffer; ZMQ_MAXMSGSIZE bounds each frame there. `on_bound` receives the endpoint actually bound (tcp://...:*
// resolves to a port). Throws fd::Error if it cannot bind.
// Each message's `peer` is its connection's routing id; when a connection is gone (closed by the peer, a heartbeat
// timeout, the peer's process killed) `on_disconnect(peer)` is called once for each routing id seen on it (the loop
// watches its socket's DISCONNECTED events, drained before each message, and maps them to the routing ids seen on
// that file descriptor).
// Shared memory (fastdecode/wire/shm.h, docs/RWORKER.md): the loop answers SHM_ATTACH itself (mapping the region
// after every check, at most shm_max_bytes; 0 refuses), and a request flagged kFlagShm from a peer with a region is
// resolved before `handle` sees it: its descriptor's spans, bounds-checked against the region, become the frames
// (ids and counts copied out first, so that the client cannot change them between a check and their use), and the
// header's flag is cleared, so `handle` gets the message as ZeroMQ would have brought it. Its reply goes into the
// space the client set aside when it fits (then [header with the flag][descriptor] goes back), else over ZeroMQ. A
// bad descriptor is an ERROR malformed reply. A peer's region is unmapped when it disconnects or sends CLOSE.
struct RouterLoop {
  std::string listen;
  int io_threads = 1;
  size_t max_message_bytes = size_t(1) << 30;  // one frame over it: libzmq drops the peer's connection
  std::function<std::vector<zmq::message_t>(const std::string& peer, const proto::Frame* frames, size_t n)> handle;
  std::function<void(const std::string& peer)> on_disconnect;
  int heartbeat_ms = 0, heartbeat_timeout_ms = 0;  // ZeroMQ heartbeats (0: off)
  CurveKeyPair curve;                              // set: CURVE server; curve_clients admitted through ZAP
  std::vector<std::string> curve_clients;
  // Optional: how many connections the ZAP handler refused (tests).
  std::atomic<uint64_t>* curve_refused = nullptr;
  std::function<bool()> done;
  std::function<void(const std::string&)> on_bound;
  // Optional: the loop adds to these (the rworker's counters; a test's).
  RouterCounters* counters = nullptr;
  // Optional: sees the ERROR reply of each message refused as it arrived (fd-rworker logs it, rate-limited).
  std::function<void(const std::vector<zmq::message_t>& reply)> on_refused;
  size_t shm_max_bytes = size_t(4) << 30;  // largest region a peer may offer (0: refuse every offer)
};

// The most frames one message may have (a valid request has at most 5); more is refused as it arrives.
constexpr size_t kMaxRequestFrames = 64;
void run_router_loop(const RouterLoop& loop);

// Runs until SHUTDOWN or *stop becomes true (checked every 100 ms). `on_bound` receives the endpoint
// actually bound (tcp://...:* resolves to a port). Throws fd::Error if it cannot bind.
void run_rworker_server(RWorkerService& service, const RWorkerServerOptions& opt, const std::atomic<bool>* stop,
                        const std::function<void(const std::string&)>& on_bound = nullptr);

// Pins the calling process's OpenMP threads (n of them) to `cpus`, round robin. No-op when empty.
void pin_openmp_threads(const std::vector<int>& cpus, int n_threads);

}  // namespace fd
