#include "fastdecode/wire/wire.h"

#include <cstring>

#include "fd_fault_wire_last_frame_unchecked.h"  // planted fault (scripts/fault-check.sh; fastdecode/core/fault.h)

namespace fd::proto {

static_assert(sizeof(Header) == kHeaderBytes, "Header must be exactly 64 bytes with no padding");
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the wire format is little-endian");

const char* msg_type_name(MsgType t) {
  switch (t) {
    case MsgType::Hello: return "HELLO";
    case MsgType::HelloReply: return "HELLO_REPLY";
    case MsgType::AddSeq: return "ADD_SEQ";
    case MsgType::AppendKV: return "APPEND_KV";
    case MsgType::Attend: return "ATTEND";
    case MsgType::AttendReply: return "ATTEND_REPLY";
    case MsgType::FreeSeq: return "FREE_SEQ";
    case MsgType::Stats: return "STATS";
    case MsgType::StatsReply: return "STATS_REPLY";
    case MsgType::Shutdown: return "SHUTDOWN";
    case MsgType::Ok: return "OK";
    case MsgType::Error: return "ERROR";
    case MsgType::Close: return "CLOSE";
    case MsgType::Truncate: return "TRUNCATE";
    case MsgType::ShmAttach: return "SHM_ATTACH";
  }
  return "UNKNOWN";
}

const char* error_code_name(ErrorCode c) {
  switch (c) {
    case ErrorCode::None: return "none";
    case ErrorCode::Malformed: return "malformed";
    case ErrorCode::NotConfigured: return "not-configured";
    case ErrorCode::ShapeMismatch: return "shape-mismatch";
    case ErrorCode::UnknownSequence: return "unknown-sequence";
    case ErrorCode::DuplicateSequence: return "duplicate-sequence";
    case ErrorCode::BadLayer: return "bad-layer";
    case ErrorCode::OutOfMemory: return "out-of-memory";
    case ErrorCode::TooLarge: return "too-large";
    case ErrorCode::Internal: return "internal";
    case ErrorCode::Forbidden: return "forbidden";
    case ErrorCode::Busy: return "busy";
    case ErrorCode::Unsupported: return "unsupported";
  }
  return "unknown";
}

size_t wire_dtype_size(WireDType t) { return t == WireDType::F32 ? 4 : 2; }

Header make_header(MsgType type, int n_heads, int n_kv_heads, int head_dim, WireDType dtype, uint32_t n_seq) {
  Header h;
  h.type = uint16_t(type);
  h.n_seq = n_seq;
  h.n_heads = uint16_t(n_heads);
  h.n_kv_heads = uint16_t(n_kv_heads);
  h.head_dim = uint16_t(head_dim);
  h.dtype = uint8_t(dtype);
  return h;
}

std::array<uint8_t, kHeaderBytes> encode_header(const Header& h) {
  std::array<uint8_t, kHeaderBytes> out{};
  std::memcpy(out.data(), &h, kHeaderBytes);
  return out;
}

uint64_t read_u64(const uint8_t* p, size_t i) {
  uint64_t v;
  std::memcpy(&v, p + i * 8, 8);
  return v;
}
uint32_t read_u32(const uint8_t* p, size_t i) {
  uint32_t v;
  std::memcpy(&v, p + i * 4, 4);
  return v;
}

[[noreturn]] static void malformed(const std::string& what) { throw ProtocolError(ErrorCode::Malformed, what); }

std::vector<size_t> expected_frame_sizes(const Header& h) {
  const size_t es = wire_dtype_size(WireDType(h.dtype));
  const size_t ns = h.n_seq, D = h.head_dim, H = h.n_heads, K = h.n_kv_heads;
  switch (h.msg_type()) {
    case MsgType::Hello:
    case MsgType::Stats:
    case MsgType::Close:
    case MsgType::Ok:
      return {};
    case MsgType::Shutdown:
      return {kShutdownTokenBytes};
    case MsgType::AddSeq:
    case MsgType::FreeSeq:
      return {ns * 8};
    case MsgType::Truncate:
      return {ns * 8, ns * 4};
    case MsgType::AppendKV:
      return {ns * 8, ns * 4, size_t(h.n_tokens) * K * D * es, size_t(h.n_tokens) * K * D * es};
    case MsgType::Attend:
      return {ns * 8, ns * H * D * es, ns * K * D * es, ns * K * D * es};
    case MsgType::AttendReply:
      return {ns * H * D * es};
    case MsgType::HelloReply:
    case MsgType::StatsReply:
    case MsgType::Error:
    case MsgType::ShmAttach:  // its layout is checked where it is answered (shm.h: parse_shm_attach)
      return {size_t(-1)};  // one frame of any size (text)
  }
  malformed("unknown message type " + std::to_string(h.type));
}

Header reply_header(const Header& req, MsgType type, size_t n_frames, int32_t status, uint64_t compute_ns) {
  Header h;
  h.type = uint16_t(type);
  h.request_id = req.request_id;
  h.layer = req.layer;
  h.n_seq = req.n_seq;
  h.n_heads = req.n_heads;
  h.n_kv_heads = req.n_kv_heads;
  h.head_dim = req.head_dim;
  h.dtype = req.dtype;
  h.n_frames = uint8_t(n_frames);
  h.status = status;
  h.compute_ns = compute_ns;
  return h;
}

Message decode(const Frame* parts, size_t n_parts, const Limits& lim) {
  if (n_parts == 0) malformed("empty message");
  if (parts[0].size != kHeaderBytes)
    malformed("header frame is " + std::to_string(parts[0].size) + " bytes, expected " + std::to_string(kHeaderBytes));
  Message m;
  std::memcpy(&m.h, parts[0].data, kHeaderBytes);
  const Header& h = m.h;
  if (h.magic != kMagic) malformed("bad magic");
  if (h.version < kMinVersion || h.version > kVersion)
    malformed("protocol version " + std::to_string(h.version) + ", this worker speaks " + std::to_string(kMinVersion) + " to " +
              std::to_string(kVersion));
  if (h.type < uint16_t(MsgType::Hello) || h.type > kMaxMsgType)
    malformed("unknown message type " + std::to_string(h.type));
  for (uint8_t b : h.reserved)
    if (b != 0) malformed("reserved header bytes are not zero");
  if (h.version < 3 && h.flags != 0) malformed("reserved header bytes are not zero");
  if (h.version < 3 && h.msg_type() == MsgType::ShmAttach)  // docs/RWORKER.md: version 2 has no SHM_ATTACH
    malformed("SHM_ATTACH is a protocol version 3 message; this one says version " + std::to_string(h.version));
  if (h.flags & ~kFlagShm) malformed("unknown header flags " + std::to_string(h.flags));
  if (h.flags & kFlagShm)
    malformed(std::string(msg_type_name(h.msg_type())) + " flagged as in shared memory, but no shared-memory region is attached "
              "to this connection (or this message type cannot come that way)");
  if (h.dtype > uint8_t(WireDType::F32)) malformed("unknown wire dtype " + std::to_string(h.dtype));
  if (h.n_seq > lim.max_seqs) malformed("n_seq " + std::to_string(h.n_seq) + " over the limit");
  if (h.n_tokens > lim.max_tokens) malformed("n_tokens " + std::to_string(h.n_tokens) + " over the limit");
  if (h.n_heads > lim.max_heads || h.n_kv_heads > lim.max_heads) malformed("head count over the limit");
  if (h.head_dim > lim.max_head_dim) malformed("head_dim " + std::to_string(h.head_dim) + " over the limit");
  const std::vector<size_t> sizes = expected_frame_sizes(h);
  if (h.n_frames != sizes.size() || n_parts != sizes.size() + 1)
    malformed(std::string(msg_type_name(h.msg_type())) + " needs " + std::to_string(sizes.size()) + " frames, header says " +
              std::to_string(h.n_frames) + ", got " + std::to_string(n_parts - 1));
  size_t total = kHeaderBytes;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const Frame& f = parts[i + 1];
    total += f.size;
    if (total > lim.max_message_bytes)
      throw ProtocolError(ErrorCode::TooLarge, "message over the " + std::to_string(lim.max_message_bytes) + "-byte limit");
#ifdef FD_FAULT_WIRE_LAST_FRAME_UNCHECKED  // planted fault: the size check stops one frame early (an off-by-one in
    if (sizes[i] != size_t(-1) && f.size != sizes[i] && i + 1 < sizes.size())  // its bound): the last frame may be short
#else
    if (sizes[i] != size_t(-1) && f.size != sizes[i])
#endif
      malformed(std::string(msg_type_name(h.msg_type())) + " frame " + std::to_string(i) + " is " + std::to_string(f.size) +
                " bytes, expected " + std::to_string(sizes[i]));
    if (f.size > 0 && f.data == nullptr) malformed("null frame");
    m.frames.push_back(f);
  }
  if (h.msg_type() == MsgType::AppendKV) {
    uint64_t sum = 0;
    for (uint32_t i = 0; i < h.n_seq; ++i) sum += read_u32(m.frames[1].data, i);
    if (sum != h.n_tokens) malformed("APPEND_KV counts add up to " + std::to_string(sum) + ", header says " + std::to_string(h.n_tokens));
  }
  return m;
}

}  // namespace fd::proto
