// fd-transport-bench: what the S-worker <-> R-worker ZeroMQ link carries, used the way the S-worker
// will use it (DESIGN §5, BENCHMARKING "S-worker transfer" target).
//
// One step = per layer per mini-batch: the S side sends each of N links ONE multipart request
// [64-byte header][q][k][v] (total ~S bytes; q, k, v ~S/3 each, zero-copy from staging buffers that
// are reused every step) on a DEALER; each simulated R-worker (a ROUTER, in its own thread or forked
// process) answers [header][o] with o the size of q. The S side waits for all N replies. Timed: the
// step round trip (first send -> last reply). Reported: median / p90 RTT, round-trip GB/s =
// N * (request + reply bytes) / median RTT, per-link GB/s = that / N, and a single-thread memcpy of
// the same bytes as the machine's copy ceiling.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "fastdecode/core/json_util.h"
#include "fastdecode/core/cli_main.h"
#include "harness/provenance.h"

namespace {

using fd::json;
using Clock = std::chrono::steady_clock;

constexpr double kTargetPerLinkGBs = 4.0;  // BENCHMARKING.md: S-worker transfer, per R-worker link
constexpr uint32_t kMagic = 0x42544446u;   // "FDTB"
constexpr uint16_t kVersion = 1;
constexpr size_t kHeaderBytes = 64;

enum MsgType : uint16_t { kAttend = 1, kReply = 2, kShutdown = 3, kAck = 4, kError = 5 };

// The benchmark's own header (same size as the real protocol's, not its layout: this tool must not
// depend on fastdecode/protocol while that evolves).
struct Header {
  uint32_t magic = kMagic;
  uint16_t version = kVersion;
  uint16_t type = 0;
  uint64_t request_id = 0;
  uint32_t layer = 0;
  uint32_t n_frames = 0;        // frames after the header
  uint64_t payload_bytes = 0;   // sum of their sizes
  uint64_t reply_bytes = 0;     // requested reply payload (o)
  uint64_t reply_frame_max = 0; // 0: o as one frame
  uint32_t status = 0;
  uint8_t reserved[12] = {};
};
static_assert(sizeof(Header) == kHeaderBytes);

// ------------------------------------------------------------------------------------------------
// small utilities
// ------------------------------------------------------------------------------------------------

[[noreturn]] void fail(const std::string& msg) { throw std::runtime_error(msg); }

uint64_t parse_size(const std::string& s0) {
  std::string s = s0;
  while (!s.empty() && (s.back() == 'B' || s.back() == 'b' || s.back() == 'i')) s.pop_back();
  uint64_t mult = 1;
  if (!s.empty()) {
    switch (s.back()) {
      case 'K': case 'k': mult = 1ull << 10; s.pop_back(); break;
      case 'M': case 'm': mult = 1ull << 20; s.pop_back(); break;
      case 'G': case 'g': mult = 1ull << 30; s.pop_back(); break;
      default: break;
    }
  }
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
    throw fd::ConfigError("bad size '" + s0 + "' (use bytes or a K/M/G suffix, binary: 64K, 1M)");
  const uint64_t v = std::stoull(s) * mult;
  if (v == 0) throw fd::ConfigError("size '" + s0 + "' must be > 0");
  return v;
}

std::string size_label(uint64_t b) {
  char buf[32];
  if (b % (1ull << 30) == 0) std::snprintf(buf, sizeof buf, "%" PRIu64 "G", b >> 30);
  else if (b % (1ull << 20) == 0) std::snprintf(buf, sizeof buf, "%" PRIu64 "M", b >> 20);
  else if (b % (1ull << 10) == 0) std::snprintf(buf, sizeof buf, "%" PRIu64 "K", b >> 10);
  else std::snprintf(buf, sizeof buf, "%" PRIu64, b);
  return buf;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double percentile(std::vector<double> v, double p) {  // linear interpolation between order statistics
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = p / 100.0 * double(v.size() - 1);
  const size_t lo = size_t(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}

// Page-aligned, touched buffer (so first-use page faults are not timed and fork shares nothing lazily).
struct Buffer {
  std::unique_ptr<uint8_t, void (*)(void*)> p{nullptr, std::free};
  size_t n = 0;
  explicit Buffer(size_t bytes, uint8_t fill = 0x5a) : n(bytes) {
    void* q = nullptr;
    if (posix_memalign(&q, 4096, std::max<size_t>(bytes, 1)) != 0) fail("out of memory allocating " + std::to_string(bytes) + " bytes");
    p.reset(static_cast<uint8_t*>(q));
    std::memset(q, fill, bytes);
  }
  uint8_t* data() { return p.get(); }
};

// Splits `bytes` into frames of at most `frame_max` (0: one frame).
std::vector<size_t> split_frames(size_t bytes, size_t frame_max) {
  std::vector<size_t> out;
  if (frame_max == 0 || bytes <= frame_max) {
    out.push_back(bytes);
    return out;
  }
  for (size_t off = 0; off < bytes; off += frame_max) out.push_back(std::min(frame_max, bytes - off));
  return out;
}

// ---- the ipc temp dir, removed at exit (also on SIGINT/SIGTERM) ---------------------------------

char g_ipc_dir[512] = {0};
volatile sig_atomic_t g_cfg_index = 0;  // the configuration running now (its ipc files: c<index>-l<i>.sock)

void remove_ipc_dir() {
  if (!g_ipc_dir[0]) return;
  std::error_code ec;
  std::filesystem::remove_all(g_ipc_dir, ec);
  g_ipc_dir[0] = 0;
}

extern "C" void on_fatal_signal(int sig) {
  // Async-signal-safe clean-up of the ipc dir: the running configuration's socket files are
  // <dir>/c<N>-l<i>.sock (earlier ones were unlinked when their sockets closed). Children die with
  // us (PR_SET_PDEATHSIG).
  if (g_ipc_dir[0]) {
    char path[640];
    size_t n = 0;
    for (const char* p = g_ipc_dir; *p && n < 512; ++p) path[n++] = *p;
    auto put_int = [&](long v) {
      char d[24];
      int k = 0;
      do { d[k++] = char('0' + v % 10); v /= 10; } while (v > 0);
      while (k > 0) path[n++] = d[--k];
    };
    const long cfg = g_cfg_index;
    for (long i = 0; i < 64; ++i) {
      size_t m = n;
      path[n++] = '/'; path[n++] = 'c';
      put_int(cfg);
      path[n++] = '-'; path[n++] = 'l';
      put_int(i);
      const char* suf = ".sock";
      while (*suf) path[n++] = *suf++;
      path[n] = 0;
      unlink(path);
      n = m;
    }
    (void)!rmdir(g_ipc_dir);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

// ------------------------------------------------------------------------------------------------
// configuration
// ------------------------------------------------------------------------------------------------

struct Options {
  std::vector<std::string> sizes{"64K", "256K", "1M", "4M", "16M", "32M"};
  std::vector<std::string> transports{"tcp", "ipc", "inproc"};
  std::vector<std::string> framings{"tensor", "split"};
  std::string frame_max_s = "1M";
  std::vector<int> io_threads{1, 4};
  std::vector<int> links{1, 2, 4};
  double time_s = 0.3;
  double warmup_s = 0.05;
  int warmup_reps = 3;
  int min_reps = 5;
  int max_reps = 1000000;
  std::string server = "auto";
  bool process_flag = false;
  int timeout_ms = 10000;
  int sockbuf = -1;
  int fail_server_after = 0;
  bool quick = false;
  std::string json_out;
  bool quiet = false;
};

struct Config {
  std::string transport;   // tcp | ipc | inproc
  bool process = false;    // server side in forked processes
  std::string framing;     // tensor | split | whole
  size_t frame_max = 0;    // split only
  int io_threads = 1;
  int links = 1;
  uint64_t size = 0;       // nominal request size S
  size_t tensor_bytes = 0; // q, k, v, o each
};

struct Result {
  Config cfg;
  size_t request_bytes = 0, reply_bytes = 0;  // per link, header included
  size_t request_frames = 0, reply_frames = 0;
  int warmup_reps = 0, reps = 0;
  double measured_s = 0;
  double med_us = 0, p90_us = 0, min_us = 0, mean_us = 0, max_us = 0;
  double gbps = 0, gbps_link = 0;
  int64_t frees_pending_at_reply = 0;  // steps where a zero-copy frame was not yet released when the reply came
  double free_wait_us_total = 0;
  double memcpy_gbps = 0;
};

// ------------------------------------------------------------------------------------------------
// the R side: one ROUTER per link
// ------------------------------------------------------------------------------------------------

struct ServerParams {
  size_t reply_buf_bytes = 0;
  size_t max_frame_bytes = 0;
  int fail_after = 0;  // testing: stop answering (process: exit 3) after this many requests
};

void set_common(zmq::socket_t& s, int sockbuf) {
  s.set(zmq::sockopt::linger, 0);
  if (sockbuf > 0) {
    s.set(zmq::sockopt::sndbuf, sockbuf);
    s.set(zmq::sockopt::rcvbuf, sockbuf);
  }
}

// Serves until SHUTDOWN, until *stop, or until the parent process dies. Validates every request.
void serve(zmq::socket_t& sock, const ServerParams& sp, const std::atomic<bool>* stop, pid_t parent) {
  Buffer reply(sp.reply_buf_bytes, 0x33);  // o: constant content, so zero-copy sends need no release tracking
  int served = 0;
  for (;;) {
    zmq::pollitem_t item{static_cast<void*>(sock), 0, ZMQ_POLLIN, 0};
    int rc;
    try {
      rc = zmq::poll(&item, 1, std::chrono::milliseconds(100));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      if (e.num() == ETERM) return;
      throw;
    }
    if (rc == 0) {
      if (stop && stop->load()) return;
      if (parent > 0 && getppid() != parent) return;
      continue;
    }
    std::vector<zmq::message_t> parts;
    for (;;) {
      zmq::message_t m;
      std::optional<size_t> r;
      try {
        r = sock.recv(m, zmq::recv_flags::none);
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        if (e.num() == ETERM) return;
        throw;
      }
      if (!r) break;
      const bool more = m.more();
      parts.push_back(std::move(m));
      if (!more) break;
    }
    if (parts.size() < 2) continue;  // no identity + header: drop
    zmq::message_t identity = std::move(parts[0]);
    Header in{};
    Header out{};
    std::string err;
    if (parts[1].size() != kHeaderBytes) err = "header frame of " + std::to_string(parts[1].size()) + " bytes";
    else {
      std::memcpy(&in, parts[1].data(), kHeaderBytes);
      if (in.magic != kMagic || in.version != kVersion) err = "bad magic/version";
    }
    size_t payload = 0;
    for (size_t i = 2; i < parts.size(); ++i) payload += parts[i].size();
    if (err.empty() && in.type == kAttend) {
      if (in.n_frames != parts.size() - 2) err = "frame count differs from the header";
      else if (in.payload_bytes != payload) err = "payload bytes differ from the header";
      else if (in.reply_bytes > reply.n) err = "reply larger than the server's buffer";
    }
    out.request_id = in.request_id;
    out.layer = in.layer;
    parts.clear();  // release the request (inproc: this is what releases the S side's staging buffers)
    if (err.empty() && in.type == kShutdown) {
      out.type = kAck;
      sock.send(identity, zmq::send_flags::sndmore);
      sock.send(zmq::buffer(&out, kHeaderBytes), zmq::send_flags::none);
      return;
    }
    if (err.empty() && in.type != kAttend) err = "unknown message type " + std::to_string(in.type);
    if (!err.empty()) {
      out.type = kError;
      out.status = 1;
      sock.send(identity, zmq::send_flags::sndmore);
      sock.send(zmq::buffer(&out, kHeaderBytes), zmq::send_flags::sndmore);
      sock.send(zmq::buffer(err), zmq::send_flags::none);
      continue;
    }
    if (sp.fail_after > 0 && ++served > sp.fail_after) {
      if (parent > 0) _exit(3);  // a dying R-worker
      return;                    // thread: stop answering
    }
    const auto frames = split_frames(in.reply_bytes, in.reply_frame_max);
    out.type = kReply;
    out.n_frames = uint32_t(frames.size());
    out.payload_bytes = in.reply_bytes;
    sock.send(identity, zmq::send_flags::sndmore);
    sock.send(zmq::buffer(&out, kHeaderBytes), zmq::send_flags::sndmore);
    size_t off = 0;
    for (size_t i = 0; i < frames.size(); ++i) {
      zmq::message_t m(reply.data() + off, frames[i], nullptr, nullptr);  // zero-copy, constant
      off += frames[i];
      sock.send(m, i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }
}

std::string bind_router(zmq::socket_t& sock, const std::string& endpoint, const ServerParams& sp, int sockbuf) {
  set_common(sock, sockbuf);
  sock.set(zmq::sockopt::maxmsgsize, int64_t(sp.max_frame_bytes + 4096));  // untrusted input: bound each frame
  sock.bind(endpoint);
  return sock.get(zmq::sockopt::last_endpoint);
}

// A set of N simulated R-workers for one configuration: forked processes or threads.
class Servers {
 public:
  Servers(const Config& c, const ServerParams& sp, zmq::context_t* client_ctx, int sockbuf, int cfg_index)
      : process_(c.process) {
    try {
      start(c, sp, client_ctx, sockbuf, cfg_index);
    } catch (...) {
      stop(false);
      throw;
    }
  }
  ~Servers() { stop(false); }

  void start(const Config& c, const ServerParams& sp, zmq::context_t* client_ctx, int sockbuf, int cfg_index) {
    for (int i = 0; i < c.links; ++i) {
      std::string ep;
      if (c.transport == "tcp") ep = "tcp://127.0.0.1:*";
      else if (c.transport == "ipc") {
        ep = "ipc://" + std::string(g_ipc_dir) + "/c" + std::to_string(cfg_index) + "-l" + std::to_string(i) + ".sock";
      } else ep = "inproc://fdtb-" + std::to_string(cfg_index) + "-" + std::to_string(i);
      endpoints_.push_back(process_ ? spawn_process(ep, c.io_threads, sp, sockbuf) : spawn_thread(ep, c, sp, client_ctx, sockbuf));
    }
  }

  const std::vector<std::string>& endpoints() const { return endpoints_; }

  // Why link i stopped answering, if its process is gone ("" if it looks alive).
  std::string diagnose(int i) {
    if (!process_) return "server thread alive but silent";
    if (i >= int(pids_.size()) || pids_[i] == 0) return "";
    int st = 0;
    const pid_t r = waitpid(pids_[i], &st, WNOHANG);
    if (r == pids_[i]) {
      pids_[i] = -pids_[i];
      statuses_.resize(pids_.size(), 0);
      statuses_[i] = st;
    }
    if (pids_[i] < 0) {
      const int s = statuses_.size() > size_t(i) ? statuses_[i] : 0;
      if (WIFEXITED(s)) return "server process " + std::to_string(-pids_[i]) + " exited with status " + std::to_string(WEXITSTATUS(s));
      if (WIFSIGNALED(s)) return "server process " + std::to_string(-pids_[i]) + " was killed by signal " + std::to_string(WTERMSIG(s));
      return "server process " + std::to_string(-pids_[i]) + " is gone";
    }
    return "server process " + std::to_string(pids_[i]) + " is alive but silent";
  }

  // Threads: stop and join. Processes: graceful: wait for each to exit after SHUTDOWN (up to 2 s),
  // then kill; otherwise kill at once.
  void stop(bool graceful) {
    stop_flag_.store(true);
    for (auto& t : threads_) if (t.joinable()) t.join();
    threads_.clear();
    for (auto& p : pids_) {
      if (p <= 0) continue;
      const auto t0 = Clock::now();
      int st = 0;
      while (waitpid(p, &st, WNOHANG) == 0) {
        if (!graceful || seconds_since(t0) > 2.0) {
          kill(p, SIGKILL);
          waitpid(p, &st, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      p = -p;
    }
  }

 private:
  std::string spawn_process(const std::string& ep, int io_threads, const ServerParams& sp, int sockbuf) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) fail(std::string("pipe: ") + std::strerror(errno));
    std::fflush(nullptr);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) fail(std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {  // the R-worker: no zmq state is inherited (the parent holds no context while forking)
      close(fds[0]);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(4);
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      int code = 0;
      try {
        zmq::context_t ctx(io_threads);
        {
          zmq::socket_t sock(ctx, zmq::socket_type::router);
          const std::string got = bind_router(sock, ep, sp, sockbuf) + "\n";
          if (write(fds[1], got.data(), got.size()) != ssize_t(got.size())) _exit(5);
          close(fds[1]);
          serve(sock, sp, nullptr, parent);
        }
        ctx.close();
      } catch (const std::exception& e) {
        const std::string msg = std::string("ERR ") + e.what() + "\n";
        (void)!write(fds[1], msg.data(), msg.size());
        code = 2;
      }
      _exit(code);
    }
    close(fds[1]);
    pids_.push_back(pid);
    // Read the bound endpoint (one line) with a deadline: a child that dies gives EOF.
    std::string line;
    const auto t0 = Clock::now();
    while (line.empty() || line.back() != '\n') {
      pollfd pf{fds[0], POLLIN, 0};
      const int left = int(10000 - seconds_since(t0) * 1000);
      if (left <= 0) { close(fds[0]); fail("server process did not report its endpoint within 10 s (" + ep + ")"); }
      const int r = ::poll(&pf, 1, left);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) continue;
      char buf[512];
      const ssize_t n = read(fds[0], buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      line.append(buf, size_t(n));
    }
    close(fds[0]);
    if (line.rfind("ERR ", 0) == 0 || line.empty() || line.back() != '\n') {
      while (!line.empty() && line.back() == '\n') line.pop_back();
      fail("server process for " + ep + " failed to start: " + (line.empty() ? "exited early" : line.substr(4)));
    }
    line.pop_back();
    return line;
  }

  std::string spawn_thread(const std::string& ep, const Config& c, const ServerParams& sp, zmq::context_t* client_ctx,
                           int sockbuf) {
    auto prom = std::make_shared<std::promise<std::string>>();
    auto fut = prom->get_future();
    const bool own_ctx = c.transport != "inproc";  // inproc needs the client's context
    const int io = c.io_threads;
    threads_.emplace_back([=, this]() {
      std::unique_ptr<zmq::context_t> own;
      zmq::context_t* ctx = client_ctx;
      bool reported = false;
      try {
        if (own_ctx) { own = std::make_unique<zmq::context_t>(io); ctx = own.get(); }
        {
          zmq::socket_t sock(*ctx, zmq::socket_type::router);
          prom->set_value(bind_router(sock, ep, sp, sockbuf));
          reported = true;
          serve(sock, sp, &stop_flag_, 0);
        }
        if (own) own->close();
      } catch (...) {
        if (!reported) prom->set_exception(std::current_exception());
        else std::fprintf(stderr, "fd-transport-bench: server thread: unexpected error\n");
      }
    });
    if (fut.wait_for(std::chrono::seconds(10)) != std::future_status::ready) fail("server thread did not bind within 10 s");
    return fut.get();
  }

  bool process_;
  std::vector<std::string> endpoints_;
  std::vector<pid_t> pids_;
  std::vector<int> statuses_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_flag_{false};
};

// ------------------------------------------------------------------------------------------------
// the S side
// ------------------------------------------------------------------------------------------------

extern "C" void release_frame(void* /*data*/, void* hint) {
  static_cast<std::atomic<int64_t>*>(hint)->fetch_sub(1, std::memory_order_acq_rel);
}

struct Link {
  std::unique_ptr<zmq::socket_t> sock;
  std::string endpoint;
  Buffer staging;                       // q | k | v, contiguous; reused every step
  std::atomic<int64_t> outstanding{0};  // zero-copy frames not yet released by libzmq
  bool replied = false;
  explicit Link(size_t bytes) : staging(bytes) {}
};

class Client {
 public:
  Client(const Config& c, zmq::context_t& ctx, const std::vector<std::string>& endpoints, int timeout_ms, int sockbuf)
      : c_(c), timeout_ms_(timeout_ms) {
    if (c.framing == "whole") {
      req_frames_ = split_frames(3 * c.tensor_bytes, 0);
    } else {
      const size_t fm = c.framing == "split" ? c.frame_max : 0;
      for (int t = 0; t < 3; ++t)
        for (size_t f : split_frames(c.tensor_bytes, fm)) req_frames_.push_back(f);
    }
    reply_frame_max_ = c.framing == "split" ? c.frame_max : 0;
    for (size_t i = 0; i < endpoints.size(); ++i) {
      auto l = std::make_unique<Link>(3 * c.tensor_bytes);
      l->sock = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::dealer);
      set_common(*l->sock, sockbuf);
      l->sock->set(zmq::sockopt::sndtimeo, timeout_ms);
      l->sock->set(zmq::sockopt::maxmsgsize, int64_t(c.tensor_bytes + 4096));
      l->sock->connect(endpoints[i]);
      l->endpoint = endpoints[i];
      links_.push_back(std::move(l));
    }
  }
  ~Client() { close(); }
  void close() {
    for (auto& l : links_) if (l->sock) l->sock->close();
  }

  size_t request_bytes() const {
    size_t b = kHeaderBytes;
    for (size_t f : req_frames_) b += f;
    return b;
  }
  size_t reply_bytes() const { return kHeaderBytes + c_.tensor_bytes; }
  size_t request_frames() const { return 1 + req_frames_.size(); }
  size_t reply_frames() const { return 1 + split_frames(c_.tensor_bytes, reply_frame_max_).size(); }

  // One step: send to every link, wait for every reply. Returns the round trip in seconds.
  // `diagnose(i)` explains a silent link in the timeout error.
  template <class Diag>
  double step(uint64_t id, Diag&& diagnose) {
    // Staging-buffer reuse rule: a buffer is refilled only after libzmq released every frame sent
    // from it. In a request/reply loop the reply proves the bytes were read; the release may lag a
    // little (I/O thread), so wait for it here and count the waits.
    for (auto& l : links_) wait_released(*l);
    const auto t0 = Clock::now();
    for (auto& l : links_) {
      Header h{};
      h.type = kAttend;
      h.request_id = id;
      h.n_frames = uint32_t(req_frames_.size());
      h.payload_bytes = 3 * c_.tensor_bytes;
      h.reply_bytes = c_.tensor_bytes;
      h.reply_frame_max = reply_frame_max_;
      send_checked(*l, zmq::message_t(&h, kHeaderBytes), true);
      size_t off = 0;
      for (size_t i = 0; i < req_frames_.size(); ++i) {
        l->outstanding.fetch_add(1, std::memory_order_acq_rel);
        zmq::message_t m(l->staging.data() + off, req_frames_[i], release_frame, &l->outstanding);
        off += req_frames_[i];
        send_checked(*l, std::move(m), i + 1 < req_frames_.size());
      }
      l->replied = false;
    }
    const auto deadline = t0 + std::chrono::milliseconds(timeout_ms_);
    size_t pending = links_.size();
    std::vector<zmq::pollitem_t> items(links_.size());
    while (pending > 0) {
      for (size_t i = 0; i < links_.size(); ++i) items[i] = {static_cast<void*>(*links_[i]->sock), 0, short(links_[i]->replied ? 0 : ZMQ_POLLIN), 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        std::string who;
        for (size_t i = 0; i < links_.size(); ++i) {
          if (links_[i]->replied) continue;
          const std::string d = diagnose(int(i));
          who += (who.empty() ? "" : "; ") + ("link " + std::to_string(i) + " (" + links_[i]->endpoint + ")") + (d.empty() ? "" : ": " + d);
        }
        fail("no reply within " + std::to_string(timeout_ms_) + " ms (--timeout-ms) from " + who);
      }
      int rc;
      try {
        rc = zmq::poll(items.data(), items.size(), left);
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        throw;
      }
      if (rc <= 0) continue;
      for (size_t i = 0; i < links_.size(); ++i) {
        if (links_[i]->replied || !(items[i].revents & ZMQ_POLLIN)) continue;
        receive_reply(*links_[i], id);
        links_[i]->replied = true;
        --pending;
      }
    }
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    for (auto& l : links_)
      if (l->outstanding.load(std::memory_order_acquire) != 0) { ++frees_pending_; break; }
    return dt;
  }

  int64_t frees_pending() const { return frees_pending_; }
  double free_wait_s() const { return free_wait_s_; }
  void reset_counters() { frees_pending_ = 0; free_wait_s_ = 0; }

  void shutdown_servers() {  // best effort: ask each server to exit, wait for the ack briefly
    for (auto& l : links_) {
      Header h{};
      h.type = kShutdown;
      try {
        if (!l->sock->send(zmq::message_t(&h, kHeaderBytes), zmq::send_flags::dontwait)) continue;
        zmq::pollitem_t it{static_cast<void*>(*l->sock), 0, ZMQ_POLLIN, 0};
        if (zmq::poll(&it, 1, std::chrono::milliseconds(2000)) > 0) {
          zmq::message_t m;
          while (l->sock->recv(m, zmq::recv_flags::dontwait) && m.more()) {}
        }
      } catch (const zmq::error_t&) {
      }
    }
  }

 private:
  void wait_released(Link& l) {
    if (l.outstanding.load(std::memory_order_acquire) == 0) return;
    const auto t0 = Clock::now();
    while (l.outstanding.load(std::memory_order_acquire) != 0) {
      if (seconds_since(t0) * 1000 > timeout_ms_) fail("libzmq did not release a sent staging buffer within --timeout-ms (" + l.endpoint + ")");
      std::this_thread::yield();
    }
    free_wait_s_ += seconds_since(t0);
  }

  void send_checked(Link& l, zmq::message_t&& m, bool more) {
    for (;;) {
      try {
        if (!l.sock->send(m, more ? zmq::send_flags::sndmore : zmq::send_flags::none))
          fail("send to " + l.endpoint + " blocked for --timeout-ms (" + std::to_string(timeout_ms_) + " ms)");
        return;
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        fail("send to " + l.endpoint + ": " + e.what());
      }
    }
  }

  void receive_reply(Link& l, uint64_t id) {
    std::vector<zmq::message_t> parts;
    for (;;) {
      zmq::message_t m;
      std::optional<size_t> r;
      try {
        r = l.sock->recv(m, zmq::recv_flags::dontwait);
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        fail("receive from " + l.endpoint + ": " + e.what());
      }
      if (!r) fail("incomplete reply from " + l.endpoint);
      const bool more = m.more();
      parts.push_back(std::move(m));
      if (!more) break;
    }
    Header h{};
    if (parts[0].size() != kHeaderBytes) fail("reply from " + l.endpoint + ": bad header frame");
    std::memcpy(&h, parts[0].data(), kHeaderBytes);
    if (h.magic != kMagic || h.version != kVersion) fail("reply from " + l.endpoint + ": bad magic/version");
    if (h.type == kError)
      fail("server " + l.endpoint + " answered ERROR: " + (parts.size() > 1 ? parts[1].to_string() : std::string("?")));
    size_t payload = 0;
    for (size_t i = 1; i < parts.size(); ++i) payload += parts[i].size();
    if (h.type != kReply || h.request_id != id || payload != c_.tensor_bytes || h.payload_bytes != payload ||
        h.n_frames != parts.size() - 1)
      fail("reply from " + l.endpoint + " does not match the request (type " + std::to_string(h.type) + ", id " +
           std::to_string(h.request_id) + "/" + std::to_string(id) + ", " + std::to_string(payload) + " bytes)");
  }

  Config c_;
  int timeout_ms_;
  std::vector<size_t> req_frames_;
  size_t reply_frame_max_ = 0;
  std::vector<std::unique_ptr<Link>> links_;
  int64_t frees_pending_ = 0;
  double free_wait_s_ = 0;
};

// Single-thread memcpy of `bytes` (the copy ceiling of one core; TCP/IPC loopback copy each byte at
// least twice: user -> kernel -> user).
double memcpy_gbps(size_t bytes, double time_s) {
  Buffer a(bytes, 1), b(bytes, 2);
  std::vector<double> ts;
  const auto t0 = Clock::now();
  while (ts.size() < 3 || (seconds_since(t0) < time_s && ts.size() < 100000)) {
    const auto s = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    ts.push_back(seconds_since(s));
    std::swap(a, b);
  }
  return double(bytes) / percentile(ts, 50) / 1e9;
}

Result run_config(const Config& c, const Options& o, int cfg_index) {
  ServerParams sp;
  sp.reply_buf_bytes = c.tensor_bytes;
  sp.max_frame_bytes = c.framing == "whole" ? 3 * c.tensor_bytes : c.tensor_bytes;
  sp.fail_after = o.fail_server_after;
  Result r;
  r.cfg = c;
  // Fork (process servers) before the client's context exists: no zmq threads cross a fork.
  // Declared before `servers` so that on an error the servers stop (threads join) before it goes.
  std::optional<zmq::context_t> ctx;
  std::unique_ptr<Servers> servers;
  g_cfg_index = cfg_index;
  if (c.process) servers = std::make_unique<Servers>(c, sp, nullptr, o.sockbuf, cfg_index);
  ctx.emplace(c.io_threads);
  {
    if (!c.process) servers = std::make_unique<Servers>(c, sp, &*ctx, o.sockbuf, cfg_index);
    Client cl(c, *ctx, servers->endpoints(), o.timeout_ms, o.sockbuf);
    r.request_bytes = cl.request_bytes();
    r.reply_bytes = cl.reply_bytes();
    r.request_frames = cl.request_frames();
    r.reply_frames = cl.reply_frames();
    auto diag = [&](int i) { return servers->diagnose(i); };
    uint64_t id = 1;
    const auto w0 = Clock::now();
    while (r.warmup_reps < o.warmup_reps || seconds_since(w0) < o.warmup_s) {
      cl.step(id++, diag);
      ++r.warmup_reps;
    }
    cl.reset_counters();
    std::vector<double> ts;
    const auto m0 = Clock::now();
    while ((int(ts.size()) < o.min_reps || seconds_since(m0) < o.time_s) && int(ts.size()) < o.max_reps)
      ts.push_back(cl.step(id++, diag));
    r.measured_s = seconds_since(m0);
    r.reps = int(ts.size());
    r.frees_pending_at_reply = cl.frees_pending();
    r.free_wait_us_total = cl.free_wait_s() * 1e6;
    for (auto& t : ts) t *= 1e6;
    r.med_us = percentile(ts, 50);
    r.p90_us = percentile(ts, 90);
    r.min_us = *std::min_element(ts.begin(), ts.end());
    r.max_us = *std::max_element(ts.begin(), ts.end());
    double s = 0;
    for (double t : ts) s += t;
    r.mean_us = s / double(ts.size());
    const double bytes = double(c.links) * double(r.request_bytes + r.reply_bytes);
    r.gbps = bytes / (r.med_us * 1e-6) / 1e9;
    r.gbps_link = r.gbps / c.links;
    if (c.process) cl.shutdown_servers();
    cl.close();
  }
  servers->stop(true);  // joins server threads (inproc ones use ctx) before the context goes
  servers.reset();
  ctx->close();
  return r;
}

json result_json(const Result& r) {
  const Config& c = r.cfg;
  return {
      {"transport", c.transport},
      {"server", c.process ? "process" : "thread"},
      {"framing", c.framing},
      {"frame_max_bytes", c.framing == "split" ? json(c.frame_max) : json(nullptr)},
      {"io_threads", c.io_threads},
      {"links", c.links},
      {"size_label", size_label(c.size)},
      {"size_bytes", c.size},
      {"tensor_bytes", c.tensor_bytes},
      {"request_bytes", r.request_bytes},
      {"reply_bytes", r.reply_bytes},
      {"request_frames", r.request_frames},
      {"reply_frames", r.reply_frames},
      {"bytes_per_step", uint64_t(c.links) * (r.request_bytes + r.reply_bytes)},
      {"warmup_reps", r.warmup_reps},
      {"reps", r.reps},
      {"measured_s", r.measured_s},
      {"rtt_us", {{"median", r.med_us}, {"p90", r.p90_us}, {"min", r.min_us}, {"mean", r.mean_us}, {"max", r.max_us}}},
      {"gbps_round_trip", r.gbps},
      {"gbps_per_link", r.gbps_link},
      // inproc passes pointers: no bytes move, so the target does not apply.
      {"meets_target", c.transport == "inproc" ? json(nullptr) : json(r.gbps_link >= kTargetPerLinkGBs)},
      {"memcpy_gbps", r.memcpy_gbps},
      {"zero_copy", {{"steps_with_release_pending_at_reply", r.frees_pending_at_reply},
                     {"release_wait_us_total", r.free_wait_us_total}}},
  };
}

void print_header(bool quiet) {
  if (quiet) return;
  std::printf("%-6s %-7s %-11s %2s %5s %5s %10s %6s %10s %10s %8s %9s %8s %s\n", "trans", "server", "framing", "io",
              "links", "size", "req_B/link", "reps", "med_us", "p90_us", "GB/s", "GB/s/link", "memcpy", "target");
}

void print_row(const Result& r, bool quiet) {
  if (quiet) return;
  const Config& c = r.cfg;
  std::string fr = c.framing;
  if (c.framing == "split") fr.append(":").append(size_label(c.frame_max));
  std::printf("%-6s %-7s %-11s %2d %5d %5s %10zu %6d %10.1f %10.1f %8.2f %9.2f %8.1f %s\n", c.transport.c_str(),
              c.process ? "process" : "thread", fr.c_str(), c.io_threads, c.links, size_label(c.size).c_str(),
              r.request_bytes, r.reps, r.med_us, r.p90_us, r.gbps, r.gbps_link, r.memcpy_gbps,
              c.transport == "inproc" ? "n/a" : r.gbps_link >= kTargetPerLinkGBs ? "ok" : "below");
  std::fflush(stdout);
}

int bench_main(Options o, CLI::App& app, const std::string& cmdline) {
  // --quick: a smaller grid and shorter timings unless the option was given explicitly.
  if (o.quick) {
    if (app.count("--sizes") == 0) o.sizes = {"64K", "1M", "4M", "32M"};
    if (app.count("--io-threads") == 0) o.io_threads = {1};
    if (app.count("--links") == 0) o.links = {1, 2};
    if (app.count("--time") == 0) o.time_s = 0.05;
    if (app.count("--warmup-time") == 0) o.warmup_s = 0.01;
    if (app.count("--warmup-reps") == 0) o.warmup_reps = 2;
    if (app.count("--min-reps") == 0) o.min_reps = 3;
  }
  if (o.process_flag) o.server = "process";
  std::vector<uint64_t> sizes;
  for (const auto& s : o.sizes) sizes.push_back(parse_size(s));
  const size_t frame_max = parse_size(o.frame_max_s);
  for (const auto& t : o.transports)
    if (t != "tcp" && t != "ipc" && t != "inproc") throw fd::ConfigError("unknown transport '" + t + "' (tcp, ipc, inproc)");
  for (const auto& f : o.framings)
    if (f != "tensor" && f != "split" && f != "whole") throw fd::ConfigError("unknown framing '" + f + "' (tensor, split, whole)");
  for (int n : o.io_threads) if (n < 1 || n > 64) throw fd::ConfigError("--io-threads values must be in 1..64");
  for (int n : o.links) if (n < 1 || n > 64) throw fd::ConfigError("--links values must be in 1..64");
  for (uint64_t s : sizes) if (s < 3 * 64 + kHeaderBytes) throw fd::ConfigError("sizes must be >= 256 bytes");

  // ipc endpoints live in a fresh temp dir, removed at exit.
  if (std::find(o.transports.begin(), o.transports.end(), "ipc") != o.transports.end()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/fdtb-XXXXXX";
    if (tmpl.size() + 24 > 100) tmpl = "/tmp/fdtb-XXXXXX";  // sun_path is ~107 bytes
    std::vector<char> b(tmpl.begin(), tmpl.end());
    b.push_back(0);
    if (!mkdtemp(b.data())) throw std::runtime_error(std::string("mkdtemp: ") + std::strerror(errno));
    std::snprintf(g_ipc_dir, sizeof g_ipc_dir, "%s", b.data());
    std::atexit(remove_ipc_dir);
  }
  struct DirGuard { ~DirGuard() { remove_ipc_dir(); } } dir_guard;

  int major = 0, minor = 0, patch = 0;
  zmq_version(&major, &minor, &patch);
  const std::string zmqv = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
  if (!o.quiet) {
    std::printf("fd-transport-bench: libzmq %s; step = one multipart request (header + q,k,v; ~S bytes) per link, reply o (~S/3)\n",
                zmqv.c_str());
    std::printf("target: >= %.1f GB/s per link on loopback (shared/BENCHMARKING.md, S-worker transfer); "
                "GB/s = links * (request + reply bytes) / median RTT; memcpy = 1-thread copy of the same bytes\n",
                kTargetPerLinkGBs);
    std::printf("timing: >= %.2f s and >= %d reps per config after >= %d warm-up reps (%.2f s)\n", o.time_s, o.min_reps,
                o.warmup_reps, o.warmup_s);
  }

  std::vector<Result> results;
  std::vector<std::pair<uint64_t, double>> memcpy_cache;
  int cfg_index = 0;
  for (const auto& tr : o.transports) {
    const bool proc = tr != "inproc" && (o.server == "process" || o.server == "auto");
    if (tr == "inproc" && o.server == "process" && !o.quiet)
      std::printf("note: inproc needs one process: its server runs in a thread\n");
    print_header(o.quiet);
    for (const auto& fr : o.framings)
      for (size_t ii = 0; ii < o.io_threads.size(); ++ii) {
        // inproc uses no I/O threads: one io_threads value is enough.
        if (tr == "inproc" && ii > 0) continue;
        for (int nl : o.links)
          for (uint64_t s : sizes) {
            Config c;
            c.transport = tr;
            c.process = proc;
            c.framing = fr;
            c.frame_max = frame_max;
            c.io_threads = o.io_threads[ii];
            c.links = nl;
            c.size = s;
            c.tensor_bytes = std::max<size_t>(64, (s - kHeaderBytes) / 3 / 64 * 64);
            Result r = run_config(c, o, cfg_index++);
            const uint64_t step_bytes = uint64_t(nl) * (r.request_bytes + r.reply_bytes);
            auto it = std::find_if(memcpy_cache.begin(), memcpy_cache.end(), [&](auto& p) { return p.first == step_bytes; });
            if (it == memcpy_cache.end()) {
              memcpy_cache.emplace_back(step_bytes, memcpy_gbps(step_bytes, std::min(0.05, o.time_s)));
              it = memcpy_cache.end() - 1;
            }
            r.memcpy_gbps = it->second;
            print_row(r, o.quiet);
            results.push_back(r);
          }
      }
  }

  if (!o.quiet) {
    double best = 0;
    const Result* bp = nullptr;
    for (const auto& r : results)
      if (r.cfg.transport != "inproc" && r.gbps_link > best) { best = r.gbps_link; bp = &r; }
    if (bp)
      std::printf("best tcp/ipc per link: %.2f GB/s (%s, %s, io %d, %d links, %s) vs target %.1f GB/s: %s\n", best,
                  bp->cfg.transport.c_str(), bp->cfg.framing.c_str(), bp->cfg.io_threads, bp->cfg.links,
                  size_label(bp->cfg.size).c_str(), kTargetPerLinkGBs, best >= kTargetPerLinkGBs ? "met" : "NOT met");
    std::printf("inproc passes pointers (no copy): it is the library's overhead ceiling, not a transport.\n");
  }

  if (!o.json_out.empty()) {
    json out;
    out["tool"] = "fd-transport-bench";
    json prov = fd::collect_provenance(cmdline);
    prov["zmq_version"] = zmqv;
    out["provenance"] = prov;
    out["target"] = {{"gbps_per_link", kTargetPerLinkGBs}, {"source", "shared/BENCHMARKING.md (S-worker transfer, loopback)"}};
    out["method"] = {
        {"step", "per link one multipart request [64 B header][q][k][v] (zero-copy from a reused staging buffer) on DEALER; "
                 "ROUTER replies [64 B header][o], |o| = |q|; the step ends when all links replied"},
        {"gbps_round_trip", "bytes_per_step / rtt_us.median / 1e3; bytes_per_step = links * (request_bytes + reply_bytes)"},
        {"gbps_per_link", "gbps_round_trip / links"},
        {"memcpy_gbps", "single-thread memcpy of bytes_per_step, median"},
        {"size_units", "K = 1024, M = 1048576"},
    };
    out["params"] = {{"sizes", o.sizes},         {"transports", o.transports}, {"framings", o.framings},
                     {"frame_max_bytes", frame_max}, {"io_threads", o.io_threads}, {"links", o.links},
                     {"time_s", o.time_s},       {"warmup_s", o.warmup_s},     {"warmup_reps", o.warmup_reps},
                     {"min_reps", o.min_reps},   {"server", o.server},         {"timeout_ms", o.timeout_ms},
                     {"sockbuf", o.sockbuf},     {"quick", o.quick}};
    json rs = json::array();
    for (const auto& r : results) rs.push_back(result_json(r));
    out["results"] = rs;
    fd::write_json_file(o.json_out, out);
    if (!o.quiet) std::printf("wrote %s\n", o.json_out.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "fd-transport-bench: S-worker <-> R-worker ZeroMQ link benchmark (DEALER -> ROUTER; per link one request "
      "[header][q][k][v] of ~S bytes, reply [header][o] of ~S/3). Reports median/p90 round trip and GB/s against the "
      ">= 4 GB/s per link target.",
      "fd-transport-bench"};
  Options o;
  app.add_option("--sizes", o.sizes, "request sizes S per link per step (K/M = 1024/1048576)")->delimiter(',')->capture_default_str();
  app.add_option("--transports", o.transports, "tcp (127.0.0.1, ephemeral port), ipc (temp dir), inproc (library ceiling)")
      ->delimiter(',')->capture_default_str();
  app.add_option("--framing", o.framings,
                 "tensor: q, k, v (and o) one frame each; split: frames of at most --frame-max; whole: q|k|v as one frame")
      ->delimiter(',')->capture_default_str();
  app.add_option("--frame-max", o.frame_max_s, "largest frame for --framing split")->capture_default_str();
  app.add_option("--io-threads", o.io_threads, "zmq I/O threads per context (client and each server)")->delimiter(',')->capture_default_str();
  app.add_option("--links", o.links, "concurrent links (simulated R-workers), all in flight at once")->delimiter(',')->capture_default_str();
  app.add_option("--time", o.time_s, "measured seconds per configuration (at least --min-reps steps)")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--warmup-time", o.warmup_s, "warm-up seconds per configuration")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--warmup-reps", o.warmup_reps, "at least this many warm-up steps")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--min-reps", o.min_reps, "at least this many measured steps")->check(CLI::Range(1, 1000000))->capture_default_str();
  app.add_option("--max-reps", o.max_reps, "at most this many measured steps")->check(CLI::Range(1, 100000000))->capture_default_str();
  app.add_option("--server", o.server, "where the ROUTER side runs: auto (process for tcp/ipc, thread for inproc), thread, process")
      ->check(CLI::IsMember({"auto", "thread", "process"}))->capture_default_str();
  app.add_flag("--process", o.process_flag, "same as --server process (inproc still uses a thread)");
  app.add_option("--timeout-ms", o.timeout_ms, "a step (or a send) that takes longer fails with an error naming the silent link")
      ->check(CLI::Range(10, 3600000))->capture_default_str();
  app.add_option("--sockbuf", o.sockbuf, "ZMQ_SNDBUF/ZMQ_RCVBUF in bytes (-1: OS default)")->capture_default_str();
  app.add_option("--fail-server-after", o.fail_server_after,
                 "testing: each server stops answering after N requests (a process exits with status 3)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--quick", o.quick,
               "short run for small machines: sizes 64K,1M,4M,32M, io-threads 1, links 1,2, 0.05 s per config "
               "(options given explicitly win)");
  app.add_option("--json", o.json_out, "write results with provenance to this JSON file");
  app.add_flag("--quiet", o.quiet, "no table");
  const std::string cmdline = fd::join_args(argc, argv);
  signal(SIGINT, on_fatal_signal);
  signal(SIGTERM, on_fatal_signal);
  return fd::guarded_main(app, argc, argv, [&]() { return bench_main(o, app, cmdline); });
}
