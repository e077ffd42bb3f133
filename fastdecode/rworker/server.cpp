#include "fastdecode/rworker/server.h"

#include <omp.h>
#include <sched.h>

#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "fastdecode/core/clock.h"
#include "fastdecode/wire/shm.h"

namespace fd {

void pin_openmp_threads(const std::vector<int>& cpus, int n_threads) {
  if (cpus.empty()) return;
  int failures = 0, err = 0;
#pragma omp parallel num_threads(n_threads) reduction(+ : failures) reduction(max : err)
  {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpus[size_t(omp_get_thread_num()) % cpus.size()], &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) ++failures, err = errno;
  }
  if (failures) {
    std::string list;
    for (int c : cpus) {
      if (!list.empty()) list += ',';
      list += std::to_string(c);
    }
    FD_THROW("could not pin " << failures << " of " << n_threads << " compute threads to CPUs " << list
                              << " (--cpus): " << std::strerror(err) << "; this machine has "
                              << sysconf(_SC_NPROCESSORS_ONLN) << " CPUs online");
  }
}

namespace {

// The ZAP handler of a CURVE server (RFC 27): admits a connection when the client's public key is one of `keys`.
// Runs on its own thread over the context's inproc://zeromq.zap.01 until `stop`.
void zap_handler(zmq::socket_t& rep, const std::set<std::string>& keys, const std::atomic<bool>& stop,
                 std::atomic<uint64_t>* refused) {
  while (!stop) {
    zmq::pollitem_t item{rep.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(100));
    if (!(item.revents & ZMQ_POLLIN)) continue;
    std::vector<zmq::message_t> req;
    if (!zmq::recv_multipart(rep, std::back_inserter(req))) continue;
    // version, request id, domain, address, routing id, mechanism, credentials (the client's 32-byte public key)
    bool ok = false;
    if (req.size() >= 7 && req[5].to_string() == "CURVE" && req[6].size() == 32) {
      char z85[41] = {};
      zmq_z85_encode(z85, static_cast<const uint8_t*>(req[6].data()), 32);
      ok = keys.count(z85) > 0;
    }
    if (!ok && refused) ++*refused;
    const std::string id = req.size() >= 2 ? req[1].to_string() : std::string();
    std::vector<zmq::message_t> rep_msg;
    rep_msg.emplace_back(std::string("1.0"));
    rep_msg.emplace_back(id);
    rep_msg.emplace_back(std::string(ok ? "200" : "400"));
    rep_msg.emplace_back(std::string(ok ? "OK" : "client key not admitted"));
    rep_msg.emplace_back(std::string());
    rep_msg.emplace_back(std::string());
    zmq::send_multipart(rep, rep_msg);
  }
}

void set_int(zmq::socket_t& s, int opt, int v) {
  if (zmq_setsockopt(s.handle(), opt, &v, sizeof v) != 0) FD_THROW("zmq_setsockopt(" << opt << "): " << zmq_strerror(zmq_errno()));
}

std::vector<zmq::message_t> loop_error(const proto::Header& req, proto::ErrorCode code, const std::string& text) {
  std::vector<zmq::message_t> reply;
  const auto head = proto::encode_header(proto::reply_header(req, proto::MsgType::Error, 1, int32_t(code)));
  reply.emplace_back(head.data(), head.size());
  reply.emplace_back(text.data(), text.size());
  return reply;
}

// A peer's shared-memory region and this loop's ends of its rings (fastdecode/wire/shm.h): the requests it takes, the
// replies it puts, and the requests taken from the ring that wait for a ZeroMQ message the client sent before them.
struct PeerRegion {
  std::shared_ptr<shm::Region> region;
  shm::RingEnd requests, replies;
  std::deque<shm::RingMessage> waiting;
  explicit PeerRegion(std::shared_ptr<shm::Region> r)
      : region(std::move(r)), requests(region->base(), shm::Ring::Requests), replies(region->base(), shm::Ring::Replies) {}
};

// SHM_ATTACH: the region is mapped for this peer (replacing one it had) after every check of shm::Region::open.
std::vector<zmq::message_t> shm_attach(const RouterLoop& loop, std::map<std::string, PeerRegion>& regions,
                                       const std::string& peer, const proto::Frame* frames, size_t n, const proto::Header& req) {
  try {
    proto::Limits lim;
    lim.max_message_bytes = loop.max_message_bytes;
    const proto::Message m = proto::decode(frames, n, lim);
    std::shared_ptr<shm::Region> r = shm::Region::open(shm::parse_attach(m.frames[0]), loop.shm_max_bytes);
    regions.erase(peer);
    regions.emplace(peer, PeerRegion(std::move(r)));
  } catch (const proto::ProtocolError& e) {
    if (loop.counters) ++loop.counters->shm_refused;
    return loop_error(req, e.code(), e.what());
  }
  if (loop.counters) ++loop.counters->shm_attached;
  std::vector<zmq::message_t> reply;
  const auto head = proto::encode_header(proto::reply_header(req, proto::MsgType::Ok, 0));
  reply.emplace_back(head.data(), head.size());
  return reply;
}

// A request whose frames lie in the peer's region: resolved, handed to `handle`, its reply put in the region when
// it fits the space the client set aside. `parts` = header, descriptor (routing id stripped).
std::vector<zmq::message_t> shm_request(const RouterLoop& loop, const shm::Region& region, const std::string& peer,
                                        const proto::Frame* parts, size_t n_parts, proto::Header req) {
  const proto::MsgType type = req.msg_type();
  shm::Descriptor d;
  std::vector<std::vector<uint8_t>> ctl;  // ids (and APPEND_KV's counts), copied out of the region
  std::vector<proto::Frame> frames;
  proto::Header plain = req;
  plain.flags &= uint8_t(~proto::kFlagShm);
  const auto head = proto::encode_header(plain);
  try {
    if (type != proto::MsgType::Attend && type != proto::MsgType::AppendKV)
      throw proto::ProtocolError(proto::ErrorCode::Malformed, std::string(proto::msg_type_name(type)) +
                                                                  " cannot come through shared memory (ATTEND and APPEND_KV only)");
    if (n_parts != 2)
      throw proto::ProtocolError(proto::ErrorCode::Malformed, "a message in shared memory has one descriptor frame after its "
                                                              "header, not " + std::to_string(n_parts - 1));
    d = shm::parse_descriptor(parts[1], req.n_frames, region.size());
    // A reply space too small for ATTEND_REPLY's o is the client's error: refused before the KV changes, as every
    // error is (an OK sent back over ZeroMQ instead would hide the client's bug).
    if (type == proto::MsgType::Attend) {
      const uint64_t o = uint64_t(req.n_seq) * req.n_heads * req.head_dim * (req.dtype == uint8_t(proto::WireDType::F32) ? 4 : 2);
      if (d.reply.size < o)
        throw proto::ProtocolError(proto::ErrorCode::Malformed, "shared-memory reply space of " + std::to_string(d.reply.size) +
                                                                    " bytes; ATTEND_REPLY's o needs " + std::to_string(o));
    }
    uint64_t total = 0;
    for (const shm::Span& s : d.frames) total += s.size;  // each <= the region's size, and at most 255 of them
    if (total > loop.max_message_bytes)
      throw proto::ProtocolError(proto::ErrorCode::TooLarge, "message of " + std::to_string(total) + " bytes in shared memory, over the " +
                                                                 std::to_string(loop.max_message_bytes) + "-byte limit");
    // The client can write its region at any time: what the handler checks, then uses as sizes or indices (ids,
    // APPEND_KV's counts) is read from a private copy; tensor frames are only ever read as values.
    const size_t n_ctl = std::min(d.frames.size(), type == proto::MsgType::Attend ? size_t(1) : size_t(2));
    frames.push_back({head.data(), head.size()});
    for (size_t i = 0; i < d.frames.size(); ++i) {
      const uint8_t* p = region.base() + d.frames[i].offset;
      if (i < n_ctl) {
        ctl.emplace_back(p, p + d.frames[i].size);
        p = ctl.back().data();
      }
      frames.push_back({p, size_t(d.frames[i].size)});
    }
  } catch (const proto::ProtocolError& e) {
    if (loop.counters) ++loop.counters->shm_bad;
    std::vector<zmq::message_t> reply = loop_error(req, e.code(), e.what());
    if (loop.on_refused) loop.on_refused(reply);
    return reply;
  }
  if (loop.counters) ++loop.counters->shm_requests;
  std::vector<zmq::message_t> reply = loop.handle(peer, frames.data(), frames.size());
  if (reply.size() < 2 || reply[0].size() != proto::kHeaderBytes) return reply;
  proto::Header rh;
  std::memcpy(&rh, reply[0].data(), proto::kHeaderBytes);
  uint64_t total = 0;
  for (size_t i = 1; i < reply.size(); ++i) total += reply[i].size();
  if (rh.msg_type() == proto::MsgType::Error || total > d.reply.size) return reply;  // over ZeroMQ: the client copes
  shm::Descriptor out;
  out.reply = {shm::kRegionHeaderBytes, 0};  // a reply asks for no space
  uint64_t at = d.reply.offset;
  for (size_t i = 1; i < reply.size(); ++i) {
    if (reply[i].size()) std::memcpy(region.base() + at, reply[i].data(), reply[i].size());
    out.frames.push_back({at, reply[i].size()});
    at += reply[i].size();
  }
  rh.flags |= proto::kFlagShm;
  rh.n_frames = uint8_t(reply.size() - 1);
  const auto rhead = proto::encode_header(rh);
  const std::vector<uint8_t> desc = shm::encode_descriptor(out);
  std::vector<zmq::message_t> r;
  r.emplace_back(rhead.data(), rhead.size());
  r.emplace_back(desc.data(), desc.size());
  if (loop.counters) ++loop.counters->shm_replies;
  return r;
}

}  // namespace

void run_router_loop(const RouterLoop& loop) {
  zmq::context_t ctx(loop.io_threads);
  zmq::socket_t sock(ctx, zmq::socket_type::router);
  sock.set(zmq::sockopt::linger, 0);
  sock.set(zmq::sockopt::maxmsgsize, int64_t(loop.max_message_bytes));
  sock.set(zmq::sockopt::router_mandatory, 0);
  // At most kRouterRcvHwm complete messages queued per connection: past them libzmq stops reading that connection's
  // socket, and a client that sends faster (a prefill's appends) waits in TCP and its own send queue, not in this
  // worker's memory. A client keeps every message within a quarter of the largest (RWorkerClient::append_bytes), so
  // one connection holds at most (2 queued + 1 arriving) / 4 of --max-message-mb: within the intake budget (intake.h).
  sock.set(zmq::sockopt::rcvhwm, kRouterRcvHwm);
  if (loop.heartbeat_ms > 0) {
    set_int(sock, ZMQ_HEARTBEAT_IVL, loop.heartbeat_ms);
    set_int(sock, ZMQ_HEARTBEAT_TIMEOUT, std::max(loop.heartbeat_timeout_ms, loop.heartbeat_ms));
  }
  // CURVE: the ZAP handler is bound before the socket listens, so no connection is admitted unchecked.
  std::atomic<bool> zap_stop{false};
  std::unique_ptr<zmq::socket_t> zap;
  std::thread zap_thread;
  if (!loop.curve.secret_z85.empty()) {
    if (loop.curve_clients.empty()) FD_THROW("CURVE server without any admitted client key");
    zap = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::rep);
    zap->set(zmq::sockopt::linger, 0);
    zap->bind("inproc://zeromq.zap.01");
    set_int(sock, ZMQ_CURVE_SERVER, 1);
    sock.set(zmq::sockopt::curve_secretkey, loop.curve.secret_z85);
    const std::set<std::string> keys(loop.curve_clients.begin(), loop.curve_clients.end());
    zap_thread = std::thread([&, keys] { zap_handler(*zap, keys, zap_stop, loop.curve_refused); });
  }
  struct ZapJoin {  // the ZAP thread ends with the loop, however it ends
    std::atomic<bool>& stop;
    std::thread& t;
    ~ZapJoin() {
      stop = true;
      if (t.joinable()) t.join();
    }
  } zap_join{zap_stop, zap_thread};
  RouterCounters own_counters;
  RouterCounters& counters = loop.counters ? *loop.counters : own_counters;
  const auto log = [&](const std::string& line) {
    if (loop.log) loop.log(line);
  };
  // The connections (from the socket's ACCEPTED / DISCONNECTED events) and the intake guard, before the socket listens.
  IntakeOptions intake = loop.intake;
  intake.curve = !loop.curve.secret_z85.empty();
  Connections conns(ctx, sock, intake, &counters, loop.log);
  counters.budget_bytes = intake.budget_bytes, counters.rss_bound_bytes = conns.rss_bound(), counters.base_rss_bytes = conns.base_rss();
  std::map<std::string, PeerRegion> regions;  // per peer: the shared-memory region it attached, and its rings
  std::map<std::string, uint64_t> zmq_taken;  // per peer: messages taken from its connection (the rings' order)
  std::vector<std::string> gone;
  const auto drain_connections = [&] {
    gone.clear();
    conns.drain(&gone);
    for (const auto& p : gone) {
      regions.erase(p);
      zmq_taken.erase(p);
      if (loop.on_disconnect) loop.on_disconnect(p);
    }
  };
  try {
    sock.bind(loop.listen);
  } catch (const zmq::error_t& e) {
    FD_THROW("cannot listen on " << loop.listen << ": " << e.what());
  }
  if (loop.on_bound) loop.on_bound(sock.get(zmq::sockopt::last_endpoint));

  std::vector<zmq::message_t> parts;
  std::vector<proto::Frame> frames;
  const auto recv_one = [&](zmq::message_t& m) {
    for (;;) {
      try {
        // The rest of a multipart message is already queued (libzmq delivers whole messages): no wait here.
        return bool(sock.recv(m, zmq::recv_flags::none));
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) throw;
      }
    }
  };
  // Reply: routing id, then the frames. A peer that vanished (or whose pipe is full) just loses its reply.
  const auto send_routed = [&](zmq::message_t& routing_id, std::vector<zmq::message_t>& reply) {
    try {
      if (!sock.send(routing_id, zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return false;
      for (size_t i = 0; i < reply.size(); ++i)
        if (!sock.send(reply[i], (i + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none) | zmq::send_flags::dontwait))
          return false;
      return true;
    } catch (const zmq::error_t&) {
      return false;
    }
  };
  const auto send_reply = [&](std::vector<zmq::message_t>& reply) { return send_routed(parts[0], reply); };
  // A reply to a request that came through a ring goes to its peer by routing id.
  const auto send_to = [&](const std::string& peer, std::vector<zmq::message_t>& reply) {
    zmq::message_t rid(peer.data(), peer.size());
    return send_routed(rid, reply);
  };
  int64_t wait_from = now_ns();  // when the loop last became free to take a request
  // One request taken from a peer's ring: resolved and handled as the same request over ZeroMQ would be
  // (shm_request); its reply into the reply ring while the client polls for it, else over ZeroMQ.
  const auto serve_ring_message = [&](const std::string& peer, PeerRegion& pr, const shm::RingMessage& m) {
    proto::Header req{};
    std::memcpy(&req, m.head.data(), proto::kHeaderBytes);
    const int64_t t_taken = now_ns();
    if (req.magic != proto::kMagic) {  // no header to answer: dropped, as a message without one is
      ++counters.shm_bad;
      log("dropped a request from a shared-memory ring without this protocol's header");
      return;
    }
    std::vector<zmq::message_t> reply;
    try {
      ++counters.ring_requests;
      if (!(req.flags & proto::kFlagShm) || req.version < 3) {
        ++counters.shm_bad;
        reply = loop_error(req, proto::ErrorCode::Malformed, "a shared-memory ring carries only requests whose frames lie in the region");
        if (loop.on_refused) loop.on_refused(reply);
      } else {
        const std::shared_ptr<shm::Region> keep = pr.region;  // mapped until this request is answered
        const proto::Frame parts2[2] = {{m.head.data(), m.head.size()}, {m.desc.data(), m.desc.size()}};
        reply = shm_request(loop, *keep, peer, parts2, 2, req);
      }
      const int64_t t_handled = now_ns();
      bool in_ring = false;
      if (reply.size() == 2 && reply[0].size() == proto::kHeaderBytes && reply[1].size() <= shm::kSlotDescBytes &&
          (static_cast<const uint8_t*>(reply[0].data())[offsetof(proto::Header, flags)] & proto::kFlagShm) &&
          pr.replies.taker_spinning()) {
        std::array<uint8_t, proto::kHeaderBytes> head;
        std::memcpy(head.data(), reply[0].data(), head.size());
        const auto* d = static_cast<const uint8_t*>(reply[1].data());
        in_ring = pr.replies.put(head, std::vector<uint8_t>(d, d + reply[1].size()), 0) == shm::RingEnd::Put::Published;
        if (in_ring) ++counters.ring_replies;
      }
      if (!in_ring && !send_to(peer, reply)) {
        ++counters.replies_lost;
        log("a reply could not be sent (its peer is gone or takes no more)");
      }
      if (req.msg_type() == proto::MsgType::Attend) {
        ++counters.attend_loop_requests;
        counters.attend_wait_ns += uint64_t(std::max<int64_t>(0, t_taken - wait_from));
        counters.attend_handle_ns += uint64_t(t_handled - t_taken);
        counters.attend_send_ns += uint64_t(now_ns() - t_handled);
      }
    } catch (const std::exception& e) {
      ++counters.peer_faults;
      log("dropped a message whose handling failed: " + peer_text(std::string(e.what()), 400));
      reply = loop_error(req, proto::ErrorCode::Internal, "the worker could not handle this request: " + peer_text(std::string(e.what()), 400));
      if (!send_to(peer, reply)) ++counters.replies_lost;
    }
    wait_from = now_ns();
  };
  // A peer's ring: every request published in turn is taken; those the client sent after a ZeroMQ message this loop has
  // not taken yet wait for it (the client's order holds whichever way each request came). Returns how many it served.
  // At most kRingWaiting wait: a client that claims more ZeroMQ messages before its ring requests than it sent (its
  // bug, or a hostile one) fills its own ring, and then goes over ZeroMQ, instead of growing this loop's memory.
  constexpr size_t kRingWaiting = 4 * shm::kRingSlots;
  const auto serve_ring = [&](const std::string& peer, PeerRegion& pr) {
    std::vector<shm::RingMessage> got;
    if (pr.waiting.size() < kRingWaiting) pr.requests.take(got, kRingWaiting - pr.waiting.size());
    for (auto& m : got) pr.waiting.push_back(std::move(m));
    counters.ring_waiting_max = std::max<uint64_t>(counters.ring_waiting_max, pr.waiting.size());
    const uint64_t taken = zmq_taken[peer];
    size_t n = 0;
    while (!pr.waiting.empty() && pr.waiting.front().zmq_before <= taken) {
      const shm::RingMessage m = std::move(pr.waiting.front());
      pr.waiting.pop_front();
      serve_ring_message(peer, pr, m);
      ++n;
    }
    return n;
  };
  const auto serve_rings = [&] {
    size_t n = 0;
    for (auto& [peer, pr] : regions) n += serve_ring(peer, pr);
    return n;
  };
  while (!loop.done()) {
    zmq::pollitem_t item{sock.handle(), 0, ZMQ_POLLIN, 0};
    try {
      bool ready = false;
      if (loop.spin_us > 0) {  // spin_us: poll without sleeping for a while after the loop became free
        // While it polls, the clients with a region may ring it through their region's request ring (no I/O thread
        // between them); their word cleared, the ring is looked at once more (what was put as it was cleared), and
        // only then does the loop block.
        for (auto& [p, pr] : regions) pr.requests.set_spinning(true);
        while (!ready && now_ns() < wait_from + int64_t(loop.spin_us) * 1000) {
          ready = zmq::poll(&item, 1, std::chrono::milliseconds(0)) > 0;
          if (!ready && !regions.empty()) serve_rings();  // each request served moves wait_from on
        }
        if (!ready) {
          for (auto& [p, pr] : regions) pr.requests.set_spinning(false);
          if (serve_rings() > 0) continue;
        }
      }
      if (!ready) zmq::poll(&item, 1, std::chrono::milliseconds(100));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      throw;  // the loop's own fault (its context terminated): the worker stops
    }
    drain_connections();  // a connection's end before any later message: a new connection may reuse its descriptor
    if (!(item.revents & ZMQ_POLLIN)) continue;
    const int64_t t_ready = now_ns();
    parts.clear();
    proto::Header req{};
    bool ours = false;
    try {
      // Frame by frame: the running total is checked as each frame comes; past the limit the frames are dropped
      // as they are received (only the header is kept, to address the reply).
      zmq::message_t m;
      if (!recv_one(m)) continue;
      bool more = m.more();
      parts.push_back(std::move(m));  // the routing id
      size_t held = 0, seen = 0, n_frames = 0;
      uint64_t wire = 0;
      bool over = false;
      int fd = -1;
      while (more) {
        zmq::message_t f;
        if (!recv_one(f)) break;
        more = f.more();
        ++n_frames;
        seen += f.size();
        wire += wire_bytes_of_frame(f.size(), intake.curve);
        // The connection it came by (libzmq's metadata; none from a ZMTP 1.0 / 2.0 peer: zmq_msg_get fails).
        if (fd < 0) fd = zmq_msg_get(f.handle(), ZMQ_SRCFD);
        if (over) continue;  // dropped here: never held beside the others
        if (held + f.size() > loop.max_message_bytes || n_frames > kMaxRequestFrames) {
          over = true;
          parts.resize(std::min<size_t>(parts.size(), 2));  // routing id and header only
          continue;
        }
        held += f.size();
        parts.push_back(std::move(f));
        counters.max_bytes_held = std::max(counters.max_bytes_held, held);
      }
      if (n_frames == 0) continue;  // a routing id alone: nothing to answer
      const std::string peer = parts[0].to_string();
      if (fd < 0) {
        // Not a connection the loop can track (its end, its bytes): its message is dropped, unanswered.
        ++counters.untracked_dropped;
        log("dropped a message of " + std::to_string(n_frames) + " frame(s), " + std::to_string(seen) +
            " bytes, from a peer that did not speak ZMTP 3 (a ZMTP 1.0 / 2.0 client, or bytes that are not ZeroMQ)");
        continue;
      }
      conns.delivered(fd, peer, wire);
      // What the client put in its ring before this message comes first (the rings' order).
      if (const auto pr = regions.find(peer); pr != regions.end()) serve_ring(peer, pr->second);
      ++zmq_taken[peer];
      ours = parts.size() >= 2 && parts[1].size() == proto::kHeaderBytes &&
             (std::memcpy(&req, parts[1].data(), proto::kHeaderBytes), req.magic == proto::kMagic);
      std::vector<zmq::message_t> reply;
      const bool attend = ours && req.msg_type() == proto::MsgType::Attend;
      const int64_t t_received = now_ns();
      if (over) {
        ++counters.refused_too_large;
        const bool too_many = n_frames > kMaxRequestFrames;
        const std::string text =
            too_many ? "message of " + std::to_string(n_frames) + " frames: at most " + std::to_string(kMaxRequestFrames)
                     : "message of at least " + std::to_string(seen) + " bytes over the " + std::to_string(loop.max_message_bytes) +
                           "-byte limit (refused as its frames arrived)";
        const auto head = proto::encode_header(proto::reply_header(
            req, proto::MsgType::Error, 1, int32_t(too_many ? proto::ErrorCode::Malformed : proto::ErrorCode::TooLarge)));
        reply.emplace_back(head.data(), head.size());
        reply.emplace_back(text.data(), text.size());
        if (loop.on_refused) loop.on_refused(reply);
      } else {
        frames.clear();
        for (size_t i = 1; i < parts.size(); ++i)
          frames.push_back({static_cast<const uint8_t*>(parts[i].data()), parts[i].size()});
        const auto region = ours ? regions.find(peer) : regions.end();
        conns.handling(held);
        struct Handled {  // the request is no longer held, however its handling ends
          Connections& c;
          ~Handled() { c.handling(0); }
        } handled{conns};
        if (ours && req.msg_type() == proto::MsgType::ShmAttach && req.version >= 3) {  // version 2 has no SHM_ATTACH
          reply = shm_attach(loop, regions, peer, frames.data(), frames.size(), req);
        } else if (ours && (req.flags & proto::kFlagShm) && req.version >= 3 && region != regions.end()) {
          const std::shared_ptr<shm::Region> keep = region->second.region;  // mapped until this request is answered
          reply = shm_request(loop, *keep, peer, frames.data(), frames.size(), req);
        } else {  // a flagged message without a region: decode() refuses it (malformed), as it does any bad header
          reply = loop.handle(peer, frames.data(), frames.size());
        }
        if (ours && req.msg_type() == proto::MsgType::Close) regions.erase(peer);  // the session ends, and its region
      }
      const int64_t t_handled = now_ns();
      if (!send_reply(reply)) {
        ++counters.replies_lost;
        log("a reply could not be sent (its peer is gone or takes no more)");
      }
      if (attend) {
        const int64_t t_sent = now_ns();
        ++counters.attend_loop_requests;
        counters.attend_wait_ns += uint64_t(std::max<int64_t>(0, t_ready - wait_from));
        counters.attend_receive_ns += uint64_t(t_received - t_ready);
        counters.attend_handle_ns += uint64_t(t_handled - t_received);
        counters.attend_send_ns += uint64_t(t_sent - t_handled);
      }
      wait_from = now_ns();
      // What the client put in its ring after this message and before it was answered.
      if (const auto pr = regions.find(peer); pr != regions.end()) serve_ring(peer, pr->second);
    } catch (const std::exception& e) {
      // A peer's message made a ZeroMQ call or the handler fail: that message is dropped and the loop goes on. A
      // request with our header is answered ERROR internal, so that a client waiting for it is not left waiting.
      ++counters.peer_faults;
      log("dropped a message whose handling failed: " + peer_text(std::string(e.what()), 400));
      if (ours && !parts.empty()) {
        std::vector<zmq::message_t> reply =
            loop_error(req, proto::ErrorCode::Internal, "the worker could not handle this request: " + peer_text(std::string(e.what()), 400));
        if (!send_reply(reply)) ++counters.replies_lost;
      }
    }
  }
  zmq_socket_monitor(sock.handle(), nullptr, 0);
}

void run_rworker_server(RWorkerService& service, const RWorkerServerOptions& opt, const std::atomic<bool>* stop,
                        const std::function<void(const std::string&)>& on_bound) {
  RouterLoop loop;
  loop.listen = opt.listen;
  loop.io_threads = opt.io_threads;
  loop.max_message_bytes = service.config().limits.max_message_bytes;
  loop.on_bound = on_bound;
  // Polled every 100 ms: a worker whose parent is gone (re-parented, so getppid() changed) stops by itself.
  loop.done = [&] {
    return service.shutdown_requested() || (stop && stop->load()) || (opt.parent_pid > 0 && long(getppid()) != opt.parent_pid) ||
           (opt.serve_once && service.sessions_ended() > 0);
  };
  // Error lines are rate-limited (a client chooses how many bad requests it sends); --verbose logs every one. The
  // guard's thread logs through the same limiter.
  std::mutex log_mu;
  LogLimiter limiter(opt.verbose ? 0 : opt.log_errors_per_s);
  const auto log_line = [&](const std::string& line) {
    std::lock_guard<std::mutex> lk(log_mu);
    std::string summary;
    if (!limiter.allow(now_ns(), &summary)) return;
    if (!summary.empty()) std::fprintf(stderr, "%s: %s\n", service.config().name.c_str(), summary.c_str());
    std::fprintf(stderr, "%s: %s\n", service.config().name.c_str(), line.c_str());
  };
  const auto log_error = [&](const std::vector<zmq::message_t>& reply) {
    proto::Header h;
    std::memcpy(&h, reply[0].data(), proto::kHeaderBytes);
    if (h.msg_type() != proto::MsgType::Error || reply.size() < 2) return;
    log_line(std::string("ERROR (") + proto::error_code_name(proto::ErrorCode(h.status)) + ") to request " +
             std::to_string(h.request_id) + ": " + peer_text(reply[1].data(), reply[1].size(), 400));
  };
  RouterCounters counters;
  service.set_router_counters(&counters);
  struct Detach {  // the counters end with this call
    RWorkerService& s;
    ~Detach() { s.set_router_counters(nullptr); }
  } detach{service};
  loop.counters = &counters;
  loop.log = log_line;
  const size_t max_message = service.config().limits.max_message_bytes;
  loop.intake.budget_bytes = opt.intake_bytes > 0 ? opt.intake_bytes : 2 * max_message;
  loop.intake.memory_limit_bytes = service.config().memory_limit_bytes;
  loop.intake.max_message_bytes = max_message;
  loop.intake.max_connections = opt.max_connections;
  loop.handle = [&](const std::string& peer, const proto::Frame* frames, size_t n) {
    std::vector<zmq::message_t> reply = service.handle(peer, frames, n);
    log_error(reply);
    return reply;
  };
  loop.on_disconnect = [&](const std::string& peer) { service.end_session(peer); };
  loop.heartbeat_ms = opt.heartbeat_ms;
  loop.heartbeat_timeout_ms = opt.heartbeat_timeout_ms;
  loop.curve = opt.curve;
  loop.curve_clients = opt.curve_clients;
  loop.on_refused = log_error;
  loop.shm_max_bytes = opt.shm_max_bytes;
  loop.spin_us = opt.spin_us;
  run_router_loop(loop);
  const uint64_t cuts = counters.cut_intake + counters.cut_rss + counters.cut_connections;
  if (counters.untracked_dropped + counters.peer_faults + counters.replies_lost + cuts > 0)
    std::fprintf(stderr,
                 "%s: from its peers: %llu messages dropped (not ZMTP 3), %llu dropped (their handling failed), %llu replies "
                 "lost, %llu connections cut (intake %llu, resident memory %llu, connections %llu)\n",
                 service.config().name.c_str(), (unsigned long long)counters.untracked_dropped,
                 (unsigned long long)counters.peer_faults, (unsigned long long)counters.replies_lost, (unsigned long long)cuts,
                 (unsigned long long)counters.cut_intake.load(), (unsigned long long)counters.cut_rss.load(),
                 (unsigned long long)counters.cut_connections.load());
}

}  // namespace fd
