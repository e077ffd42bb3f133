#include "fastdecode/rworker/intake.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <malloc.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "fastdecode/core/clock.h"
#include "fastdecode/core/error.h"

namespace fd {

namespace {

size_t read_statm_resident(int fd) {
  char buf[128];
  const ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return 0;
  buf[n] = '\0';
  unsigned long long size = 0, resident = 0;
  if (std::sscanf(buf, "%llu %llu", &size, &resident) != 2) return 0;
  return size_t(resident) * size_t(sysconf(_SC_PAGESIZE));
}

std::string address_name(const sockaddr_storage& a, socklen_t len) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (len == 0) return "an unknown peer";
  if (a.ss_family == AF_INET) {
    const auto* s = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &s->sin_addr, host, sizeof host);
    return std::string(host) + ":" + std::to_string(ntohs(s->sin_port));
  }
  if (a.ss_family == AF_INET6) {
    const auto* s = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof host);
    char out[INET6_ADDRSTRLEN + 16];  // (snprintf: GCC 12 warns falsely on a chained string +)
    std::snprintf(out, sizeof out, "[%s]:%u", host, unsigned(ntohs(s->sin6_port)));
    return out;
  }
  if (a.ss_family == AF_UNIX) return "a local (ipc) peer";
  return "a peer of address family " + std::to_string(a.ss_family);
}

std::string mb(uint64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f MB", double(bytes) / 1e6);
  return b;
}

void raise_max(std::atomic<uint64_t>& m, uint64_t v) {
  uint64_t cur = m.load(std::memory_order_relaxed);
  while (v > cur && !m.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

}  // namespace

uint64_t wire_bytes_of_frame(size_t size, bool curve) {
  // ZMTP 3: a flags byte and a 1-byte size, or 8 bytes of size past 255. With CURVE a frame travels as a MESSAGE
  // command: its name (8 bytes), a short nonce (8), the box's MAC (16) and the frame's flags byte (1) before the data.
  const uint64_t body = uint64_t(size) + (curve ? 33 : 0);
  return body + (body > 255 ? 9 : 2);
}

bool LogLimiter::allow(int64_t now_ns, std::string* summary) {
  if (summary) summary->clear();
  if (per_second_ <= 0) return true;
  if (now_ns - window_start_ >= 1'000'000'000 || now_ns < window_start_) {
    window_start_ = now_ns;
    in_window_ = 0;
  }
  if (in_window_ >= per_second_) {
    ++suppressed_;
    ++suppressed_total_;
    return false;
  }
  ++in_window_;
  if (suppressed_ > 0 && summary)
    *summary = "suppressed " + std::to_string(suppressed_) + " error lines (at most " + std::to_string(per_second_) +
               " per second)";
  suppressed_ = 0;
  return true;
}

Connections::Connections(zmq::context_t& ctx, zmq::socket_t& sock, const IntakeOptions& opt, RouterCounters* counters,
                         std::function<void(const std::string&)> log)
    : opt_(opt), counters_(counters), log_(std::move(log)), mon_(ctx, zmq::socket_type::pair) {
  static std::atomic<int> monitors{0};
  char ep[64];  // (snprintf: GCC 12 warns falsely on a chained string +)
  std::snprintf(ep, sizeof ep, "inproc://fd-router-monitor-%d", monitors++);
  if (zmq_socket_monitor(sock.handle(), ep, ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) != 0)
    FD_THROW("zmq_socket_monitor: " << zmq_strerror(zmq_errno()));
  mon_.set(zmq::sockopt::linger, 0);
  mon_.connect(ep);
  statm_fd_ = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  base_rss_ = statm_fd_ >= 0 ? read_statm_resident(statm_fd_) : 0;
  if (opt_.memory_limit_bytes > 0 && statm_fd_ >= 0)
    rss_bound_ = base_rss_ + kBaseSlackBytes + opt_.memory_limit_bytes + opt_.budget_bytes +
                 kHandlingFactor * opt_.max_message_bytes;
  if (opt_.budget_bytes > 0 || rss_bound_ > 0 || opt_.max_connections > 0) guard_ = std::thread([this] { guard_loop(); });
}

Connections::~Connections() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (guard_.joinable()) guard_.join();
  if (statm_fd_ >= 0) close(statm_fd_);
}

void Connections::drain_locked() {
  for (;;) {
    zmq::message_t ev, addr;
    if (!mon_.recv(ev, zmq::recv_flags::dontwait)) return;
    if (ev.more()) (void)mon_.recv(addr, zmq::recv_flags::none);
    if (ev.size() < 6) continue;
    uint16_t event = 0;
    int32_t fd = -1;
    std::memcpy(&event, ev.data(), 2);
    std::memcpy(&fd, static_cast<const uint8_t*>(ev.data()) + 2, 4);
    if (event == ZMQ_EVENT_DISCONNECTED) {
      auto it = conns_.find(fd);
      if (it == conns_.end()) continue;
      for (const auto& p : it->second.peers) gone_.push_back(p);
      conns_.erase(it);
    } else if (event == ZMQ_EVENT_ACCEPTED) {
      // A record already there is this connection's own: its first message can reach the loop before libzmq's
      // listener reports the accept (the session runs on another I/O thread). It cannot be an older connection's:
      // libzmq reports a connection's end before it closes the descriptor, so before any accept can reuse it.
      track(fd, conns_[fd]);
    }
  }
}

void Connections::track(int fd, Conn& c) {
  if (c.accepted_ns == 0) c.accepted_ns = now_ns();
  if (c.addr_len > 0) return;
  c.addr_len = sizeof c.addr;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&c.addr), &c.addr_len) != 0) c.addr_len = 0;
  c.tcp = c.addr_len > 0 && (c.addr.ss_family == AF_INET || c.addr.ss_family == AF_INET6);
  c.name = address_name(c.addr, c.addr_len);
}

void Connections::drain(std::vector<std::string>* gone) {
  std::lock_guard<std::mutex> lk(mu_);
  drain_locked();
  if (gone) gone->insert(gone->end(), gone_.begin(), gone_.end());
  gone_.clear();
}

void Connections::delivered(int fd, const std::string& peer, uint64_t wire) {
  std::lock_guard<std::mutex> lk(mu_);
  Conn& c = conns_[fd];  // new when its accept is not reported yet (see drain_locked)
  track(fd, c);
  c.peers.insert(peer);
  c.delivered += wire;
}

uint64_t Connections::held(int fd, const Conn& c, int64_t now) const {
  if (!c.tcp) return 0;
  tcp_info ti{};
  socklen_t len = sizeof ti;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
      len < socklen_t(offsetof(tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received))
    return 0;
  int unread = 0;
  if (ioctl(fd, SIOCINQ, &unread) != 0 || unread < 0) unread = 0;
  const uint64_t taken = ti.tcpi_bytes_received > uint64_t(unread) ? ti.tcpi_bytes_received - uint64_t(unread) : 0;
  const uint64_t slack = kHeldSlackBytes + uint64_t(std::max<int64_t>(0, now - c.accepted_ns) / 1'000'000'000) * kHeldSlackBytesPerSecond;
  return taken > c.delivered + slack ? taken - c.delivered - slack : 0;
}

size_t disconnect_socket(int fd) {
  int unread = 0;
  if (ioctl(fd, SIOCINQ, &unread) != 0 || unread < 0) unread = 0;
  // connect(2) to AF_UNSPEC disconnects a TCP socket: a reset to the peer, the receive queue dropped. shutdown(2)
  // alone leaves that queue readable, and libzmq went on decoding it after a cut: up to 32x its bytes in a flood of
  // empty frames (0.73 MB queued on a loaded host took a worker 24 MB past its bound).
  sockaddr unspec{};
  unspec.sa_family = AF_UNSPEC;
  if (::connect(fd, &unspec, sizeof unspec) != 0) ::shutdown(fd, SHUT_RDWR);
  return size_t(unread);
}

void Connections::cut(int fd, Conn& c, const std::string& why, std::atomic<uint64_t>& counter) {
  // The descriptor is libzmq's: it is still this connection when its peer's address is unchanged (a descriptor closed
  // and reused since the last drain would be another connection's, with another address or port).
  sockaddr_storage now{};
  socklen_t len = sizeof now;
  const bool same = c.addr_len == 0 || (getpeername(fd, reinterpret_cast<sockaddr*>(&now), &len) == 0 &&
                                         len == c.addr_len && std::memcmp(&now, &c.addr, len) == 0);
  c.cut = true;
  if (!same) return;
  const size_t unread = disconnect_socket(fd);
  ++counter;
  if (log_)
    log_("cut the connection from " + c.name + ": " + why +
         (unread >= 100'000 ? " (" + mb(unread) + " unread in its socket dropped)" : std::string()));
}

void Connections::guard_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    cv_.wait_for(lk, std::chrono::microseconds(opt_.tick_us));
    if (stop_) break;
    lk.unlock();
    tick();
    lk.lock();
  }
}

void Connections::tick() {
  std::lock_guard<std::mutex> lk(mu_);
  drain_locked();
  const int64_t now = now_ns();
  // Too many connections: the newest go first.
  if (opt_.max_connections > 0) {
    size_t live = 0;
    for (const auto& [fd, c] : conns_) live += !c.cut;
    while (live > opt_.max_connections) {
      int newest = -1;
      for (const auto& [fd, c] : conns_)
        if (!c.cut && (newest < 0 || c.accepted_ns > conns_[newest].accepted_ns)) newest = fd;
      cut(newest, conns_[newest],
          "one connection past the most this worker takes (" + std::to_string(opt_.max_connections) + ", --max-connections)",
          counters_->cut_connections);
      --live;
    }
  }
  uint64_t total = handling_.load(std::memory_order_relaxed), most = 0;
  int most_fd = -1;
  for (const auto& [fd, c] : conns_) {
    if (c.cut) continue;
    const uint64_t h = held(fd, c, now);
    total += h;
    if (h > most) most = h, most_fd = fd;
  }
  raise_max(counters_->max_held_bytes, total);
  if (opt_.budget_bytes > 0 && total > opt_.budget_bytes && most_fd >= 0) {
    cut(most_fd, conns_[most_fd],
        "it held " + mb(most) + " of requests not yet taken; with the other connections and the request being handled, " +
            mb(total) + " over the intake budget of " + mb(opt_.budget_bytes) + " (--intake-mb)",
        counters_->cut_intake);
    return;
  }
  if (rss_bound_ == 0) return;
  size_t rss = read_statm_resident(statm_fd_);
  raise_max(counters_->max_rss_bytes, rss);
  if (rss <= rss_bound_) return;
  // Over the bound: first give freed memory back (what libzmq freed of a connection cut before may still be in the
  // heap), at most every 100 ms; then cut the connection holding the most, when it holds enough to explain the excess
  // in the worst case of libzmq's cost (64 bytes a frame for 2 on the wire): a client with a request on its way is
  // not taken for a flood of tiny frames.
  if (now - last_trim_ns_ > 100'000'000) {
    malloc_trim(0);
    last_trim_ns_ = now;
    rss = read_statm_resident(statm_fd_);
    if (rss <= rss_bound_) return;
  }
  const uint64_t need = std::max<uint64_t>(64 << 10, (rss - rss_bound_) / 32);
  if (most_fd >= 0 && most >= need)
    cut(most_fd, conns_[most_fd],
        "resident memory " + mb(rss) + " over the worker's bound of " + mb(rss_bound_) + " (docs/SECURITY.md); it held the most, " +
            mb(most) + " not yet taken",
        counters_->cut_rss);
}

}  // namespace fd
