#include "harness/bench/transport_floor.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "fastdecode/core/clock.h"
#include "fastdecode/core/error.h"
#include "harness/bench/transport_link.h"

extern char** environ;

namespace fd::bench {
namespace {

constexpr size_t kPageBytes = 4096;
constexpr size_t kMessageBytes = 64;
constexpr uint32_t kStop = UINT32_MAX;
// How long a new peer may take to start and answer first (a loaded machine can take seconds to start a process): the
// round trips' own deadline (--timeout-ms) holds from then on.
constexpr int kStartMs = 20000;
// The shared page's words (each on its own cache line): the request's sequence number (measuring side -> peer), the
// reply's (peer -> measuring side), and the peer's "ready".
constexpr size_t kRequestWord = 0, kReplyWord = 16, kReadyWord = 32;

std::atomic<uint32_t>* word(void* page, size_t i) { return static_cast<std::atomic<uint32_t>*>(page) + i; }

void futex_wake(std::atomic<uint32_t>* w) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAKE, 1, nullptr, nullptr, 0);
}
// Blocks while *w == v, at most `ms` milliseconds (< 0: no limit); whether *w changed.
bool futex_wait_while(std::atomic<uint32_t>* w, uint32_t v, int ms) {
  const int64_t end = ms < 0 ? 0 : fd::now_ns() + int64_t(ms) * 1000000;
  while (w->load(std::memory_order_acquire) == v) {
    timespec ts{0, 100 * 1000000};  // wake up now and then to check the deadline
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(w), FUTEX_WAIT, v, ms < 0 ? nullptr : &ts, nullptr, 0);
    if (ms >= 0 && w->load(std::memory_order_acquire) == v && fd::now_ns() >= end) return false;
  }
  return true;
}

std::string random_hex() {
  std::random_device rd;
  char b[17];
  std::snprintf(b, sizeof b, "%08x%08x", rd(), rd());
  return b;
}

int spawn_self(const std::vector<std::string>& args) {
  const std::string self = self_binary();
  std::vector<char*> argv{const_cast<char*>(self.c_str())};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (const int e = posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), environ); e != 0)
    FD_THROW("cannot start " << self << " floor-peer: " << std::strerror(e));
  return pid;
}

// " (the peer exited with status N / was killed by signal N)" when the peer is gone, else "": after a missed deadline,
// so it waits up to a second for a peer that is on its way out (a loaded machine can take that long to end it).
std::string peer_gone(int pid) {
  int st = 0;
  if (pid <= 0) return "";
  bool gone = false;
  for (const int64_t end = fd::now_ns() + 1000000000; !gone && fd::now_ns() < end; usleep(10000))
    gone = waitpid(pid, &st, WNOHANG) == pid;
  if (!gone) return "";
  return WIFEXITED(st) ? " (the peer exited with status " + std::to_string(WEXITSTATUS(st)) + ")"
                       : " (the peer was killed by signal " + std::to_string(WTERMSIG(st)) + ")";
}

}  // namespace

const char* floor_name(FloorMode m) { return m == FloorMode::ZmqIpc ? "zmq-ipc" : "futex-shm"; }

FloorLink::FloorLink(FloorMode m, const std::string& ipc_dir, int index, int timeout_ms, int fail_after)
    : mode_(m), timeout_ms_(timeout_ms) {
  const std::string fail = std::to_string(fail_after);
  try {
    if (m == FloorMode::ZmqIpc) {
      endpoint_ = "ipc://" + ipc_dir + "/floor-" + std::to_string(index) + ".sock";
      pid_ = spawn_self({"floor-peer", "zmq", endpoint_, fail});
      ctx_ = zmq_ctx_new();
      sock_ = zmq_socket(ctx_, ZMQ_DEALER);
      const int linger = 0;
      zmq_setsockopt(sock_, ZMQ_LINGER, &linger, sizeof linger);
      zmq_setsockopt(sock_, ZMQ_RCVTIMEO, &kStartMs, sizeof kStartMs);
      if (zmq_connect(sock_, endpoint_.c_str()) != 0) FD_THROW("zmq_connect " << endpoint_ << ": " << zmq_strerror(zmq_errno()));
      const int deadline = timeout_ms_;
      timeout_ms_ = kStartMs;
      round_trip();  // the first answer: the peer is up
      timeout_ms_ = deadline;
      zmq_setsockopt(sock_, ZMQ_RCVTIMEO, &timeout_ms_, sizeof timeout_ms_);
    } else {
      const std::string name = "/fd-floor-" + std::to_string(getpid()) + "-" + std::to_string(index) + "-" + random_hex();
      const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd < 0) FD_THROW("shm_open " << name << ": " << std::strerror(errno));
      const bool sized = ftruncate(fd, kPageBytes) == 0;
      void* p = sized ? mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
      const int err = errno;
      close(fd);
      if (p == MAP_FAILED) {
        shm_unlink(name.c_str());
        FD_THROW("cannot map " << name << ": " << std::strerror(err));
      }
      page_ = p;
      try {
        pid_ = spawn_self({"floor-peer", "futex", name, fail});
      } catch (...) {
        shm_unlink(name.c_str());
        throw;
      }
      const bool ready = futex_wait_while(word(page_, kReadyWord), 0, kStartMs);
      shm_unlink(name.c_str());  // both hold their mappings
      if (!ready) FD_THROW("floor-peer futex did not map the page within " << kStartMs << " ms" << peer_gone(pid_));
    }
  } catch (...) {
    stop();
    throw;
  }
}

FloorLink::~FloorLink() { stop(); }

double FloorLink::round_trip() {
  const int64_t t0 = fd::now_ns();
  if (mode_ == FloorMode::ZmqIpc) {
    char buf[kMessageBytes] = {};
    std::memcpy(buf, &seq_, sizeof seq_);
    if (zmq_send(sock_, buf, kMessageBytes, 0) != int(kMessageBytes)) FD_THROW("zmq_send: " << zmq_strerror(zmq_errno()));
    const int n = zmq_recv(sock_, buf, kMessageBytes, 0);
    if (n != int(kMessageBytes))
      FD_THROW("floor-peer zmq: no 64-byte echo within " << timeout_ms_ << " ms" << peer_gone(pid_));
    uint32_t back = 0;
    std::memcpy(&back, buf, sizeof back);
    FD_CHECK(back == seq_, "floor-peer zmq echoed message " << back << " for " << seq_);
    ++seq_;
  } else {
    const uint32_t s = ++seq_;
    word(page_, kRequestWord)->store(s, std::memory_order_release);
    futex_wake(word(page_, kRequestWord));
    if (!futex_wait_while(word(page_, kReplyWord), s - 1, timeout_ms_))
      FD_THROW("floor-peer futex: no answer within " << timeout_ms_ << " ms" << peer_gone(pid_));
    FD_CHECK(word(page_, kReplyWord)->load() == s, "floor-peer futex answered " << word(page_, kReplyWord)->load() << " for " << s);
  }
  return double(fd::now_ns() - t0) * 1e-9;
}

void FloorLink::stop() {
  if (sock_) {
    const char q = 'q';  // one byte: the peer's cue to exit
    zmq_send(sock_, &q, 1, ZMQ_DONTWAIT);
  }
  if (page_) {
    word(page_, kRequestWord)->store(kStop, std::memory_order_release);
    futex_wake(word(page_, kRequestWord));
  }
  if (pid_ > 0) {
    int st = 0;
    const int64_t end = fd::now_ns() + 1000000000;
    while (waitpid(pid_, &st, WNOHANG) == 0) {
      if (fd::now_ns() > end) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &st, 0);
        break;
      }
      usleep(1000);
    }
    pid_ = -1;
  }
  if (sock_) zmq_close(sock_);
  if (ctx_) zmq_ctx_term(ctx_);
  if (page_) munmap(page_, kPageBytes);
  sock_ = ctx_ = page_ = nullptr;
}

int floor_peer_main(int argc, char** argv) {
  char* end = nullptr;
  const long fail_after = argc == 4 ? std::strtol(argv[3], &end, 10) : 0;
  if ((argc != 3 && argc != 4) || (argc == 4 && (*end != 0 || fail_after < 0)) ||
      (std::strcmp(argv[1], "zmq") != 0 && std::strcmp(argv[1], "futex") != 0)) {
    std::fprintf(stderr, "usage: fd-transport-bench floor-peer zmq ENDPOINT [FAIL_AFTER] | floor-peer futex SHM_NAME "
                         "[FAIL_AFTER]\n"
                         "(started by fd-transport-bench --floors: the peer of a floor measurement)\n");
    return 2;
  }
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the measuring side
  if (std::strcmp(argv[1], "zmq") == 0) {
    void* ctx = zmq_ctx_new();
    void* s = zmq_socket(ctx, ZMQ_ROUTER);
    const int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(s, argv[2]) != 0) {
      std::fprintf(stderr, "floor-peer: zmq_bind %s: %s\n", argv[2], zmq_strerror(zmq_errno()));
      return 1;
    }
    char id[256], buf[kMessageBytes];
    int rc = 0;
    for (long answered = 0;; ++answered) {
      const int n = zmq_recv(s, id, sizeof id, 0);
      const int m = n < 0 ? -1 : zmq_recv(s, buf, sizeof buf, 0);
      if (n < 0 || m < 0) {
        rc = 1;
        break;
      }
      if (m == 1) break;  // the cue to exit
      if (fail_after > 0 && answered == fail_after) {
        rc = 3;
        break;
      }
      if (zmq_send(s, id, size_t(n), ZMQ_SNDMORE) < 0 || zmq_send(s, buf, size_t(m), 0) < 0) {
        rc = 1;
        break;
      }
    }
    zmq_close(s);
    zmq_ctx_term(ctx);
    return rc;
  }
  const int fd = shm_open(argv[2], O_RDWR, 0);
  if (fd < 0) {
    std::fprintf(stderr, "floor-peer: shm_open %s: %s\n", argv[2], std::strerror(errno));
    return 1;
  }
  void* page = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (page == MAP_FAILED) {
    std::fprintf(stderr, "floor-peer: mmap %s: %s\n", argv[2], std::strerror(errno));
    return 1;
  }
  word(page, kReadyWord)->store(1, std::memory_order_release);
  futex_wake(word(page, kReadyWord));
  int rc = 0;
  for (uint32_t seen = 0, answered = 0;; ++answered) {
    futex_wait_while(word(page, kRequestWord), seen, -1);
    seen = word(page, kRequestWord)->load(std::memory_order_acquire);
    if (seen == kStop) break;
    if (fail_after > 0 && answered == uint32_t(fail_after)) {
      rc = 3;
      break;
    }
    word(page, kReplyWord)->store(seen, std::memory_order_release);
    futex_wake(word(page, kReplyWord));
  }
  munmap(page, kPageBytes);
  return rc;
}

}  // namespace fd::bench
