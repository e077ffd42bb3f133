// The R-worker's socket loop: a ROUTER bound to an endpoint, one request at a time through
// RWorkerService, until SHUTDOWN or a stop signal.
#pragma once
#include <atomic>
#include <functional>
#include <vector>
#include <string>

#include "fastdecode/rworker/intake.h"
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
  // The intake guard (fastdecode/rworker/intake.h): the most request bytes held at once (0: twice the largest
  // message) and the most connections (0: unbounded). Resident memory is watched against the service's memory limit.
  size_t intake_bytes = 0;
  size_t max_connections = 256;
  int spin_us = 0;  // RouterLoop::spin_us
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
// Peers: nothing a peer sends stops the loop. A message whose connection cannot be tracked (no ZMTP 3 metadata: a
// ZMTP 1.0 / 2.0 peer, an HTTP request, random bytes that libzmq took for ZMTP 1.0) is dropped unanswered; a ZeroMQ
// call or a handler that fails on a peer's message drops that message (an ERROR internal reply when it had our
// header); a reply that cannot be sent is lost. Each is counted (RouterCounters) and logged through `log`. The loop
// ends only on `done()`, on a failure to bind, or on a fault of its own (a failed poll).
// Memory: `intake` sets the guard (fastdecode/rworker/intake.h) that bounds what libzmq holds for the peers.
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
  IntakeOptions intake;                    // the guard's limits (all 0: no guard)
  // Optional: one line about a peer the loop dropped, cut or could not answer (may be called from the guard's thread;
  // fd-rworker's rate-limits them).
  std::function<void(const std::string&)> log;
  // > 0: for this many microseconds after the loop became free (it answered a request, or started), poll the socket
  // without sleeping before blocking on it: a request arriving then is taken without the thread's wake-up (the small-
  // message floor, issue 43), at the cost of that much of a core per idle spell. 0: block at once.
  int spin_us = 0;
};

// The most frames one message may have (a valid request has at most 5); more is refused as it arrives.
constexpr size_t kMaxRequestFrames = 64;
// Complete messages libzmq queues per connection before it stops reading it (ZMQ_RCVHWM): the S-worker's two
// mini-batches' ATTENDs fit; a longer stream (a prefill's appends) waits on the client's side.
constexpr int kRouterRcvHwm = 2;
void run_router_loop(const RouterLoop& loop);

// Runs until SHUTDOWN or *stop becomes true (checked every 100 ms). `on_bound` receives the endpoint
// actually bound (tcp://...:* resolves to a port). Throws fd::Error if it cannot bind.
void run_rworker_server(RWorkerService& service, const RWorkerServerOptions& opt, const std::atomic<bool>* stop,
                        const std::function<void(const std::string&)>& on_bound = nullptr);

// Pins the calling process's OpenMP threads (n of them) to `cpus`, round robin. No-op when empty.
void pin_openmp_threads(const std::vector<int>& cpus, int n_threads);

}  // namespace fd
