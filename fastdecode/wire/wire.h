// The S-worker <-> R-worker wire format (docs/RWORKER.md). A message is multipart: one fixed 64-byte
// little-endian header frame, then the tensor frames its type calls for, whose sizes follow from the
// header's dimensions. Every received byte is untrusted: decode() checks all of it.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fastdecode/core/error.h"

namespace fd::proto {

constexpr uint32_t kMagic = 0x57524446u;  // bytes "FDRW"
// 2: sessions (CLOSE), TRUNCATE, SHUTDOWN carries a token. 3: SHM_ATTACH and the header's `flags` (a byte that was
// reserved): a version 2 message is still valid (kMinVersion), with its flags zero as its reserved bytes were.
constexpr uint16_t kVersion = 3;
constexpr uint16_t kMinVersion = 2;
constexpr size_t kHeaderBytes = 64;

enum class MsgType : uint16_t {
  Hello = 1,        // S->R: model shape (n_layers in `layer`, heads, head_dim, wire dtype). -> HelloReply
  HelloReply = 2,   // R->S: frame 0 = JSON of the worker's capabilities
  AddSeq = 3,       // S->R: frame 0 = seq ids u64[n_seq]. -> Ok
  AppendKV = 4,     // S->R: ids u64[n_seq], counts u32[n_seq] (sum = n_tokens), K, V [n_tokens, n_kv_heads, D]. -> Ok
  Attend = 5,       // S->R: ids u64[n_seq], q [n_seq, n_heads, D], k, v [n_seq, n_kv_heads, D]. -> AttendReply
  AttendReply = 6,  // R->S: o [n_seq, n_heads, D]; compute_ns set
  FreeSeq = 7,      // S->R: ids u64[n_seq]. -> Ok
  Stats = 8,        // S->R. -> StatsReply (frame 0 = JSON)
  StatsReply = 9,
  Shutdown = 10,    // S->R: frame 0 = the worker's shutdown token (kShutdownTokenBytes). -> Ok, then the worker exits
  Ok = 11,
  Error = 12,       // R->S: status = ErrorCode, frame 0 = message text
  Close = 13,       // S->R: ends this client's session: its sequences are freed. -> Ok
  Truncate = 14,    // S->R: ids u64[n_seq], lengths u32[n_seq]: each sequence keeps its first length tokens at every
                    // layer (the undo of a step that failed half way). -> Ok
  ShmAttach = 15,   // S->R: frame 0 = a shared-memory region the client offers (fastdecode/wire/shm.h). -> Ok, or Error
                    // (the client then keeps to ZeroMQ). Answered by the socket loop, never by the handler.
};
constexpr uint16_t kMaxMsgType = uint16_t(MsgType::ShmAttach);
// Header flags.
constexpr uint8_t kFlagShm = 1;  // the tensor frames lie in the connection's shared-memory region: the one frame after
                                 // the header is a descriptor of them (fastdecode/wire/shm.h), resolved by the
                                 // socket loop (worker) or the client before decode() sees the message
constexpr size_t kShutdownTokenBytes = 32;
const char* msg_type_name(MsgType t);

enum class WireDType : uint8_t { F16 = 0, F32 = 1 };
size_t wire_dtype_size(WireDType t);

enum class ErrorCode : int32_t {
  None = 0,
  Malformed = 1,       // bad header, sizes, counts, unknown type, version
  NotConfigured = 2,   // a request before Hello
  ShapeMismatch = 3,   // dims differ from the Hello
  UnknownSequence = 4,
  DuplicateSequence = 5,
  BadLayer = 6,
  OutOfMemory = 7,     // would exceed --memory-gb; nothing was changed
  TooLarge = 8,        // message over the worker's size limit
  Internal = 9,
  Forbidden = 10,      // SHUTDOWN without the worker's token
  Busy = 11,           // the worker holds its most sessions
  Unsupported = 12,    // a TRUNCATE into a quantized block whose fp16 values are gone
};
const char* error_code_name(ErrorCode c);

// The header. Field order = byte order on the wire (little-endian, no padding); reserved bytes are 0.
struct Header {
  uint32_t magic = kMagic;
  uint16_t version = kVersion;
  uint16_t type = 0;          // MsgType
  uint64_t request_id = 0;    // echoed in the reply
  uint32_t layer = 0;         // Hello: number of layers
  uint32_t n_seq = 0;
  uint32_t n_tokens = 0;      // AppendKV: total tokens
  uint16_t n_heads = 0;
  uint16_t n_kv_heads = 0;
  uint16_t head_dim = 0;
  uint8_t dtype = 0;          // WireDType of tensor frames
  uint8_t n_frames = 0;       // frames after the header
  int32_t status = 0;         // Error: ErrorCode
  uint64_t compute_ns = 0;    // AttendReply: the worker's compute time for the request
  uint8_t flags = 0;          // version 3: kFlag* bits (0 in a version 2 message, where it was reserved)
  uint8_t reserved[15] = {};

  MsgType msg_type() const { return MsgType(type); }
};

std::array<uint8_t, kHeaderBytes> encode_header(const Header& h);

// The header of a reply to `req`: the request's id, layer, sequence count and shape, the reply's type,
// frame count and status (every R-worker builds its replies' headers so).
Header reply_header(const Header& req, MsgType type, size_t n_frames, int32_t status = 0, uint64_t compute_ns = 0);

// A header of `type` for a model shape (heads, KV heads, head dim) and tensor dtype; n_seq as given.
Header make_header(MsgType type, int n_heads, int n_kv_heads, int head_dim, WireDType dtype, uint32_t n_seq = 0);

// A received frame: bytes owned by the caller (e.g. a zmq::message_t).
struct Frame {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

struct Limits {
  size_t max_message_bytes = size_t(1) << 30;
  uint32_t max_seqs = 1u << 20;
  uint32_t max_tokens = 1u << 24;
  uint16_t max_heads = 1024;
  uint16_t max_head_dim = 256;
};

// Thrown by decode() and the worker's checks; becomes an Error reply.
class ProtocolError : public fd::Error {
 public:
  ProtocolError(ErrorCode code, const std::string& msg) : fd::Error(msg), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

struct Message {
  Header h;
  std::vector<Frame> frames;  // n_frames frames, sizes checked against the header
};

// Parses and validates a multipart message (parts[0] = header). Checks magic, version, type, reserved
// bytes, dims against limits, frame count and every frame size for the type, total size, and for
// AppendKV that the counts add up. Throws ProtocolError(Malformed or TooLarge). A message with kFlagShm is
// malformed here: its frames must have been resolved out of the shared-memory region (and the flag cleared) first.
Message decode(const Frame* parts, size_t n_parts, const Limits& limits);

// Expected sizes of the frames of a message type, from its header (validated dims).
std::vector<size_t> expected_frame_sizes(const Header& h);

// Helpers for reading little-endian arrays from possibly unaligned frames.
uint64_t read_u64(const uint8_t* p, size_t i);
uint32_t read_u32(const uint8_t* p, size_t i);

}  // namespace fd::proto
