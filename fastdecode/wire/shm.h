// The shared-memory lane between an S-worker and the R-workers on its own host (docs/RWORKER.md, "Shared-memory
// lane"). Over loopback every tensor byte is copied twice by the kernel per direction (into the socket, out of it)
// and the I/O threads are woken for it; through a region both processes map, the client copies a request's tensors
// in once and the worker copies its reply's once, and ZeroMQ carries only the header and a small descriptor.
//
// The client creates the region (POSIX shm, a random name with kNamePrefix, mode 0600, its pages reserved with
// fallocate so that a full /dev/shm is an error here and not a SIGBUS later), writes a random token into its first
// page and offers it with SHM_ATTACH (name, size, token). The worker maps it only if the name is one of ours, the
// object is a regular one owned by the worker's own user with no group/other access, its size is the one offered
// and within the worker's limit, and the token in the region is the one in the message: a peer on another host
// cannot read the region, so it cannot know the token, and cannot make the worker map (or learn anything of) a local
// object. Whatever the worker answers, the client then unlinks the name: both keep their mappings.
//
// A message in the region (header flag kFlagShm) carries one frame after its header: a descriptor of
// (offset, size) per tensor frame, then the (offset, capacity) of the space the client set aside for the reply.
// Every offset is from the region's start and lies in its data area (after kRegionHeaderBytes).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "fastdecode/wire/wire.h"

namespace fd::shm {

constexpr const char* kNamePrefix = "/fd-shm-";
constexpr size_t kMaxNameBytes = 64;
constexpr size_t kTokenBytes = 16;
constexpr size_t kRegionHeaderBytes = 4096;  // the token's page; the data area starts here, page-aligned
constexpr uint64_t kRegionMagic = 0x3147524d48534446ull;  // bytes "FDSHMRG1"
constexpr size_t kAlign = 64;                // every allocation starts on a cache line

using Token = std::array<uint8_t, kTokenBytes>;

// The first bytes of a region (the rest of its first page is zero).
struct RegionHeader {
  uint64_t magic = kRegionMagic;
  uint8_t token[kTokenBytes] = {};
};

// SHM_ATTACH's frame: u64 size, token[16], then the name (kNamePrefix + hex digits and '-', at most kMaxNameBytes).
struct Attach {
  std::string name;
  uint64_t size = 0;
  Token token{};
};
std::vector<uint8_t> encode_attach(const Attach& a);
// Throws proto::ProtocolError(Malformed) naming what is wrong.
Attach parse_attach(const proto::Frame& f);
// Whether a name is one the client makes: kNamePrefix then [0-9a-f-], at most kMaxNameBytes ("" when it is, else why).
std::string name_problem(const std::string& name);

// A mapped region. Unmapped (and its name unlinked, where this side still holds it) when the last owner lets go.
class Region {
 public:
  // Client side: a new object of `bytes` (>= 2 * kRegionHeaderBytes), O_CREAT|O_EXCL, mode 0600, pages reserved,
  // random name and token. Throws fd::Error naming the step that failed (e.g. /dev/shm too small).
  static std::shared_ptr<Region> create(size_t bytes);
  // Worker side: maps what `a` offers after every check (see the top of this file). Throws proto::ProtocolError:
  // Unsupported (max_bytes 0: this worker takes no shared memory), TooLarge (over max_bytes), Forbidden (not ours:
  // the name, the owner, the mode, the size or the token), Malformed.
  static std::shared_ptr<Region> open(const Attach& a, size_t max_bytes);
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  uint8_t* base() const { return base_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  const Token& token() const { return token_; }
  // The name is removed from /dev/shm (the mapping stays). Idempotent; only the creator unlinks.
  void unlink();
  // Whether [p, p + n) lies in the data area.
  bool in_data(const void* p, size_t n) const;

 private:
  Region() = default;
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
  std::string name_;
  Token token_{};
  bool owner_ = false, linked_ = false;
};

// A frame's place in the region.
struct Span {
  uint64_t offset = 0, size = 0;
};
struct Descriptor {
  std::vector<Span> frames;  // one per tensor frame (the header's n_frames)
  Span reply;                // requests: the reply's space (offset, capacity); replies, and requests whose reply has no
                             // frames: (kRegionHeaderBytes, 0)
};
std::vector<uint8_t> encode_descriptor(const Descriptor& d);
// Parses a descriptor of `n_frames` frames (exactly 16 * (n_frames + 1) bytes) and checks every span, frames and
// reply space alike, against a region of `region_bytes`: offset >= kRegionHeaderBytes and offset + size <=
// region_bytes, computed without overflow. Throws proto::ProtocolError(Malformed) naming the first bad span.
Descriptor parse_descriptor(const proto::Frame& f, size_t n_frames, size_t region_bytes);

// The rings (docs/RWORKER.md, "Rings"): the region's header page also carries two small rings of message slots, one
// each way, that let a request and its reply skip ZeroMQ's I/O threads (four thread wake-ups per round trip) while the
// side that takes them is polling anyway. A side polls without sleeping only with spin_us > 0 and says so in its
// word (kWorkerSpinning, kClientSpinning); the other side puts a message in a slot only while that word is set, and
// takes it back (kSlotWithdrawn, then sends it over ZeroMQ as before) when the word is clear once the slot is published:
// whichever of the publisher's withdrawal and the taker's claim comes first wins, so a message goes exactly one way.
// A request slot also carries how many messages the client had sent over ZeroMQ before it, and the worker takes
// requests in the order the client sent them, whichever way each came. A slot holds a header and a descriptor (the
// frames lie in the data area as on the lane): what it says is checked as any request or reply is.
enum class Ring { Requests, Replies };
constexpr size_t kSpinWordsOffset = 512;   // two 64-byte lines: the worker's word, then the client's
constexpr size_t kRingOffset = 1024;       // kRingSlots request slots, then kRingSlots reply slots
constexpr size_t kRingSlots = 4;
constexpr size_t kSlotBytes = 256;
constexpr size_t kSlotDescBytes = 96;      // a descriptor of up to 5 frames and the reply space
enum : uint32_t { kSlotFree = 0, kSlotPublished = 1, kSlotTaken = 2, kSlotWithdrawn = 3 };
static_assert(kRingOffset + 2 * kRingSlots * kSlotBytes <= kRegionHeaderBytes, "the rings fit the header page");

// A message taken from a ring.
struct RingMessage {
  uint64_t zmq_before = 0;  // requests: messages the client had sent over ZeroMQ before this one
  std::array<uint8_t, proto::kHeaderBytes> head{};
  std::vector<uint8_t> desc;
};

// One side's end of one ring of a mapped region (`base`: the region's first byte). The publisher and the taker each
// keep their own position; neither trusts what the other wrote (a slot out of turn stops the taker: it is the peer's
// to fix).
class RingEnd {
 public:
  RingEnd() = default;
  RingEnd(uint8_t* base, Ring ring) : base_(base), ring_(ring) {}
  explicit operator bool() const { return base_ != nullptr; }
  // The publisher: whether the taker polls now (its spinning word set).
  bool taker_spinning() const;
  enum class Put { Published, Full, Withdrawn };
  // Puts a message in the next slot: Full (the slot is not yet free: send it over ZeroMQ), Withdrawn (the taker
  // stopped polling before it claimed it: send it over ZeroMQ) or Published (it is the taker's now).
  Put put(const std::array<uint8_t, proto::kHeaderBytes>& head, const std::vector<uint8_t>& desc, uint64_t zmq_before);
  // The taker: claims the messages published in turn, at most `max` of them (frees withdrawn slots on the way),
  // appending them to `out`. Returns how many it took.
  size_t take(std::vector<RingMessage>& out, size_t max = SIZE_MAX);
  // The taker's spinning word (the word the publisher reads).
  void set_spinning(bool on);

 private:
  uint8_t* slot(uint32_t seq) const;
  uint8_t* base_ = nullptr;
  Ring ring_ = Ring::Requests;
  uint32_t next_ = 0;  // publisher: the next slot's sequence; taker: the next one expected
};

// The client's allocator of a region's data area: first fit over free blocks kept by offset, neighbours merged on
// free. The client alone allocates; a block is freed when its request's reply arrived (request frames) or when the
// reply's frames are destroyed (reply space), possibly on another thread: hence the mutex.
class Allocator {
 public:
  Allocator(uint64_t begin, uint64_t end);
  std::optional<uint64_t> alloc(uint64_t bytes);  // nullopt: no block that large is free
  void free(uint64_t offset);                     // a block alloc() returned
  uint64_t free_bytes() const;
  size_t live_blocks() const;

 private:
  mutable std::mutex mu_;
  std::map<uint64_t, uint64_t> free_;  // offset -> bytes
  std::map<uint64_t, uint64_t> used_;  // offset -> bytes
  uint64_t free_total_ = 0;
};

// A region with its allocator: what the client holds per worker, and what every reply frame in the region keeps
// alive (a reply may outlive the client that received it).
struct Space {
  std::shared_ptr<Region> region;
  Allocator alloc;
  explicit Space(std::shared_ptr<Region> r)
      : region(std::move(r)), alloc(kRegionHeaderBytes, region->size()) {}
};

}  // namespace fd::shm
