// RWorkerClient's shared-memory lane (fastdecode/wire/shm.h, docs/RWORKER.md "Shared-memory lane" and "Rings"): the
// offer, requests written into a worker's region (or its request ring), replies resolved out of it (or its reply ring).
#include <atomic>
#include <cstdint>
#include <cstring>

#include "fastdecode/wire/rworker_client.h"

namespace fd {

using proto::Header;
using proto::MsgType;

namespace {
// A reply's space in a shared-memory region, held by its frames (zmq::message_t views of the region): the last one
// destroyed gives the space back. It keeps the region mapped, so a reply may outlive the client.
struct ReplyHold {
  std::shared_ptr<shm::Space> space;
  uint64_t block = 0;
  std::atomic<int> refs{0};
};
void free_reply_frame(void*, void* hint) {
  auto* h = static_cast<ReplyHold*>(hint);
  if (--h->refs == 0) {
    h->space->alloc.free(h->block);
    delete h;
  }
}
}  // namespace

ShmLaneStats RWorkerClient::shm_stats(size_t w) const {
  const ShmLane& l = shm_.at(w);
  ShmLaneStats s = l.stats;
  if (l.space) s.free_bytes = l.space->alloc.free_bytes();
  return s;
}

std::shared_ptr<const shm::Region> RWorkerClient::shm_region(size_t w) const {
  const ShmLane& l = shm_.at(w);
  return l.active && l.space ? l.space->region : nullptr;
}

ShmBlock RWorkerClient::shm_alloc(size_t w, size_t bytes) {
  ShmLane& l = shm_.at(w);
  if (!l.active || !l.space || bytes == 0) return {};
  const std::optional<uint64_t> off = l.space->alloc.alloc(bytes);
  if (!off) return {};
  return ShmBlock(l.space, *off, bytes);
}

void RWorkerClient::offer_shm(size_t w) {
  ShmLane& l = shm_[w];
  if (shm_bytes_ == 0 || l.stats.state != "off") return;
  try {
    l.space = std::make_shared<shm::Space>(shm::Region::create(shm_bytes_));
  } catch (const Error& e) {  // no /dev/shm, or no room in it: this worker is served over ZeroMQ
    l.stats.state = "refused";
    l.stats.reason = std::string("this client could not make a region: ") + e.what();
    return;
  }
  const shm::Region& r = *l.space->region;
  const std::vector<uint8_t> frame = shm::encode_attach({r.name(), r.size(), r.token()});
  Header h;
  h.type = uint16_t(MsgType::ShmAttach);
  h.request_id = next_id_++;
  h.n_frames = 1;
  const auto head = proto::encode_header(h);
  send_head(w, head, true);
  socks_[w].send(zmq::message_t(frame.data(), frame.size()), zmq::send_flags::none);
  l.attach_id = h.request_id;
  l.stats.state = "pending";
  l.stats.name = r.name();
  l.stats.bytes = r.size();
}

bool RWorkerClient::take_attach_reply(size_t w, const std::vector<zmq::message_t>& parts) {
  ShmLane& l = shm_[w];
  if (l.stats.state != "pending" || parts.empty() || parts[0].size() != proto::kHeaderBytes) return false;
  Header h;
  std::memcpy(&h, parts[0].data(), proto::kHeaderBytes);
  if (h.request_id != l.attach_id) return false;
  l.space->region->unlink();  // mapped on both sides now, or refused: the name is no longer needed
  if (h.msg_type() == MsgType::Ok && h.n_frames == 0 && parts.size() == 1) {
    l.active = true;
    l.stats.state = "active";
    l.requests = shm::RingEnd(l.space->region->base(), shm::Ring::Requests);
    l.replies = shm::RingEnd(l.space->region->base(), shm::Ring::Replies);
    return true;
  }
  l.stats.state = "refused";
  l.stats.reason = h.msg_type() == MsgType::Error && parts.size() == 2
                       ? std::string(proto::error_code_name(proto::ErrorCode(h.status))) + ": " + peer_text(parts[1].data(), parts[1].size(), 400)
                       : std::string("an unexpected ") + proto::msg_type_name(h.msg_type()) + " reply to SHM_ATTACH";
  l.space.reset();
  return true;
}

bool RWorkerClient::send_shm(size_t w, Header& h, const std::vector<ConstBuffer>& frames) {
  ShmLane& l = shm_[w];
  if (!l.active || (h.msg_type() != MsgType::Attend && h.msg_type() != MsgType::AppendKV)) return false;
  shm::Space& sp = *l.space;
  uint8_t* base = sp.region->base();
  // The reply's space: ATTEND_REPLY's o; APPEND_KV's OK has no frames.
  const uint64_t reply_bytes = h.msg_type() == MsgType::Attend ? uint64_t(h.n_seq) * h.n_heads * h.head_dim *
                                                                     proto::wire_dtype_size(proto::WireDType(h.dtype))
                                                               : 0;
  ShmLane::InFlight f;
  shm::Descriptor d;
  const auto give_back = [&] {
    for (uint64_t b : f.blocks) sp.alloc.free(b);
    if (f.reply_block) sp.alloc.free(f.reply_block);
  };
  // Space for everything first, so that a request either goes whole through the region or whole over ZeroMQ.
  std::vector<bool> copy(frames.size(), false);
  uint64_t in_place = 0, copied = 0;
  for (size_t i = 0; i < frames.size(); ++i) {
    const ConstBuffer& b = frames[i];
    if (b.size == 0) {
      d.frames.push_back({shm::kRegionHeaderBytes, 0});
    } else if (sp.region->in_data(b.data, b.size)) {  // already in the region: sent as it lies
      d.frames.push_back({uint64_t(static_cast<const uint8_t*>(b.data) - base), b.size});
      in_place += b.size;
    } else if (const std::optional<uint64_t> off = sp.alloc.alloc(b.size)) {
      f.blocks.push_back(*off);
      d.frames.push_back({*off, b.size});
      copy[i] = true;
      copied += b.size;
    } else {
      give_back();
      ++l.stats.requests_zmq;
      return false;
    }
  }
  d.reply = {shm::kRegionHeaderBytes, 0};
  if (reply_bytes > 0) {
    const std::optional<uint64_t> off = sp.alloc.alloc(reply_bytes);
    if (!off) {
      give_back();
      ++l.stats.requests_zmq;
      return false;
    }
    f.reply_block = *off;
    f.reply = d.reply = {*off, reply_bytes};
  }
  for (size_t i = 0; i < frames.size(); ++i)
    if (copy[i]) std::memcpy(base + d.frames[i].offset, frames[i].data, frames[i].size);
  h.flags |= proto::kFlagShm;
  const auto head = proto::encode_header(h);
  const std::vector<uint8_t> desc = shm::encode_descriptor(d);
  l.inflight[h.request_id] = std::move(f);  // before a send that may throw: its space is given back with the lane
  // The worker polling: into the request ring, in the order of everything sent to it (the ZeroMQ messages before).
  const bool ring =
      l.requests && l.requests.taker_spinning() && l.requests.put(head, desc, zmq_sent_[w]) == shm::RingEnd::Put::Published;
  if (ring) {
    ++l.stats.requests_ring;
  } else {
    send_head(w, head, true);
    socks_[w].send(zmq::message_t(desc.data(), desc.size()), zmq::send_flags::none);
  }
  ++l.stats.requests_shm;
  l.stats.bytes_copied += copied;
  l.stats.bytes_in_place += in_place;
  return true;
}

void RWorkerClient::release_shm(size_t w, uint64_t request_id, bool reply_in_use) {
  ShmLane& l = shm_[w];
  auto it = l.inflight.find(request_id);
  if (it == l.inflight.end()) return;
  for (uint64_t b : it->second.blocks) l.space->alloc.free(b);
  if (!reply_in_use && it->second.reply_block) l.space->alloc.free(it->second.reply_block);
  l.inflight.erase(it);
}

void RWorkerClient::resolve_shm_reply(size_t w, std::vector<zmq::message_t>& parts) {
  ShmLane& l = shm_[w];
  if (parts.empty() || parts[0].size() != proto::kHeaderBytes) return;  // decode() names what is wrong
  Header h;
  std::memcpy(&h, parts[0].data(), proto::kHeaderBytes);
  auto it = l.inflight.find(h.request_id);
  if (!(h.flags & proto::kFlagShm)) {
    if (it != l.inflight.end()) {  // it came over ZeroMQ (an ERROR, or no room in its space): nothing of it is held
      release_shm(w, h.request_id, false);
      ++l.stats.replies_zmq;
    }
    return;
  }
  if (it == l.inflight.end() || !it->second.reply_block) {
    release_shm(w, h.request_id, false);
    FD_THROW(who(w) << " sent a reply in shared memory to request " << h.request_id << ", which set aside no space for one");
  }
  const shm::Span space = it->second.reply;
  shm::Descriptor d;
  try {
    if (parts.size() != 2) throw proto::ProtocolError(proto::ErrorCode::Malformed, "a shared-memory reply has one descriptor frame");
    d = shm::parse_descriptor({static_cast<const uint8_t*>(parts[1].data()), parts[1].size()}, h.n_frames, l.space->region->size());
    for (const shm::Span& s : d.frames)  // within the space set aside for this reply, not just within the region
      if (s.offset < space.offset || s.offset - space.offset > space.size || s.size > space.size - (s.offset - space.offset))
        throw proto::ProtocolError(proto::ErrorCode::Malformed, "a frame at offset " + std::to_string(s.offset) + ", " +
                                                                   std::to_string(s.size) + " bytes, outside the reply's space");
  } catch (const proto::ProtocolError& e) {
    release_shm(w, h.request_id, false);
    FD_THROW(who(w) << " sent a malformed reply: " << e.what());
  }
  std::vector<zmq::message_t> out;
  h.flags &= uint8_t(~proto::kFlagShm);
  const auto head = proto::encode_header(h);
  out.emplace_back(head.data(), head.size());
  if (d.frames.empty()) {
    release_shm(w, h.request_id, false);
  } else {
    auto* hold = new ReplyHold{l.space, it->second.reply_block, {}};
    hold->refs = int(d.frames.size());
    for (const shm::Span& s : d.frames) out.emplace_back(l.space->region->base() + s.offset, s.size, free_reply_frame, hold);
    release_shm(w, h.request_id, true);
  }
  ++l.stats.replies_shm;
  parts = std::move(out);
}

size_t RWorkerClient::take_ring_replies(const std::vector<size_t>& ws, int spinning) {
  size_t n = 0;
  std::vector<shm::RingMessage> got;
  for (size_t w : ws) {
    ShmLane& l = shm_[w];
    if (!l.replies) continue;
    if (spinning >= 0) l.replies.set_spinning(spinning > 0);
    got.clear();
    l.replies.take(got);
    for (const shm::RingMessage& m : got) {
      std::vector<zmq::message_t> parts;
      parts.emplace_back(m.head.data(), m.head.size());
      parts.emplace_back(m.desc.data(), m.desc.size());
      Header h;
      std::memcpy(&h, m.head.data(), proto::kHeaderBytes);
      if (!(h.flags & proto::kFlagShm))  // only a reply in the region comes this way
        FD_THROW(who(w) << " put a reply in its ring whose frames are not in the region");
      RWorkerReply r = accept(w, parts);
      ++l.stats.replies_ring;
      const std::pair<size_t, uint64_t> key{w, r.h.request_id};
      if (outstanding_.count(key)) stash_[key] = std::move(r);  // else a reply nobody waits for (a stale one)
      ++n;
      if (!l.replies) break;  // accept() may have ended the lane (a malformed reply throws first, though)
    }
  }
  return n;
}

void RWorkerClient::drop_shm(size_t w, const std::string& why) {
  ShmLane& l = shm_[w];
  // Nothing more goes through this region; replies already taken keep it mapped until they are destroyed.
  l.inflight.clear();
  l.requests = {};
  l.replies = {};
  l.space.reset();
  l.active = false;
  if (l.stats.state == "pending" || l.stats.state == "active") l.stats.state = "closed", l.stats.reason = why;
}

}  // namespace fd
