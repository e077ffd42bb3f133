#include "fastdecode/wire/rworker_client.h"

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
    : ctx_(io_threads), endpoints_(std::move(endpoints)), timeout_ms_(timeout_ms) {
  FD_CHECK(!endpoints_.empty(), "no R-worker endpoints");
  for (const auto& ep : endpoints_) {
    zmq::socket_t s(ctx_, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    try {
      s.connect(ep);
    } catch (const zmq::error_t& e) {
      FD_THROW("cannot connect to R-worker at " << ep << ": " << e.what());
    }
    socks_.push_back(std::move(s));
  }
}

RWorkerClient::~RWorkerClient() = default;

std::string RWorkerClient::who(size_t w) const { return "R-worker " + std::to_string(w) + " (" + endpoints_[w] + ")"; }

uint64_t RWorkerClient::send(size_t w, Header h, const std::vector<ConstBuffer>& frames) {
  FD_CHECK(w < socks_.size(), "no R-worker " << w);
  h.request_id = next_id_++;
  h.n_frames = uint8_t(frames.size());
  const auto head = proto::encode_header(h);
  zmq::message_t hm(head.data(), head.size());
  socks_[w].send(hm, frames.empty() ? zmq::send_flags::none : zmq::send_flags::sndmore);
  for (size_t i = 0; i < frames.size(); ++i) {
    // Zero-copy: libzmq reads the caller's buffer when it sends.
    zmq::message_t m(const_cast<void*>(frames[i].data), frames[i].size, no_free, nullptr);
    socks_[w].send(m, i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  return h.request_id;
}

std::optional<RWorkerReply> RWorkerClient::receive(size_t w) {
  std::vector<zmq::message_t> parts;
  if (!zmq::recv_multipart(socks_[w], std::back_inserter(parts), zmq::recv_flags::dontwait)) return std::nullopt;
  // A reply is as untrusted as a request is to the worker: the same decoder checks its header, frame
  // count and every frame's size against the header's dimensions, and it must be a reply type.
  std::vector<proto::Frame> frames;
  for (const auto& p : parts) frames.push_back({static_cast<const uint8_t*>(p.data()), p.size()});
  proto::Limits lim;
  lim.max_message_bytes = SIZE_MAX;  // a reply's size follows from what this client asked for
  lim.max_seqs = UINT32_MAX, lim.max_tokens = UINT32_MAX;
  RWorkerReply r;
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
  std::vector<zmq::pollitem_t> items;
  for (auto& s : socks_) items.push_back({s.handle(), 0, ZMQ_POLLIN, 0});
  while (missing()) {
    const int64_t left_ms = (deadline - now_ns()) / 1'000'000;
    if (left_ms <= 0) {  // name every worker that missed: the first one late need not be the dead one
      std::string late;
      for (const auto& r : requests)
        if (!stash_.count(r))
          late += (late.empty() ? "" : "; ") + who(r.first) + " missed its deadline of " +
                  std::to_string(timeout_ms >= 0 ? timeout_ms : timeout_ms_) + " ms (request " + std::to_string(r.second) + ")";
      FD_THROW(late);
    }
    try {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(std::min<int64_t>(left_ms, 100)));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;
    }
    for (size_t w = 0; w < socks_.size(); ++w) {
      if (!(items[w].revents & ZMQ_POLLIN)) continue;
      while (std::optional<RWorkerReply> r = receive(w)) stash_[{w, r->h.request_id}] = std::move(*r);
    }
  }
  std::vector<RWorkerReply> out;
  std::string first_error;
  for (const auto& req : requests) {
    auto it = stash_.find(req);
    RWorkerReply r = std::move(it->second);
    stash_.erase(it);
    if (r.h.msg_type() == MsgType::Error && first_error.empty()) {
      const std::string text = r.frames.empty() ? "" : std::string(static_cast<const char*>(r.frames[0].data()), r.frames[0].size());
      first_error = who(req.first) + " answered ERROR (" + proto::error_code_name(proto::ErrorCode(r.h.status)) + "): " + text;
    }
    out.push_back(std::move(r));
  }
  if (!first_error.empty()) FD_THROW(first_error);
  return out;
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
  return json::parse(std::string(static_cast<const char*>(r.frames[0].data()), r.frames[0].size()));
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

void RWorkerClient::shutdown(size_t w) { call(w, ids_header(MsgType::Shutdown, 0)); }

}  // namespace fd
