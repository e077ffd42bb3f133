// The R-worker's request handler, independent of sockets: one decoded request in, one reply out.
// Bad input of any kind becomes an ERROR reply and leaves the worker's state unchanged; the handler
// never throws for what a peer sends.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "fastdecode/core/json_util.h"
#include "fastdecode/wire/wire.h"
#include "fastdecode/rworker/kv_store.h"

namespace fd {

struct RWorkerConfig {
  KVDType kv_dtype = KVDType::F16;
  size_t memory_limit_bytes = size_t(4) << 30;
  int threads = 1;
  Isa isa = Isa::Scalar;
  proto::Limits limits;
  std::string name = "rworker";  // for logs and STATS
};

// The most layers a HELLO may declare (a model has at most a few hundred; the bound keeps every layer index
// and count in int range and one sequence's bookkeeping small).
constexpr uint32_t kMaxHelloLayers = 65536;

class RWorkerService {
 public:
  explicit RWorkerService(RWorkerConfig cfg);

  // Handles one request (parts[0] = header). Returns the reply's frames (header first).
  std::vector<zmq::message_t> handle(const proto::Frame* parts, size_t n_parts);
  bool shutdown_requested() const { return shutdown_; }
  json stats() const;
  const RWorkerConfig& config() const { return cfg_; }

 private:
  std::vector<zmq::message_t> dispatch(const proto::Message& m);
  std::vector<zmq::message_t> on_hello(const proto::Message& m);
  std::vector<zmq::message_t> on_add(const proto::Message& m);
  std::vector<zmq::message_t> on_append(const proto::Message& m);
  std::vector<zmq::message_t> on_attend(const proto::Message& m);
  std::vector<zmq::message_t> on_free(const proto::Message& m);
  void check_shape(const proto::Header& h) const;
  std::vector<uint64_t> read_ids(const proto::Message& m, bool must_exist) const;
  // The reply to `req`: its header (echoing the request's id and shape, with `status`) and frames.
  std::vector<zmq::message_t> reply(const proto::Header& req, proto::MsgType type, std::vector<zmq::message_t> frames = {},
                                    uint64_t compute_ns = 0, int32_t status = 0) const;
  // An ERROR reply to `req`: code and message (one frame).
  std::vector<zmq::message_t> error_reply(const proto::Header& req, proto::ErrorCode code, const std::string& msg);

  RWorkerConfig cfg_;
  std::unique_ptr<KVStore> store_;  // created by HELLO
  proto::Header shape_{};           // the HELLO's dims
  bool shutdown_ = false;
  DecodeAttentionWorkspace ws_;
  std::vector<float> q32_, o32_;
  std::vector<SeqKVView> views_;
  // counters for STATS
  uint64_t requests_ = 0, errors_ = 0, attends_ = 0, attend_seqs_ = 0, compute_ns_ = 0;
};
}  // namespace fd
