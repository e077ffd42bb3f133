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
#include "fastdecode/wire/shm.h"
#include "fastdecode/wire/wire.h"

namespace fd {

struct RWorkerReply {
  proto::Header h;                     // as the worker sent it, but for kFlagShm (cleared: frames are resolved)
  std::vector<zmq::message_t> frames;  // after the header (through the shared-memory lane: views of the region, whose
                                       // space is given back when the last of them is destroyed)
  int64_t recv_ns = 0;                 // now_ns() when this client took it off the socket
};

// A frame to send. One of at most kCopyBytes (ids, counts, a tiny batch's tensors) is copied into the message by send():
// the caller may reuse or free it once send() returns. A larger one is sent without copying (libzmq reads it when its
// I/O thread gets to it, which may be long after send() returns behind a slow connection): its bytes must stay valid
// until the reply has arrived.
struct ConstBuffer {
  static constexpr size_t kCopyBytes = 64 * 1024;
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
  // > 0: offer each worker a shared-memory region of this many bytes (fastdecode/wire/shm.h) with this client's
  // first message to it; a worker on this host that accepts it gets ATTEND and APPEND_KV through it (ZeroMQ carries
  // their headers), one that refuses (another host, --shm-max-mb 0, ...) everything over ZeroMQ as before.
  size_t shm_bytes = 0;
  // > 0: each wait polls its sockets without sleeping for up to this many microseconds before it blocks (a reply
  // arriving then is taken without the thread's wake-up: the small-message floor, issue 43), and a worker with an
  // active lane may put its reply in the region's reply ring while this client polls (fastdecode/wire/shm.h, "rings").
  // 0: block at once.
  int spin_us = 0;
};

// The region the engines offer each worker (engine.rworkers.shm): room for a few steps' requests and replies of a
// large batch (an ATTEND of 1024 sequences of 32 heads of 128 fp16 is 24 MiB with its reply); a request that finds no
// room goes over ZeroMQ.
constexpr size_t kEngineShmBytes = size_t(64) << 20;

// The shared-memory lane of one worker (RWorkerClient::shm_stats).
struct ShmLaneStats {
  // off (not asked for) | pending (offered, no answer yet) | active | refused | closed (the worker was marked dead,
  // or this client closed its session there: the worker unmapped the region)
  std::string state = "off";
  std::string reason;         // refused: the worker's answer, or why this client could not make the region
  std::string name;           // the region's name (unlinked once the worker answered)
  size_t bytes = 0;           // the region's size
  uint64_t free_bytes = 0;    // of its data area, now
  uint64_t requests_shm = 0;  // requests sent through the region
  uint64_t requests_zmq = 0;  // ATTEND / APPEND_KV sent over ZeroMQ while the lane was active (no space left)
  uint64_t replies_shm = 0;   // replies received through the region
  uint64_t replies_zmq = 0;   // replies to requests sent through the region that came over ZeroMQ (no room, ERROR)
  uint64_t requests_ring = 0;  // of requests_shm: put in the region's request ring (the worker was polling), not sent
  uint64_t replies_ring = 0;   // of replies_shm: taken from the region's reply ring (this client was polling)
  uint64_t bytes_copied = 0;    // tensor bytes of requests through the region that this client copied in
  uint64_t bytes_in_place = 0;  // ... that already lay in the region (a ShmBlock's) and went as they lay
};

// A block of one worker's region that its holder keeps (RWorkerClient::shm_alloc): request frames written there (the
// S-Part's q/k/v, copied down straight into it) go through the lane as they lie, without the client's copy into the
// region. Given back to the region's allocator when destroyed; keeps the mapping alive until then. Move-only.
class ShmBlock {
 public:
  ShmBlock() = default;
  ShmBlock(std::shared_ptr<shm::Space> space, uint64_t offset, size_t bytes)
      : space_(std::move(space)), offset_(offset), size_(bytes) {}
  ShmBlock(ShmBlock&& o) noexcept { swap(o); }
  ShmBlock& operator=(ShmBlock&& o) noexcept {
    ShmBlock t(std::move(o));
    swap(t);
    return *this;
  }
  ShmBlock(const ShmBlock&) = delete;
  ShmBlock& operator=(const ShmBlock&) = delete;
  ~ShmBlock() {
    if (space_) space_->alloc.free(offset_);
  }
  uint8_t* data() const { return space_ ? space_->region->base() + offset_ : nullptr; }
  size_t size() const { return size_; }
  explicit operator bool() const { return space_ != nullptr; }

 private:
  void swap(ShmBlock& o) noexcept {
    std::swap(space_, o.space_);
    std::swap(offset_, o.offset_);
    std::swap(size_, o.size_);
  }
  std::shared_ptr<shm::Space> space_;
  uint64_t offset_ = 0;
  size_t size_ = 0;
};

// One APPEND_KV of a batch: rows [begin, end) of the caller's K and V, the sequences they belong to and each one's
// tokens among them.
struct AppendChunk {
  std::vector<uint64_t> ids;
  std::vector<uint32_t> counts;
  size_t begin = 0, end = 0;
};
// Cuts one worker's consecutive sequences (ids[i] with counts[i] rows, from row `first` on) into APPEND_KV messages of
// at most max_rows rows (at least 1): whole sequences go together; a longer one is cut into pieces, appended in order
// (a worker takes a sequence's tokens across messages as it does across steps).
std::vector<AppendChunk> chunk_appends(const std::vector<uint64_t>& ids, const std::vector<uint32_t>& counts, size_t first,
                                       size_t max_rows);

class RWorkerClient {
 public:
  RWorkerClient(std::vector<std::string> endpoints, int timeout_ms, int io_threads = 2);
  RWorkerClient(std::vector<std::string> endpoints, const RWorkerClientOptions& o);
  ~RWorkerClient();

  size_t size() const { return socks_.size(); }
  const std::string& endpoint(size_t w) const { return endpoints_.at(w); }
  void set_timeout_ms(int ms) { timeout_ms_ = ms; }
  // Worker w's shared-memory lane: whether it is in use, why not, what went through it.
  ShmLaneStats shm_stats(size_t w) const;
  // Worker w's region while its lane is active, else null. Its replies land there: the S-Part may register it with its
  // device (SPart::register_host). Holding it keeps the mapping alive, past the lane's end.
  std::shared_ptr<const shm::Region> shm_region(size_t w) const;
  // A block of `bytes` in worker w's region for the caller to fill and send from (ShmBlock), or an empty one when w's
  // lane is not active or the region has no free block that large (then send from the caller's own memory).
  ShmBlock shm_alloc(size_t w, size_t bytes);
  // Whether worker w is known gone (its connection dropped or refused, or mark_dead).
  bool lost(size_t w) const { return !lost_.at(w).empty(); }
  // Stops using worker w: its socket is closed (queued requests dropped), waits no longer include it. Idempotent.
  void mark_dead(size_t w, const std::string& why);
  // Collects (and drops) the replies of every request sent to a live worker and not yet waited for, up to
  // timeout_ms: after a failed step, so that no stale reply is left. Lost workers are skipped.
  void drain(int timeout_ms);

  // Sends a request (h.request_id and h.n_frames are filled in). Returns the request id. A request over the worker's
  // largest message (its HELLO's max_message_bytes) throws fd::Error naming the worker, and nothing is sent.
  uint64_t send(size_t w, proto::Header h, const std::vector<ConstBuffer>& frames);
  // Waits for the replies to (worker, request id) pairs, in that order. Throws on ERROR replies (after
  // collecting every reply, so no reply is left behind) or when the deadline passes.
  std::vector<RWorkerReply> wait(const std::vector<std::pair<size_t, uint64_t>>& requests, int timeout_ms = -1);
  RWorkerReply call(size_t w, const proto::Header& h, const std::vector<ConstBuffer>& frames = {});

  // Bytes of K and V one APPEND_KV to worker w may carry: `chunk`, and at most a quarter of the worker's largest
  // message (HELLO's max_message_bytes, once known): room for the ids and counts, and the worker's intake budget
  // (twice the largest message) holds the few appends it queues per connection (server.h, kRouterRcvHwm).
  size_t append_bytes(size_t w, size_t chunk) const {
    return max_message_.at(w) > 0 && max_message_[w] / 4 < chunk ? max_message_[w] / 4 : chunk;
  }

  // Convenience requests (synchronous).
  json hello(size_t w, int n_layers, int n_heads, int n_kv_heads, int head_dim, proto::WireDType dtype);
  void add_seqs(size_t w, const std::vector<uint64_t>& ids);
  void free_seqs(size_t w, const std::vector<uint64_t>& ids);
  // FREE_SEQ without waiting: returns the request id for wait(); `ids` over ConstBuffer::kCopyBytes must stay alive
  // until then (zero-copy send).
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
  // Per worker: its region and allocator, and the spaces of its requests in flight through it.
  struct ShmLane {
    std::shared_ptr<shm::Space> space;  // set from the offer until the lane is refused or the worker dropped
    uint64_t attach_id = 0;             // the SHM_ATTACH request, while pending
    bool active = false;
    struct InFlight {
      std::vector<uint64_t> blocks;  // request frames copied into the region (freed when the reply arrives)
      uint64_t reply_block = 0;      // the reply's space (freed with the reply's frames, or at once when unused)
      shm::Span reply;
    };
    std::map<uint64_t, InFlight> inflight;  // by request id
    shm::RingEnd requests, replies;         // this client's ends of the region's rings, while active
    ShmLaneStats stats;
  };
  // Queues a message's header frame without waiting; a connection that takes none is lost (RWorkerLost).
  void send_head(size_t w, const std::array<uint8_t, proto::kHeaderBytes>& head, bool more);
  void offer_shm(size_t w);                          // the first message to w: SHM_ATTACH, when asked for
  bool send_shm(size_t w, proto::Header& h, const std::vector<ConstBuffer>& frames);  // false: use ZeroMQ
  bool take_attach_reply(size_t w, const std::vector<zmq::message_t>& parts);  // true: it was SHM_ATTACH's
  // A reply to a request sent through the region: its request space is given back, and a reply in the region
  // (kFlagShm) becomes [header without the flag][views of its frames], checked to lie in the space set aside for it.
  void resolve_shm_reply(size_t w, std::vector<zmq::message_t>& parts);
  void release_shm(size_t w, uint64_t request_id, bool reply_in_use);
  void drop_shm(size_t w, const std::string& why);  // the worker is gone, or its session closed: the lane ends

  std::optional<RWorkerReply> receive(size_t w);  // nullopt when nothing is queued
  // A reply's parts (from the socket or a ring) checked and decoded.
  RWorkerReply accept(size_t w, std::vector<zmq::message_t>& parts);
  // Takes the replies in the reply rings of `ws` (stashed when awaited); their polling words set or cleared first
  // (spinning: -1 leaves them). Returns how many it took.
  size_t take_ring_replies(const std::vector<size_t>& ws, int spinning);
  std::string who(size_t w) const;
  void poll_monitors();  // records workers whose connection dropped or whose handshake failed
  [[noreturn]] void throw_lost(const std::vector<size_t>& ws) const;

  zmq::context_t ctx_;
  std::vector<std::string> endpoints_;
  std::vector<zmq::socket_t> socks_;
  std::vector<zmq::socket_t> monitors_;  // per worker: its DEALER's connection events
  std::vector<std::string> lost_;        // per worker: why it is gone ("" while it is not)
  std::vector<bool> dead_;               // per worker: marked dead (socket closed)
  std::vector<size_t> max_message_;      // per worker: the largest request it takes (from its HELLO; 0: unknown)
  std::vector<uint64_t> zmq_sent_;       // per worker: messages sent over ZeroMQ (a ring request carries the count)
  int timeout_ms_;
  int spin_us_ = 0;  // RWorkerClientOptions::spin_us
  uint64_t next_id_ = 1;
  std::map<std::pair<size_t, uint64_t>, RWorkerReply> stash_;  // replies received while waiting for others
  std::set<std::pair<size_t, uint64_t>> outstanding_;          // sent, reply not yet waited for
  size_t shm_bytes_ = 0;
  std::vector<ShmLane> shm_;  // per worker
};

}  // namespace fd
