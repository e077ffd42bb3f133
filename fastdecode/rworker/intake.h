// What an R-worker's socket holds for its peers, and the guard that bounds it (docs/SECURITY.md, "Memory").
//
// libzmq reads every connection on its own I/O thread and delivers a multipart message only once all of its frames
// are in, so whatever a peer sends sits in libzmq's buffers before the socket loop can look at it. ZMQ_MAXMSGSIZE
// bounds one frame and ZMQ_RCVHWM the complete messages queued per connection, but nothing in libzmq bounds the
// frames of a message still arriving, nor the number of connections. The guard does, from outside libzmq:
//
// * Each connection's bytes held: what TCP handed libzmq (TCP_INFO's bytes received less the socket's unread queue,
//   SIOCINQ) less the wire bytes of the messages the loop took from it (ZMTP framing included; CURVE's per-frame box
//   too) less a slack for the handshake and heartbeats. A connection whose message is still arriving shows here as
//   its bytes grow, before libzmq delivers anything.
// * Every tick (2 ms) the guard cuts (disconnect_socket() on libzmq's descriptor: libzmq sees the peer gone, drops what it
//   held for it, and the loop ends its session) the connection holding the most when
//     - the bytes held by all connections plus the request being handled pass the intake budget, or
//     - the process's resident memory passes its bound (memory limit + intake budget + the base the guard measured
//       at start + the handling allowance): the backstop for a message of millions of tiny frames, which costs
//       libzmq 64 bytes a frame for 2 on the wire;
//   and it cuts the newest connection past max_connections.
// Only TCP connections are measured (an ipc:// peer is a process of this host); the cap on connections holds for all.
#pragma once
#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

namespace fd {

struct IntakeOptions {
  size_t budget_bytes = 0;        // most request bytes held at once, received by libzmq or being handled (0: unbounded)
  size_t memory_limit_bytes = 0;  // > 0: watch resident memory against rss_bound() (the worker's --memory-gb)
  size_t max_message_bytes = 0;   // the largest message (for the handling allowance of rss_bound())
  size_t max_connections = 0;     // most connections at once (0: unbounded)
  int tick_us = 2000;          // how often the guard looks
  bool curve = false;          // frames arrive in CURVE boxes (33 more bytes a frame on the wire)
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

// What the loop and its guard count (the loop's own counters are written by the loop thread only; the guard's are
// atomics). Reported in STATS under "intake" and at the worker's exit.
struct RouterCounters {
  size_t max_bytes_held = 0;      // the most bytes of one message's frames the loop held at once
  uint64_t refused_too_large = 0; // messages refused for their total size (or frame count) as they arrived
  uint64_t shm_attached = 0;      // SHM_ATTACH offers accepted
  uint64_t shm_refused = 0;       // SHM_ATTACH offers refused
  uint64_t shm_requests = 0;      // requests resolved out of a region and handed on
  uint64_t shm_replies = 0;       // replies written into a region
  uint64_t shm_bad = 0;           // requests flagged as in a region that the loop refused (bad descriptor, ...)
  uint64_t ring_requests = 0;     // requests taken from a region's request ring (fastdecode/wire/shm.h, "rings")
  uint64_t ring_replies = 0;      // replies put in a region's reply ring (the client was polling)
  uint64_t ring_waiting_max = 0;  // the most ring requests one peer had waiting for its ZeroMQ messages (bounded)
  uint64_t untracked_dropped = 0; // messages dropped: their connection is not one the loop can track (no ZMTP 3
                                  // metadata: a ZMTP 1.0 / 2.0 peer, an HTTP request, random bytes)
  uint64_t peer_faults = 0;       // messages dropped because handling them failed in a way a peer caused (a ZeroMQ
                                  // call that failed, an exception out of the handler)
  uint64_t replies_lost = 0;      // replies that could not be sent (the peer gone, its pipe full)
  size_t budget_bytes = 0, rss_bound_bytes = 0, base_rss_bytes = 0;  // the guard's limits, as it set them
  // The socket loop's time around its ATTENDs (STATS attend_loop_s, issue 43): waiting in poll before the request came
  // (the loop idle, its wake-up included), receiving its frames, handling it (the service's compute and the
  // shared-memory lane's work on both sides of it), sending the reply.
  uint64_t attend_loop_requests = 0, attend_wait_ns = 0, attend_receive_ns = 0, attend_handle_ns = 0, attend_send_ns = 0;
  std::atomic<uint64_t> cut_intake{0};       // connections cut: the bytes held passed the intake budget
  std::atomic<uint64_t> cut_rss{0};          // connections cut: resident memory passed its bound
  std::atomic<uint64_t> cut_connections{0};  // connections cut: one past max_connections
  std::atomic<uint64_t> max_rss_bytes{0};    // the most resident memory the guard saw
  std::atomic<uint64_t> max_held_bytes{0};   // the most request bytes held at once that the guard saw
};

// The bytes one frame of `size` bytes takes on the wire (ZMTP 3 framing; with `curve`, its CURVE box).
uint64_t wire_bytes_of_frame(size_t size, bool curve);

// Cuts the connection on descriptor `fd` under its owner (libzmq): TCP resets it and drops its receive queue, so the
// owner's next read fails at once; a socket that cannot be disconnected so (ipc://) is shut down instead (its owner
// reads end-of-stream). Returns the bytes its receive queue held unread.
size_t disconnect_socket(int fd);

// The connections of one ROUTER socket, from its monitor's ACCEPTED and DISCONNECTED events, and the guard thread
// that watches them. The monitor socket is shared by the loop and the guard, each draining it under the table's
// lock: the loop drains it before each message, so a connection's end is always seen before a later connection on
// the same descriptor sends anything.
class Connections {
 public:
  // `log` receives one line per cut (called from the guard's thread; the caller makes it safe). Starts the guard
  // when any limit is set.
  Connections(zmq::context_t& ctx, zmq::socket_t& sock, const IntakeOptions& opt, RouterCounters* counters,
              std::function<void(const std::string&)> log);
  ~Connections();
  Connections(const Connections&) = delete;
  Connections& operator=(const Connections&) = delete;

  // Loop: events since the last call; the routing ids seen on connections now gone are appended to `gone`.
  void drain(std::vector<std::string>* gone);
  // Loop: a message of `wire` bytes (wire_bytes_of_frame summed) was taken from connection `fd` for `peer`.
  void delivered(int fd, const std::string& peer, uint64_t wire);
  // Loop: the bytes of the request it is handling now (0 once answered).
  void handling(size_t bytes) { handling_.store(bytes, std::memory_order_relaxed); }
  // The resident memory over which the guard cuts (0 when not watched): the base (resident memory when the table
  // was made, plus kBaseSlackBytes: allocator slack, thread stacks, libzmq's per-connection buffers), the memory
  // limit, the intake budget, and what handling the largest message may take besides the message itself
  // (kHandlingFactor times it: an ATTEND's fp32 query and output and its 16-bit reply).
  size_t rss_bound() const { return rss_bound_; }
  size_t base_rss() const { return base_rss_; }
  static constexpr size_t kBaseSlackBytes = size_t(48) << 20;
  static constexpr size_t kHandlingFactor = 5;
  // The connection's handshake and heartbeats, which the loop never sees as messages: allowed for in its bytes held.
  static constexpr uint64_t kHeldSlackBytes = 4096, kHeldSlackBytesPerSecond = 256;

 private:
  struct Conn {
    std::set<std::string> peers;
    uint64_t delivered = 0;  // wire bytes of the messages taken from it
    int64_t accepted_ns = 0;  // first seen (accept reported, or its first message)
    sockaddr_storage addr{};
    socklen_t addr_len = 0;
    bool tcp = false;
    bool cut = false;
    std::string name;  // the peer's address, for the log
  };
  void drain_locked();
  void track(int fd, Conn& c);  // fills in a new record: when it was first seen, its peer's address
  void guard_loop();
  void tick();
  // Bytes the connection holds in libzmq (0 when it cannot be measured).
  uint64_t held(int fd, const Conn& c, int64_t now) const;
  void cut(int fd, Conn& c, const std::string& why, std::atomic<uint64_t>& counter);

  IntakeOptions opt_;
  size_t base_rss_ = 0, rss_bound_ = 0;
  RouterCounters* counters_;
  std::function<void(const std::string&)> log_;
  std::mutex mu_;
  zmq::socket_t mon_;
  std::map<int, Conn> conns_;
  std::vector<std::string> gone_;  // peers of ended connections, for the loop's next drain
  std::atomic<size_t> handling_{0};
  int statm_fd_ = -1;
  int64_t last_trim_ns_ = 0;
  std::atomic<bool> stop_{false};
  std::condition_variable cv_;
  std::thread guard_;
};

}  // namespace fd
