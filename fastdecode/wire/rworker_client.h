// The S-side client of R-workers: one DEALER per R-worker, requests in flight to many workers at
// once, replies matched by request id, a deadline on every wait. An ERROR reply throws an fd::Error naming
// the worker; a worker that is gone throws RWorkerLost naming it, never a hang: its connection closed (the
// process died), ZeroMQ heartbeats unanswered for heartbeat_timeout_ms (the process stopped, its host or the
// network down), or a reply past the deadline. Optional CURVE (fastdecode/wire/curve.h) on every connection.
#pragma once
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "fastdecode/core/json_util.h"
#include "fastdecode/wire/curve.h"
#include "fastdecode/wire/wire.h"

namespace fd {

struct RWorkerReply {
  proto::Header h;
  std::vector<zmq::message_t> frames;  // after the header
  int64_t recv_ns = 0;                 // now_ns() when this client took it off the socket
};

// A tensor frame to send without copying: the bytes must stay valid until the reply has arrived.
struct ConstBuffer {
  const void* data = nullptr;
  size_t size = 0;
};

// Workers this client lost (their indices) and why.
class RWorkerLost : public Error {
 public:
  RWorkerLost(std::vector<size_t> workers, const std::string& what) : Error(what), workers_(std::move(workers)) {}
  const std::vector<size_t>& workers() const { return workers_; }

 private:
  std::vector<size_t> workers_;
};

struct RWorkerClientOptions {
  int timeout_ms = 60000;          // every wait's deadline
  int io_threads = 2;
  int heartbeat_ms = 0;            // ZeroMQ heartbeats on every connection (0: off)
  int heartbeat_timeout_ms = 0;    // silence after which a worker's connection is dropped (it is then lost)
  std::string curve_server_public; // set: CURVE, the workers' public key (Z85), with this client's pair below
  CurveKeyPair curve_client;
};

class RWorkerClient {
 public:
  RWorkerClient(std::vector<std::string> endpoints, int timeout_ms, int io_threads = 2);
  RWorkerClient(std::vector<std::string> endpoints, const RWorkerClientOptions& o);
  ~RWorkerClient();

  size_t size() const { return socks_.size(); }
  const std::string& endpoint(size_t w) const { return endpoints_.at(w); }
  void set_timeout_ms(int ms) { timeout_ms_ = ms; }
  // Whether worker w is known gone (its connection dropped or refused, or mark_dead).
  bool lost(size_t w) const { return !lost_.at(w).empty(); }
  // Stops using worker w: its socket is closed (queued requests dropped), waits no longer include it. Idempotent.
  void mark_dead(size_t w, const std::string& why);
  // Collects (and drops) the replies of every request sent to a live worker and not yet waited for, up to
  // timeout_ms: after a failed step, so that no stale reply is left. Lost workers are skipped.
  void drain(int timeout_ms);

  // Sends a request (h.request_id and h.n_frames are filled in). Returns the request id.
  uint64_t send(size_t w, proto::Header h, const std::vector<ConstBuffer>& frames);
  // Waits for the replies to (worker, request id) pairs, in that order. Throws on ERROR replies (after
  // collecting every reply, so no reply is left behind) or when the deadline passes.
  std::vector<RWorkerReply> wait(const std::vector<std::pair<size_t, uint64_t>>& requests, int timeout_ms = -1);
  RWorkerReply call(size_t w, const proto::Header& h, const std::vector<ConstBuffer>& frames = {});

  // Convenience requests (synchronous).
  json hello(size_t w, int n_layers, int n_heads, int n_kv_heads, int head_dim, proto::WireDType dtype);
  void add_seqs(size_t w, const std::vector<uint64_t>& ids);
  void free_seqs(size_t w, const std::vector<uint64_t>& ids);
  // FREE_SEQ without waiting: returns the request id for wait(); `ids` must stay alive until then
  // (zero-copy send).
  uint64_t send_free_seqs(size_t w, const std::vector<uint64_t>& ids);
  json stats(size_t w);
  // SHUTDOWN with the worker's token (kShutdownTokenBytes bytes, or empty: refused by the worker unless it has none
  // either... a worker without a token refuses every SHUTDOWN).
  void shutdown(size_t w, const std::string& token);
  // Ends this client's session on worker w: every sequence it holds there is freed.
  void close_session(size_t w);
  // TRUNCATE: sequence ids[i] keeps its first lengths[i] tokens at every layer.
  void truncate(size_t w, const std::vector<uint64_t>& ids, const std::vector<uint32_t>& lengths);

 private:
  std::optional<RWorkerReply> receive(size_t w);  // nullopt when nothing is queued
  std::string who(size_t w) const;
  void poll_monitors();  // records workers whose connection dropped or whose handshake failed
  [[noreturn]] void throw_lost(const std::vector<size_t>& ws) const;

  zmq::context_t ctx_;
  std::vector<std::string> endpoints_;
  std::vector<zmq::socket_t> socks_;
  std::vector<zmq::socket_t> monitors_;  // per worker: its DEALER's connection events
  std::vector<std::string> lost_;        // per worker: why it is gone ("" while it is not)
  std::vector<bool> dead_;               // per worker: marked dead (socket closed)
  int timeout_ms_;
  uint64_t next_id_ = 1;
  std::map<std::pair<size_t, uint64_t>, RWorkerReply> stash_;  // replies received while waiting for others
  std::set<std::pair<size_t, uint64_t>> outstanding_;          // sent, reply not yet waited for
};

}  // namespace fd
