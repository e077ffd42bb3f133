#include "fastdecode/wire/rworker_client.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "fastdecode/core/clock.h"

namespace fd {

using proto::Header;
using proto::MsgType;

namespace {
void no_free(void*, void*) {}

}  // namespace

RWorkerClient::RWorkerClient(std::vector<std::string> endpoints, int timeout_ms, int io_threads)
    : RWorkerClient(std::move(endpoints), RWorkerClientOptions{timeout_ms, io_threads, 0, 0, "", {}}) {}

RWorkerClient::RWorkerClient(std::vector<std::string> endpoints, const RWorkerClientOptions& o)
    : ctx_(o.io_threads), endpoints_(std::move(endpoints)), timeout_ms_(o.timeout_ms), spin_us_(o.spin_us), shm_bytes_(o.shm_bytes) {
  FD_CHECK(!endpoints_.empty(), "no R-worker endpoints");
  static std::atomic<uint64_t> clients{0};
  const uint64_t me = clients++;
  for (const auto& ep : endpoints_) {
    zmq::socket_t s(ctx_, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    if (o.heartbeat_ms > 0) {
      const int ivl = o.heartbeat_ms, to = std::max(o.heartbeat_timeout_ms, o.heartbeat_ms);
      zmq_setsockopt(s.handle(), ZMQ_HEARTBEAT_IVL, &ivl, sizeof ivl);
      zmq_setsockopt(s.handle(), ZMQ_HEARTBEAT_TIMEOUT, &to, sizeof to);
    }
    if (!o.curve_server_public.empty()) {
      s.set(zmq::sockopt::curve_serverkey, o.curve_server_public);
      s.set(zmq::sockopt::curve_publickey, o.curve_client.public_z85);
      s.set(zmq::sockopt::curve_secretkey, o.curve_client.secret_z85);
    }
    // Its connection's events: dropped (the worker died, stopped answering heartbeats) or refused at the handshake.
    const std::string mon_ep = "inproc://fd-client-" + std::to_string(me) + "-" + std::to_string(socks_.size());
    if (zmq_socket_monitor(s.handle(), mon_ep.c_str(),
                           ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) != 0)
      FD_THROW("zmq_socket_monitor: " << zmq_strerror(zmq_errno()));
    zmq::socket_t m(ctx_, zmq::socket_type::pair);
    m.set(zmq::sockopt::linger, 0);
    m.connect(mon_ep);
    try {
      s.connect(ep);
    } catch (const zmq::error_t& e) {
      FD_THROW("cannot connect to R-worker at " << ep << ": " << e.what());
    }
    socks_.push_back(std::move(s));
    monitors_.push_back(std::move(m));
  }
  lost_.assign(socks_.size(), "");
  dead_.assign(socks_.size(), false);
  max_message_.assign(socks_.size(), 0);
  zmq_sent_.assign(socks_.size(), 0);
  shm_.resize(socks_.size());
}

RWorkerClient::~RWorkerClient() {
  for (size_t w = 0; w < socks_.size(); ++w)
    if (!dead_[w]) zmq_socket_monitor(socks_[w].handle(), nullptr, 0);
}

std::vector<AppendChunk> chunk_appends(const std::vector<uint64_t>& ids, const std::vector<uint32_t>& counts, size_t first,
                                       size_t max_rows) {
  FD_CHECK(ids.size() == counts.size(), "chunk_appends: " << ids.size() << " ids, " << counts.size() << " counts");
  max_rows = std::max<size_t>(1, max_rows);
  std::vector<AppendChunk> out;
  size_t row = first;
  for (size_t i = 0; i < ids.size(); ++i) {
    for (size_t left = counts[i]; left > 0;) {
      const size_t rows = std::min(left, max_rows);
      if (out.empty() || out.back().end - out.back().begin + rows > max_rows) out.push_back({{}, {}, row, row});
      AppendChunk& a = out.back();
      a.ids.push_back(ids[i]);
      a.counts.push_back(uint32_t(rows));
      a.end = row + rows;
      row += rows;
      left -= rows;
    }
  }
  return out;
}

std::string RWorkerClient::who(size_t w) const { return "R-worker " + std::to_string(w) + " (" + endpoints_[w] + ")"; }

void RWorkerClient::poll_monitors() {
  for (size_t w = 0; w < monitors_.size(); ++w) {
    if (dead_[w]) continue;
    for (;;) {
      zmq::message_t ev, addr;
      if (!monitors_[w].recv(ev, zmq::recv_flags::dontwait)) break;
      if (ev.more()) (void)monitors_[w].recv(addr, zmq::recv_flags::none);
      if (ev.size() < 6 || !lost_[w].empty()) continue;
      uint16_t event = 0;
      std::memcpy(&event, ev.data(), 2);
      lost_[w] = event == ZMQ_EVENT_DISCONNECTED
                     ? "its connection dropped (the process ended, or left heartbeats unanswered)"
                 : event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH
                     ? "it refused this client's CURVE key"
                     : "the connection handshake failed (a CURVE setting that does not match the worker's?)";
    }
  }
}

void RWorkerClient::throw_lost(const std::vector<size_t>& ws) const {
  std::string what;
  for (size_t w : ws) what += (what.empty() ? "" : "; ") + who(w) + " is lost: " + lost_[w];
  throw RWorkerLost(ws, what);
}

void RWorkerClient::mark_dead(size_t w, const std::string& why) {
  if (dead_.at(w)) return;
  if (lost_[w].empty()) lost_[w] = why;
  zmq_socket_monitor(socks_[w].handle(), nullptr, 0);
  socks_[w].close();  // linger 0: requests still queued for it are dropped
  monitors_[w].close();
  dead_[w] = true;
  drop_shm(w, "the worker was marked dead: " + lost_[w]);
  for (auto it = stash_.begin(); it != stash_.end();) it = it->first.first == w ? stash_.erase(it) : std::next(it);
  for (auto it = outstanding_.begin(); it != outstanding_.end();) it = it->first == w ? outstanding_.erase(it) : std::next(it);
}

void RWorkerClient::drain(int timeout_ms) {
  std::vector<std::pair<size_t, uint64_t>> pending;
  for (const auto& r : outstanding_)
    if (!dead_[r.first] && lost_[r.first].empty()) pending.push_back(r);
  if (pending.empty()) return;
  try {
    wait(pending, timeout_ms);
  } catch (const RWorkerLost&) {
    throw;
  } catch (const Error&) {  // an ERROR reply to a request of the failed step: collected, nothing to do with it
  }
}

uint64_t RWorkerClient::send(size_t w, Header h, const std::vector<ConstBuffer>& frames) {
  FD_CHECK(w < socks_.size(), "no R-worker " << w);
  poll_monitors();
  if (!lost_[w].empty()) throw_lost({w});
  offer_shm(w);
  if (max_message_[w] > 0) {  // over the worker's limit it would be refused, or its connection dropped by libzmq
    size_t total = proto::kHeaderBytes;
    for (const auto& f : frames) total += f.size;
    if (total > max_message_[w])
      FD_THROW("a " << proto::msg_type_name(h.msg_type()) << " request of " << total << " bytes to " << who(w)
                    << " is over the largest message it takes, " << max_message_[w]
                    << " bytes (its HELLO's max_message_bytes; fd-rworker --max-message-mb)");
  }
  h.request_id = next_id_++;
  outstanding_.insert({w, h.request_id});
  h.n_frames = uint8_t(frames.size());
  if (send_shm(w, h, frames)) return h.request_id;
  const auto head = proto::encode_header(h);
  send_head(w, head, !frames.empty());
  for (size_t i = 0; i < frames.size(); ++i) {
    // Small frames copied (their buffers are the caller's again at once); large ones zero-copy: libzmq reads the
    // caller's buffer when its I/O thread sends it (ConstBuffer).
    zmq::message_t m = frames[i].size <= ConstBuffer::kCopyBytes
                           ? zmq::message_t(frames[i].data, frames[i].size)
                           : zmq::message_t(const_cast<void*>(frames[i].data), frames[i].size, no_free, nullptr);
    socks_[w].send(m, i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  return h.request_id;
}

std::optional<RWorkerReply> RWorkerClient::receive(size_t w) {
  std::vector<zmq::message_t> parts;
  for (;;) {
    parts.clear();
    if (!zmq::recv_multipart(socks_[w], std::back_inserter(parts), zmq::recv_flags::dontwait)) return std::nullopt;
    if (!take_attach_reply(w, parts)) break;  // the lane's own answer is nobody's reply: take the next message
  }
  return accept(w, parts);
}

RWorkerReply RWorkerClient::accept(size_t w, std::vector<zmq::message_t>& parts) {
  resolve_shm_reply(w, parts);
  // A reply is as untrusted as a request is to the worker: the same decoder checks its header, frame
  // count and every frame's size against the header's dimensions, and it must be a reply type.
  std::vector<proto::Frame> frames;
  for (const auto& p : parts) frames.push_back({static_cast<const uint8_t*>(p.data()), p.size()});
  proto::Limits lim;
  lim.max_message_bytes = SIZE_MAX;  // a reply's size follows from what this client asked for
  lim.max_seqs = UINT32_MAX, lim.max_tokens = UINT32_MAX;
  RWorkerReply r;
  r.recv_ns = now_ns();
  try {
    r.h = proto::decode(frames.data(), frames.size(), lim).h;
  } catch (const proto::ProtocolError& e) {
    FD_THROW(who(w) << " sent a malformed reply: " << e.what());
  }
  switch (r.h.msg_type()) {
    case MsgType::HelloReply:
    case MsgType::AttendReply:
    case MsgType::StatsReply:
    case MsgType::Ok:
    case MsgType::Error:
      break;
    default:
      FD_THROW(who(w) << " sent a " << proto::msg_type_name(r.h.msg_type()) << " message, which is not a reply");
  }
  for (size_t i = 1; i < parts.size(); ++i) r.frames.push_back(std::move(parts[i]));
  return r;
}

std::vector<RWorkerReply> RWorkerClient::wait(const std::vector<std::pair<size_t, uint64_t>>& requests, int timeout_ms) {
  const int64_t deadline = now_ns() + int64_t(timeout_ms >= 0 ? timeout_ms : timeout_ms_) * 1'000'000;
  const auto missing = [&] {
    for (const auto& r : requests)
      if (!stash_.count(r)) return true;
    return false;
  };
  for (const auto& r : requests) FD_CHECK(!dead_.at(r.first), who(r.first) << " was marked dead: nothing to wait for");
  std::vector<zmq::pollitem_t> items;  // the live workers' sockets and their monitors
  std::vector<size_t> live;
  for (size_t w = 0; w < socks_.size(); ++w) {
    if (dead_[w]) continue;
    live.push_back(w);
    items.push_back({socks_[w].handle(), 0, ZMQ_POLLIN, 0});
    items.push_back({monitors_[w].handle(), 0, ZMQ_POLLIN, 0});
  }
  while (missing()) {
    // A worker gone with one of these requests unanswered fails the wait at once, naming it (its replies already
    // queued are taken first: a worker that answered, then exited, is not lost to this wait).
    poll_monitors();
    std::vector<size_t> gone;
    for (const auto& r : requests) {
      if (stash_.count(r) || lost_[r.first].empty() || std::find(gone.begin(), gone.end(), r.first) != gone.end()) continue;
      while (std::optional<RWorkerReply> rep = receive(r.first)) {
        const std::pair<size_t, uint64_t> key{r.first, rep->h.request_id};
        if (outstanding_.count(key)) stash_[key] = std::move(*rep);
      }
      if (!stash_.count(r)) gone.push_back(r.first);
    }
    if (!gone.empty()) throw_lost(gone);
    const int64_t left_ms = (deadline - now_ns()) / 1'000'000;
    if (left_ms <= 0) {  // name every worker that missed: the first one late need not be the dead one
      std::string late;
      std::vector<size_t> ws;
      for (const auto& r : requests)
        if (!stash_.count(r)) {
          late += (late.empty() ? "" : "; ") + who(r.first) + " missed its deadline of " +
                  std::to_string(timeout_ms >= 0 ? timeout_ms : timeout_ms_) + " ms (request " + std::to_string(r.second) + ")";
          if (std::find(ws.begin(), ws.end(), r.first) == ws.end()) ws.push_back(r.first);
        }
      throw RWorkerLost(ws, late);
    }
    try {
      bool ready = false;
      if (spin_us_ > 0) {  // spin_us: poll without sleeping for a while before blocking
        // While polling, the workers with an active lane may answer through its reply ring (no I/O thread between
        // them); the words cleared, the rings are looked at once more (a reply put as they were cleared), and only
        // then does the wait block.
        bool took = take_ring_replies(live, 1) > 0;
        for (const int64_t until = std::min(deadline, now_ns() + int64_t(spin_us_) * 1000); !ready && !took && now_ns() < until;) {
          ready = zmq::poll(items.data(), items.size(), std::chrono::milliseconds(0)) > 0;
          if (!ready) took = take_ring_replies(live, -1) > 0;
        }
        if (take_ring_replies(live, 0) > 0) took = true;  // cleared however the spell ended: none is left set
        if (took && !ready) continue;
      }
      if (!ready) zmq::poll(items.data(), items.size(), std::chrono::milliseconds(std::min<int64_t>(left_ms, 100)));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;
    }
    for (size_t i = 0; i < live.size(); ++i) {
      const size_t w = live[i];
      if (!(items[2 * i].revents & ZMQ_POLLIN)) continue;
      while (std::optional<RWorkerReply> r = receive(w)) {
        const std::pair<size_t, uint64_t> key{w, r->h.request_id};
        if (outstanding_.count(key)) stash_[key] = std::move(*r);  // else a reply nobody waits for (a stale one)
      }
    }
  }
  std::vector<RWorkerReply> out;
  std::string first_error;
  for (const auto& req : requests) {
    auto it = stash_.find(req);
    RWorkerReply r = std::move(it->second);
    stash_.erase(it);
    outstanding_.erase(req);
    if (r.h.msg_type() == MsgType::Error && first_error.empty()) {
      const std::string text = r.frames.empty() ? "" : peer_text(r.frames[0].data(), r.frames[0].size(), 400);
      first_error = who(req.first) + " answered ERROR (" + proto::error_code_name(proto::ErrorCode(r.h.status)) + "): " + text;
    }
    out.push_back(std::move(r));
  }
  if (!first_error.empty()) FD_THROW(first_error);
  return out;
}

void RWorkerClient::send_head(size_t w, const std::array<uint8_t, proto::kHeaderBytes>& head, bool more) {
  // Without waiting: a DEALER whose connection failed its handshake (a CURVE key the worker refuses, or none) has no
  // pipe to queue into, and a blocking send would wait forever. The rest of a message never blocks once its first
  // frame is queued (multipart messages are atomic).
  zmq::message_t hm(head.data(), head.size());
  if (socks_[w].send(hm, (more ? zmq::send_flags::sndmore : zmq::send_flags::none) | zmq::send_flags::dontwait)) {
    ++zmq_sent_[w];  // the message is queued whole once its first frame is (the rings' order counts it now)
    return;
  }
  poll_monitors();
  if (lost_[w].empty()) lost_[w] = "its connection takes no message (the connection handshake failed, or 1000 messages are queued)";
  throw_lost({w});
}

RWorkerReply RWorkerClient::call(size_t w, const Header& h, const std::vector<ConstBuffer>& frames) {
  const uint64_t id = send(w, h, frames);
  return std::move(wait({{w, id}})[0]);
}

json RWorkerClient::hello(size_t w, int n_layers, int n_heads, int n_kv_heads, int head_dim, proto::WireDType dtype) {
  Header h = proto::make_header(MsgType::Hello, n_heads, n_kv_heads, head_dim, dtype);
  h.layer = uint32_t(n_layers);
  RWorkerReply r = call(w, h);
  if (r.h.msg_type() != MsgType::HelloReply || r.frames.size() != 1) FD_THROW(who(w) << ": unexpected reply to HELLO");
  json info = json::parse(std::string(static_cast<const char*>(r.frames[0].data()), r.frames[0].size()));
  // The largest request it takes (older workers do not say: unchecked here, as before).
  if (info.is_object() && info.contains("max_message_bytes") && info["max_message_bytes"].is_number_unsigned())
    max_message_[w] = info["max_message_bytes"].get<size_t>();
  return info;
}

static Header ids_header(MsgType t, size_t n) {
  Header h;
  h.type = uint16_t(t);
  h.n_seq = uint32_t(n);
  return h;
}

void RWorkerClient::add_seqs(size_t w, const std::vector<uint64_t>& ids) {
  call(w, ids_header(MsgType::AddSeq, ids.size()), {{ids.data(), ids.size() * 8}});
}

uint64_t RWorkerClient::send_free_seqs(size_t w, const std::vector<uint64_t>& ids) {
  return send(w, ids_header(MsgType::FreeSeq, ids.size()), {{ids.data(), ids.size() * 8}});
}

void RWorkerClient::free_seqs(size_t w, const std::vector<uint64_t>& ids) {
  call(w, ids_header(MsgType::FreeSeq, ids.size()), {{ids.data(), ids.size() * 8}});
}

json RWorkerClient::stats(size_t w) {
  RWorkerReply r = call(w, ids_header(MsgType::Stats, 0));
  if (r.frames.size() != 1) FD_THROW(who(w) << ": unexpected reply to STATS");
  return json::parse(std::string(static_cast<const char*>(r.frames[0].data()), r.frames[0].size()));
}

void RWorkerClient::shutdown(size_t w, const std::string& token) {
  std::string t = token;
  t.resize(proto::kShutdownTokenBytes, '\0');
  call(w, ids_header(MsgType::Shutdown, 0), {{t.data(), t.size()}});
}

void RWorkerClient::close_session(size_t w) {
  call(w, ids_header(MsgType::Close, 0));
  // The worker unmapped this connection's region with the session (every earlier reply came before CLOSE's): what
  // follows, a new session's requests included, goes over ZeroMQ.
  drop_shm(w, "this client closed its session");
}

void RWorkerClient::truncate(size_t w, const std::vector<uint64_t>& ids, const std::vector<uint32_t>& lengths) {
  FD_CHECK(ids.size() == lengths.size(), "truncate: a length per sequence");
  call(w, ids_header(MsgType::Truncate, ids.size()), {{ids.data(), ids.size() * 8}, {lengths.data(), lengths.size() * 4}});
}

}  // namespace fd
