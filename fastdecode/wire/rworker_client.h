// The S-side client of R-workers: one DEALER per R-worker, requests in flight to many workers at
// once, replies matched by request id, a deadline on every wait. An ERROR reply or a missed deadline
// throws an fd::Error naming the worker, never a hang.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "fastdecode/core/json_util.h"
#include "fastdecode/wire/wire.h"

namespace fd {

struct RWorkerReply {
  proto::Header h;
  std::vector<zmq::message_t> frames;  // after the header
};

// A tensor frame to send without copying: the bytes must stay valid until the reply has arrived.
struct ConstBuffer {
  const void* data = nullptr;
  size_t size = 0;
};

class RWorkerClient {
 public:
  RWorkerClient(std::vector<std::string> endpoints, int timeout_ms, int io_threads = 2);
  ~RWorkerClient();

  size_t size() const { return socks_.size(); }
  const std::string& endpoint(size_t w) const { return endpoints_.at(w); }
  void set_timeout_ms(int ms) { timeout_ms_ = ms; }

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
  void shutdown(size_t w);

 private:
  std::optional<RWorkerReply> receive(size_t w);  // nullopt when nothing is queued
  std::string who(size_t w) const;

  zmq::context_t ctx_;
  std::vector<std::string> endpoints_;
  std::vector<zmq::socket_t> socks_;
  int timeout_ms_;
  uint64_t next_id_ = 1;
  std::map<std::pair<size_t, uint64_t>, RWorkerReply> stash_;  // replies received while waiting for others
};

}  // namespace fd
