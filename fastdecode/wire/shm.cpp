#include "fastdecode/wire/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "fastdecode/core/error.h"

namespace fd::shm {

using proto::ErrorCode;
using proto::ProtocolError;

namespace {

void random_bytes(void* out, size_t n) {
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    const ssize_t got = getrandom(p, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      FD_THROW("getrandom: " << std::strerror(errno));
    }
    p += got, n -= size_t(got);
  }
}

[[noreturn]] void refuse(ErrorCode code, const std::string& what) { throw ProtocolError(code, "shared memory refused: " + what); }

}  // namespace

std::string name_problem(const std::string& name) {
  const std::string prefix = kNamePrefix;
  if (name.size() > kMaxNameBytes) return "name of " + std::to_string(name.size()) + " bytes (at most " + std::to_string(kMaxNameBytes) + ")";
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) return "name '" + name + "' does not start with " + prefix;
  if (name.find_first_not_of("0123456789abcdef-", prefix.size()) != std::string::npos)
    return "name '" + name + "' has characters other than hex digits and '-' after " + prefix;
  return "";
}

std::vector<uint8_t> encode_attach(const Attach& a) {
  std::vector<uint8_t> out(8 + kTokenBytes + a.name.size());
  std::memcpy(out.data(), &a.size, 8);
  std::memcpy(out.data() + 8, a.token.data(), kTokenBytes);
  std::memcpy(out.data() + 8 + kTokenBytes, a.name.data(), a.name.size());
  return out;
}

Attach parse_attach(const proto::Frame& f) {
  if (f.size <= 8 + kTokenBytes || f.size > 8 + kTokenBytes + kMaxNameBytes)
    throw ProtocolError(ErrorCode::Malformed, "SHM_ATTACH frame of " + std::to_string(f.size) + " bytes: expected size (8), token (" +
                                                  std::to_string(kTokenBytes) + ") and a name of 1 to " +
                                                  std::to_string(kMaxNameBytes) + " bytes");
  Attach a;
  std::memcpy(&a.size, f.data, 8);
  std::memcpy(a.token.data(), f.data + 8, kTokenBytes);
  a.name.assign(reinterpret_cast<const char*>(f.data + 8 + kTokenBytes), f.size - 8 - kTokenBytes);
  return a;
}

std::shared_ptr<Region> Region::create(size_t bytes) {
  FD_CHECK(bytes >= 2 * kRegionHeaderBytes, "a shared-memory region needs at least " << 2 * kRegionHeaderBytes << " bytes");
  std::shared_ptr<Region> r(new Region());
  uint8_t rnd[8];
  random_bytes(rnd, sizeof rnd);
  char name[kMaxNameBytes + 1];
  std::snprintf(name, sizeof name, "%s%ld-%02x%02x%02x%02x%02x%02x%02x%02x", kNamePrefix, long(getpid()), rnd[0], rnd[1], rnd[2],
                rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
  r->name_ = name;
  r->owner_ = true;
  const int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) FD_THROW("shm_open(" << name << "): " << std::strerror(errno) << " (is /dev/shm mounted?)");
  r->linked_ = true;
  // Reserve the pages now: on a full tmpfs a page first touched later would be a SIGBUS, not an error.
  if (const int e = posix_fallocate(fd, 0, off_t(bytes)); e != 0) {
    close(fd);
    FD_THROW("cannot reserve " << bytes << " bytes of shared memory for " << name << ": " << std::strerror(e)
                               << " (/dev/shm too small? engine.rworkers.shm: false keeps to ZeroMQ)");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_err = errno;
  close(fd);  // the mapping keeps the object
  if (p == MAP_FAILED) FD_THROW("mmap of " << bytes << " bytes of " << name << ": " << std::strerror(map_err));
  r->base_ = static_cast<uint8_t*>(p);
  r->size_ = bytes;
  random_bytes(r->token_.data(), kTokenBytes);
  RegionHeader h;
  std::memcpy(h.token, r->token_.data(), kTokenBytes);
  std::memcpy(r->base_, &h, sizeof h);
  return r;
}

std::shared_ptr<Region> Region::open(const Attach& a, size_t max_bytes) {
  if (max_bytes == 0) refuse(ErrorCode::Unsupported, "this worker takes no shared memory (fd-rworker --shm-max-mb 0)");
  if (const std::string why = name_problem(a.name); !why.empty()) refuse(ErrorCode::Forbidden, why);
  if (a.size < 2 * kRegionHeaderBytes) refuse(ErrorCode::Malformed, "region of " + std::to_string(a.size) + " bytes is too small");
  if (a.size > max_bytes)
    refuse(ErrorCode::TooLarge, "region of " + std::to_string(a.size) + " bytes is over this worker's limit of " +
                                    std::to_string(max_bytes) + " (fd-rworker --shm-max-mb)");
  // O_NOFOLLOW: /dev/shm is world-writable; a link planted under one of our names is not followed.
  const int fd = shm_open(a.name.c_str(), O_RDWR | O_NOFOLLOW, 0);
  if (fd < 0)
    refuse(ErrorCode::Forbidden, "cannot open " + a.name + ": " + std::strerror(errno) + " (a client on another host?)");
  struct stat st {};
  const auto fail = [&](const std::string& why) {
    close(fd);
    refuse(ErrorCode::Forbidden, a.name + " " + why);
  };
  if (fstat(fd, &st) != 0) fail(std::string("cannot be examined: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("is not a regular shared-memory object");
  if (st.st_uid != geteuid()) fail("belongs to uid " + std::to_string(st.st_uid) + ", not to this worker's " + std::to_string(geteuid()));
  if ((st.st_mode & 077) != 0) fail("is open to other users (mode " + std::to_string(st.st_mode & 0777) + ")");
  if (uint64_t(st.st_size) != a.size)
    fail("is " + std::to_string(st.st_size) + " bytes, not the " + std::to_string(a.size) + " offered");
  void* p = mmap(nullptr, a.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_err = errno;
  close(fd);
  if (p == MAP_FAILED) refuse(ErrorCode::Internal, "mmap of " + a.name + ": " + std::strerror(map_err));
  std::shared_ptr<Region> r(new Region());
  r->base_ = static_cast<uint8_t*>(p);
  r->size_ = a.size;
  r->name_ = a.name;
  RegionHeader h;
  std::memcpy(&h, r->base_, sizeof h);
  // Constant-time compare: the time taken says nothing about how much of a guess was right.
  uint8_t diff = h.magic == kRegionMagic ? 0 : 1;
  for (size_t i = 0; i < kTokenBytes; ++i) diff |= uint8_t(h.token[i] ^ a.token[i]);
  if (diff != 0) refuse(ErrorCode::Forbidden, a.name + ": the token in the region is not the one offered");
  r->token_ = a.token;
  return r;  // ~Region unmaps it on every path above that throws after mmap
}

Region::~Region() {
  if (base_) munmap(base_, size_);
  unlink();
}

void Region::unlink() {
  if (owner_ && linked_) shm_unlink(name_.c_str());
  linked_ = false;
}

bool Region::in_data(const void* p, size_t n) const {
  const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(base_);
  return a >= b + kRegionHeaderBytes && a <= b + size_ && n <= b + size_ - a;
}

std::vector<uint8_t> encode_descriptor(const Descriptor& d) {
  std::vector<uint8_t> out(16 * (d.frames.size() + 1));
  for (size_t i = 0; i < d.frames.size(); ++i) {
    std::memcpy(out.data() + 16 * i, &d.frames[i].offset, 8);
    std::memcpy(out.data() + 16 * i + 8, &d.frames[i].size, 8);
  }
  std::memcpy(out.data() + 16 * d.frames.size(), &d.reply.offset, 8);
  std::memcpy(out.data() + 16 * d.frames.size() + 8, &d.reply.size, 8);
  return out;
}

Descriptor parse_descriptor(const proto::Frame& f, size_t n_frames, size_t region_bytes) {
  if (f.size != 16 * (n_frames + 1))
    throw ProtocolError(ErrorCode::Malformed, "shared-memory descriptor of " + std::to_string(f.size) + " bytes for " +
                                                  std::to_string(n_frames) + " frames: expected " +
                                                  std::to_string(16 * (n_frames + 1)));
  Descriptor d;
  d.frames.resize(n_frames);
  for (size_t i = 0; i <= n_frames; ++i) {
    Span s;
    std::memcpy(&s.offset, f.data + 16 * i, 8);
    std::memcpy(&s.size, f.data + 16 * i + 8, 8);
    // offset + size <= region_bytes, written so that it cannot overflow.
    if (s.offset < kRegionHeaderBytes || s.offset > region_bytes || s.size > region_bytes - s.offset)
      throw ProtocolError(ErrorCode::Malformed, std::string("shared-memory descriptor: ") +
                                                    (i < n_frames ? "frame " + std::to_string(i) : std::string("reply space")) +
                                                    " at offset " + std::to_string(s.offset) + ", " + std::to_string(s.size) +
                                                    " bytes, is not inside the data area [" + std::to_string(kRegionHeaderBytes) +
                                                    ", " + std::to_string(region_bytes) + ")");
    (i < n_frames ? d.frames[i] : d.reply) = s;
  }
  return d;
}

Allocator::Allocator(uint64_t begin, uint64_t end) {
  begin = (begin + kAlign - 1) / kAlign * kAlign;
  if (end > begin) free_[begin] = end - begin, free_total_ = end - begin;
}

std::optional<uint64_t> Allocator::alloc(uint64_t bytes) {
  const uint64_t n = std::max<uint64_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < n) continue;
    const uint64_t off = it->first, rest = it->second - n;
    free_.erase(it);
    if (rest > 0) free_[off + n] = rest;
    used_[off] = n;
    free_total_ -= n;
    return off;
  }
  return std::nullopt;
}

void Allocator::free(uint64_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  auto u = used_.find(offset);
  FD_CHECK(u != used_.end(), "shared-memory allocator: " << offset << " is not an allocated block");
  uint64_t off = offset, n = u->second;
  used_.erase(u);
  free_total_ += n;
  auto next = free_.lower_bound(off);
  if (next != free_.end() && off + n == next->first) n += next->second, next = free_.erase(next);
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += n;
      return;
    }
  }
  free_[off] = n;
}

uint64_t Allocator::free_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_total_;
}

size_t Allocator::live_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_.size();
}

// ---- the rings ----------------------------------------------------------------------------------------------------
// A slot: u32 state, u32 seq, u64 zmq_before, u32 desc_bytes, then the header at 64 and the descriptor at 128. The
// state and the spinning words are atomics in memory both processes map (lock-free, so address-free); every other
// field is written before the state says Published and read after the taker's claim.

namespace {
uint32_t* word(uint8_t* p) { return reinterpret_cast<uint32_t*>(p); }
uint8_t* spin_word(uint8_t* base, Ring taker) { return base + kSpinWordsOffset + (taker == Ring::Requests ? 0 : 64); }
}  // namespace

uint8_t* RingEnd::slot(uint32_t seq) const {
  return base_ + kRingOffset + (ring_ == Ring::Requests ? 0 : kRingSlots * kSlotBytes) + (seq % kRingSlots) * kSlotBytes;
}

bool RingEnd::taker_spinning() const { return __atomic_load_n(word(spin_word(base_, ring_)), __ATOMIC_SEQ_CST) != 0; }

void RingEnd::set_spinning(bool on) { __atomic_store_n(word(spin_word(base_, ring_)), on ? 1u : 0u, __ATOMIC_SEQ_CST); }

RingEnd::Put RingEnd::put(const std::array<uint8_t, proto::kHeaderBytes>& head, const std::vector<uint8_t>& desc, uint64_t zmq_before) {
  FD_CHECK(desc.size() <= kSlotDescBytes, "a ring slot holds a descriptor of at most " << kSlotDescBytes << " bytes");
  uint8_t* s = slot(next_);
  if (__atomic_load_n(word(s), __ATOMIC_ACQUIRE) != kSlotFree) return Put::Full;
  const uint32_t seq = next_, n = uint32_t(desc.size());
  std::memcpy(s + 4, &seq, 4);
  std::memcpy(s + 8, &zmq_before, 8);
  std::memcpy(s + 16, &n, 4);
  std::memcpy(s + 64, head.data(), head.size());
  if (n) std::memcpy(s + 128, desc.data(), n);
  ++next_;
  // Published, then the taker's word read (both sequentially consistent): if the taker cleared its word before it
  // looked at this slot, this side sees the word clear and withdraws, or the taker's last look claims the slot first.
  __atomic_store_n(word(s), kSlotPublished, __ATOMIC_SEQ_CST);
  if (taker_spinning()) return Put::Published;
  uint32_t expected = kSlotPublished;
  return __atomic_compare_exchange_n(word(s), &expected, kSlotWithdrawn, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST) ? Put::Withdrawn
                                                                                                                     : Put::Published;
}

size_t RingEnd::take(std::vector<RingMessage>& out, size_t max) {
  size_t taken = 0;
  while (taken < max) {
    uint8_t* s = slot(next_);
    uint32_t state = __atomic_load_n(word(s), __ATOMIC_SEQ_CST);
    if (state != kSlotPublished && state != kSlotWithdrawn) return taken;
    uint32_t seq = 0;
    std::memcpy(&seq, s + 4, 4);
    if (seq != next_) return taken;  // not this turn's (the peer's bug): left where it is
    if (state == kSlotPublished &&
        __atomic_compare_exchange_n(word(s), &state, kSlotTaken, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
      RingMessage m;
      uint32_t n = 0;
      std::memcpy(&m.zmq_before, s + 8, 8);
      std::memcpy(&n, s + 16, 4);
      std::memcpy(m.head.data(), s + 64, m.head.size());
      m.desc.assign(s + 128, s + 128 + std::min<size_t>(n, kSlotDescBytes));
      if (n > kSlotDescBytes) m.desc.clear();  // a descriptor that cannot be: the parse refuses the empty one
      out.push_back(std::move(m));
      ++taken;
    } else if (state != kSlotWithdrawn) {
      return taken;  // the claim failed and the slot is not Withdrawn (the publisher's only change): not ours
    }
    // Taken (its fields copied out) or withdrawn: the slot is the publisher's again.
    __atomic_store_n(word(s), kSlotFree, __ATOMIC_RELEASE);
    ++next_;
  }
  return taken;
}

}  // namespace fd::shm
