// The R-worker's request handler, independent of sockets: one decoded request in, one reply out.
// Bad input of any kind becomes an ERROR reply and leaves the worker's state unchanged; the handler
// never throws for what a peer sends.
//
// Sessions: each client (a connection: the ROUTER's routing id, the `peer` of handle()) has its own session,
// opened by its HELLO: its model shape and its own KV store, so sequence ids are scoped per client — another
// client cannot see, read, append to, free or probe them, nor re-HELLO the worker under them. A session ends
// with the client's CLOSE, when its connection is gone (end_session: the socket loop sees the disconnect,
// heartbeats included), or never otherwise. Every session's blocks and bookkeeping, and each session's own
// overhead, count against --memory-gb (one KVMemory shared by the stores); --session-quota-gb bounds one
// session's share, --max-sessions their number. SHUTDOWN needs the worker's token (RWorkerConfig).
#pragma once
#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "fastdecode/core/json_util.h"
#include "fastdecode/wire/wire.h"
#include "fastdecode/rworker/kv_store.h"

namespace fd {

struct RouterCounters;  // fastdecode/rworker/intake.h

struct RWorkerConfig {
  KVDType kv_dtype = KVDType::F16;
  size_t memory_limit_bytes = size_t(4) << 30;
  int threads = 1;
  Isa isa = Isa::Scalar;
  proto::Limits limits;
  std::string name = "rworker";  // for logs and STATS
  size_t session_quota_bytes = 0;  // > 0: at most this much per session (KV and bookkeeping); 0: the worker's limit
  size_t max_sessions = 64;
  // SHUTDOWN is obeyed only when its frame equals this token (kShutdownTokenBytes bytes); empty: never (stop the
  // worker with a signal). Spawned workers get one from their parent (FD_RWORKER_SHUTDOWN_TOKEN).
  std::string shutdown_token;
  QueryQuant query = QueryQuant::Auto;  // how int8/int4 blocks take the query (decode_attention.h; --query)
};

// The largest request a worker of this memory limit takes by default (fd-rworker --max-message-mb): 1/32 of it,
// within 16 MB - 1 GB (MB = 1e6 bytes). An ATTEND is a small fraction of the KV it reads, and clients split their
// appends to fit (HELLO's max_message_bytes), so the limit costs them nothing; it bounds what a peer can make the
// worker hold beside its KV (docs/SECURITY.md, "Memory").
inline size_t default_max_message_bytes(size_t memory_limit_bytes) {
  const size_t lo = 16'000'000, hi = 1'000'000'000, m = memory_limit_bytes / 32;
  return m < lo ? lo : m > hi ? hi : m;
}

// What one session costs of --memory-gb besides its sequences: the session's record and its store's object.
constexpr size_t kSessionBytes = 4096;

// The most layers a HELLO may declare (a model has at most a few hundred; the bound keeps every layer index
// and count in int range and one sequence's bookkeeping small).
constexpr uint32_t kMaxHelloLayers = 65536;

class RWorkerService {
 public:
  explicit RWorkerService(RWorkerConfig cfg);

  // Handles one request (parts[0] = header) of client `peer`. Returns the reply's frames (header first).
  std::vector<zmq::message_t> handle(const std::string& peer, const proto::Frame* parts, size_t n_parts);
  // One client (peer ""), for tests and tools that drive the handler directly.
  std::vector<zmq::message_t> handle(const proto::Frame* parts, size_t n_parts) { return handle(std::string(), parts, n_parts); }
  // The client's connection is gone: its session (if any) ends and its sequences are freed.
  void end_session(const std::string& peer);
  bool shutdown_requested() const { return shutdown_; }
  // Worker-wide counters and memory, and `peer`'s own session (sequences, tokens, memory) when it has one.
  json stats(const std::string& peer = std::string()) const;
  size_t sessions() const { return sessions_.size(); }
  uint64_t sessions_ended() const { return sessions_ended_; }
  const RWorkerConfig& config() const { return cfg_; }
  // The socket loop's counters (what it dropped, cut or could not answer), reported by STATS under "intake"; null:
  // none. Set by the loop that serves this handler, for as long as it runs.
  void set_router_counters(const RouterCounters* c) { router_ = c; }

 private:
  struct Session {
    proto::Header shape{};            // the HELLO's dims
    std::unique_ptr<KVStore> store;
  };
  std::vector<zmq::message_t> dispatch(const std::string& peer, const proto::Message& m);
  std::vector<zmq::message_t> on_hello(const std::string& peer, const proto::Message& m);
  std::vector<zmq::message_t> on_add(Session& s, const proto::Message& m);
  std::vector<zmq::message_t> on_append(Session& s, const proto::Message& m);
  static void append_one(KVStore& store, uint64_t id, int layer, const proto::Message& m, size_t tok, size_t n,
                         size_t row, size_t es);
  std::vector<zmq::message_t> on_attend(Session& s, const proto::Message& m);
  std::vector<zmq::message_t> on_free(Session& s, const proto::Message& m);
  std::vector<zmq::message_t> on_truncate(Session& s, const proto::Message& m);
  std::vector<zmq::message_t> on_shutdown(const proto::Message& m);
  Session& session(const std::string& peer);  // NotConfigured when the peer sent no HELLO
  void check_shape(const Session& s, const proto::Header& h) const;
  std::vector<uint64_t> read_ids(const Session& s, const proto::Message& m, bool must_exist) const;
  size_t quota() const;  // one session's limit
  // The reply to `req`: its header (echoing the request's id and shape, with `status`) and frames.
  std::vector<zmq::message_t> reply(const proto::Header& req, proto::MsgType type, std::vector<zmq::message_t> frames = {},
                                    uint64_t compute_ns = 0, int32_t status = 0) const;
  // An ERROR reply to `req`: code and message (one frame).
  std::vector<zmq::message_t> error_reply(const proto::Header& req, proto::ErrorCode code, const std::string& msg);

  RWorkerConfig cfg_;
  const RouterCounters* router_ = nullptr;
  KVMemory memory_;                      // --memory-gb, shared by every session's store
  std::map<std::string, Session> sessions_;  // by peer (the client's connection)
  bool shutdown_ = false;
  DecodeAttentionWorkspace ws_;
  std::vector<float> q32_, o32_;
  std::vector<SeqKVView> views_;
  // counters for STATS
  enum class AttendPart { Prepare, Append, Query, Kernel, Output, Count };
  std::array<uint64_t, size_t(AttendPart::Count)> parts_ns_{};  // ATTEND time by part (their sum is compute_ns_)
  uint64_t requests_ = 0, errors_ = 0, attends_ = 0, attend_seqs_ = 0, compute_ns_ = 0, sessions_opened_ = 0,
           sessions_ended_ = 0;
};
}  // namespace fd
