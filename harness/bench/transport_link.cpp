#include "harness/bench/transport_link.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <thread>

#include "fastdecode/core/clock.h"
#include "fastdecode/core/error.h"

namespace fd::bench {

using proto::MsgType;

// ---- sizes -------------------------------------------------------------------------------------

size_t TransportCase::seq_request_bytes() const {
  return 8 + size_t(shape.heads + 2 * shape.kv_heads) * size_t(shape.head_dim) * shape.elem();
}
size_t TransportCase::request_bytes() const {
  return proto::kHeaderBytes + size_t(n_seq) * seq_request_bytes();
}
size_t TransportCase::reply_bytes() const {
  return proto::kHeaderBytes + size_t(n_seq) * size_t(shape.heads) * size_t(shape.head_dim) * shape.elem();
}
std::string TransportCase::name() const {
  return transport + "/io:" + std::to_string(io_threads) + "/links:" + std::to_string(links) +
         "/size:" + size_label(size) + (spin_us > 0 ? "/spin:" + std::to_string(spin_us) : "");
}

TransportCase make_case(const std::string& transport, int io_threads, int links, uint64_t size,
                        const WireShape& shape) {
  TransportCase c;
  c.transport = transport, c.io_threads = io_threads, c.links = links, c.size = size, c.shape = shape;
  const size_t per = c.seq_request_bytes();
  if (size < proto::kHeaderBytes + per)
    throw ConfigError("size " + size_label(size) + " cannot hold one sequence's ATTEND (" +
                      std::to_string(proto::kHeaderBytes + per) + " bytes at heads " + std::to_string(shape.heads) +
                      "/" + std::to_string(shape.kv_heads) + ", head_dim " + std::to_string(shape.head_dim) + ")");
  c.n_seq = uint32_t((size - proto::kHeaderBytes) / per);
  return c;
}

uint64_t parse_size(const std::string& s0) {
  std::string s = s0;
  if (s.size() >= 2 && (s.substr(s.size() - 2) == "iB" || s.substr(s.size() - 2) == "ib"))
    s.resize(s.size() - 2);
  else if (!s.empty() && (s.back() == 'B' || s.back() == 'b'))
    s.pop_back();
  uint64_t mult = 1;
  if (!s.empty()) {
    switch (s.back()) {
      case 'K':
      case 'k':
        mult = 1ull << 10;
        s.pop_back();
        break;
      case 'M':
      case 'm':
        mult = 1ull << 20;
        s.pop_back();
        break;
      case 'G':
      case 'g':
        mult = 1ull << 30;
        s.pop_back();
        break;
      default:
        break;
    }
  }
  if (s.empty() || s.size() > 12 || s.find_first_not_of("0123456789") != std::string::npos)
    throw ConfigError("bad size '" + s0 + "' (use bytes or a K/M/G suffix, binary: 64K, 1M)");
  const uint64_t v = std::stoull(s) * mult;
  if (v == 0) throw ConfigError("size '" + s0 + "' must be > 0");
  return v;
}

std::string size_label(uint64_t b) {
  char buf[32];
  if (b % (1ull << 30) == 0)
    std::snprintf(buf, sizeof buf, "%" PRIu64 "G", b >> 30);
  else if (b % (1ull << 20) == 0)
    std::snprintf(buf, sizeof buf, "%" PRIu64 "M", b >> 20);
  else if (b % (1ull << 10) == 0)
    std::snprintf(buf, sizeof buf, "%" PRIu64 "K", b >> 10);
  else
    std::snprintf(buf, sizeof buf, "%" PRIu64, b);
  return buf;
}

// ---- the ipc directory, cleaned up at exit and on SIGINT/SIGTERM ------------------------------------

namespace {

constexpr int kMaxPaths = 64;
char g_dir[108] = {0};
char g_paths[kMaxPaths][108];  // socket files of the case running now
volatile std::sig_atomic_t g_n_paths = 0;

extern "C" void on_fatal_signal(int sig) {  // async-signal-safe: unlink, rmdir, re-raise
  for (int i = 0; i < g_n_paths; ++i) unlink(g_paths[i]);
  if (g_dir[0]) (void)!rmdir(g_dir);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

}  // namespace

std::string self_binary() {
  std::error_code ec;
  const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) FD_THROW("cannot find this program's path (/proc/self/exe): " << ec.message());
  return p.string();
}

std::string make_ipc_dir() {
  if (g_dir[0]) return g_dir;
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/fdtb-XXXXXX";
  if (tmpl.size() + 24 > 100) tmpl = "/tmp/fdtb-XXXXXX";  // + "/c<index>-l<i>.sock" within sun_path (107)
  std::vector<char> b(tmpl.begin(), tmpl.end());
  b.push_back(0);
  if (!mkdtemp(b.data())) FD_THROW("mkdtemp " << tmpl << ": " << std::strerror(errno));
  std::snprintf(g_dir, sizeof g_dir, "%s", b.data());
  std::signal(SIGINT, on_fatal_signal);
  std::signal(SIGTERM, on_fatal_signal);
  return g_dir;
}

void remove_ipc_dir() {
  if (!g_dir[0]) return;
  std::error_code ec;
  std::filesystem::remove_all(g_dir, ec);
  g_dir[0] = 0;
}

// ---- LinkSet ---------------------------------------------------------------------------------------

LinkSet::LinkSet(const TransportCase& c, const LinkOptions& o) : c_(c), o_(o) {
  if (c.links < 1 || c.links > kMaxPaths) throw ConfigError("links must be in 1..64");
  const std::string bin = self_binary();
  std::vector<std::string> endpoints;
  for (int i = 0; i < c.links; ++i) {
    std::vector<std::string> args = {"serve", "--io-threads", std::to_string(c.io_threads), "--spin-us",
                                     std::to_string(c.spin_us)};
    if (o.fail_after > 0) args.insert(args.end(), {"--fail-after", std::to_string(o.fail_after)});
    const bool shm = c.transport == "shm" || c.transport == "shm-inplace";
    if (c.transport == "ipc" || shm) {
      if (o.ipc_dir.empty()) FD_THROW("internal: an ipc case without an ipc directory");
      ipc_paths_.push_back(o.ipc_dir + "/c" + std::to_string(o.index) + "-l" + std::to_string(i) + ".sock");
      std::snprintf(g_paths[i], sizeof g_paths[i], "%s", ipc_paths_.back().c_str());
      g_n_paths = i + 1;
      args.insert(args.end(), {"--ipc", ipc_paths_.back()});
    } else if (c.transport != "tcp") {
      throw ConfigError("unknown transport '" + c.transport + "' (tcp, ipc, shm, shm-inplace)");
    }
    servers_.push_back(std::make_unique<SpawnedRWorker>(bin, args, 20000));
    endpoints.push_back(servers_.back()->endpoint());
  }
  RWorkerClientOptions co;
  co.timeout_ms = o.timeout_ms, co.io_threads = c.io_threads, co.spin_us = c.spin_us;
  // shm: the ipc link plus the shared-memory lane, with room for two steps' requests and replies (each frame's
  // block rounded up to 64 bytes) so that a step never waits for space.
  // shm-inplace: the same (the request's block in place of one step's request space).
  const bool shm = c.transport == "shm" || c.transport == "shm-inplace";
  if (shm) co.shm_bytes = (2 * (c.request_bytes() + c.reply_bytes()) + (size_t(1) << 20) + 4095) / 4096 * 4096;
  client_ = std::make_unique<RWorkerClient>(endpoints, co);
  header_ =
      proto::make_header(MsgType::Attend, c.shape.heads, c.shape.kv_heads, c.shape.head_dim, c.shape.dtype, c.n_seq);
  const size_t n = c.n_seq, es = c.shape.elem();
  const size_t ids_b = n * 8, q_b = n * size_t(c.shape.heads) * size_t(c.shape.head_dim) * es,
               kv_b = n * size_t(c.shape.kv_heads) * size_t(c.shape.head_dim) * es, total = ids_b + q_b + 2 * kv_b;
  for (int i = 0; i < c.links; ++i) {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, total) != 0) FD_THROW("out of memory allocating " << total << " bytes of staging");
    staging_.emplace_back(static_cast<uint8_t*>(p), std::free);
    uint8_t* s = staging_.back().get();
    std::memset(s + ids_b, 0x3c, total - ids_b);  // fp16 0x3c3c ~ 1.06; pages touched before timing
    for (size_t k = 0; k < n; ++k) {
      const uint64_t id = uint64_t(i) << 32 | k;
      std::memcpy(s + 8 * k, &id, 8);
    }
    frames_.push_back({{s, ids_b}, {s + ids_b, q_b}, {s + ids_b + q_b, kv_b}, {s + ids_b + q_b + kv_b, kv_b}});
  }
  requests_.resize(size_t(c.links));
  // Before any timing: each server must reject an ATTEND whose q frame is one byte short the way the
  // R-worker does (proto::decode's message), or it is not measuring the R-worker's receive path.
  for (size_t w = 0; w < servers_.size(); ++w) {
    std::vector<ConstBuffer> bad = frames_[w];
    bad[1].size -= 1;
    std::string got = "an ATTEND_REPLY";
    try {
      client_->wait({{w, client_->send(w, header_, bad)}});
    } catch (const Error& e) {
      got = e.what();
      if (got.find("answered ERROR (malformed): ATTEND frame 1 is") != std::string::npos) continue;
    }
    FD_THROW("echo R-worker " << w << " (" << client_->endpoint(w) << ") did not reject a malformed ATTEND as the "
                              << "R-worker does; got " << got);
  }
  // The shared-memory offer went with each link's first message, and its answer came before that message's: a
  // refused lane would measure ipc under the name shm.
  if (shm)
    for (size_t w = 0; w < servers_.size(); ++w)
      if (const ShmLaneStats st = client_->shm_stats(w); st.state != "active")
        FD_THROW("echo R-worker " << w << " (" << client_->endpoint(w) << "): the shared-memory lane is " << st.state
                                  << (st.reason.empty() ? "" : ": " + st.reason));
  // shm-inplace: each link's request moves into a block of its region, written once (as the S-Part's copy down would
  // write it each layer: that copy is the producer's, in every transport) and sent from there every step.
  if (c.transport == "shm-inplace")
    for (size_t w = 0; w < servers_.size(); ++w) {
      ShmBlock b = client_->shm_alloc(w, total);
      if (!b) FD_THROW("echo R-worker " << w << ": no block of " << total << " bytes in its region");
      std::memcpy(b.data(), staging_[w].get(), total);
      uint8_t* s = b.data();
      frames_[w] = {{s, ids_b}, {s + ids_b, q_b}, {s + ids_b + q_b, kv_b}, {s + ids_b + q_b + kv_b, kv_b}};
      blocks_.push_back(std::move(b));
    }
}

LinkSet::~LinkSet() {
  client_.reset();
  servers_.clear();  // SIGKILL to those still running
  for (const auto& p : ipc_paths_) unlink(p.c_str());
  g_n_paths = 0;
}

double LinkSet::step() {
  const int64_t t0 = now_ns();
  for (size_t w = 0; w < servers_.size(); ++w) requests_[w] = {w, client_->send(w, header_, frames_[w])};
  std::vector<RWorkerReply> replies;
  try {
    replies = client_->wait(requests_);
  } catch (const Error& e) {
    FD_THROW(e.what() << why_silent());
  }
  const double dt = double(now_ns() - t0) * 1e-9;
  if (c_.transport == "shm-inplace")  // every request went as it lay: none copied (or sent over ZeroMQ) instead
    for (size_t w = 0; w < servers_.size(); ++w)
      if (const ShmLaneStats st = client_->shm_stats(w); st.bytes_copied != 0 || st.requests_zmq != 0)
        FD_THROW("echo R-worker " << w << ": shm-inplace copied " << st.bytes_copied << " bytes into the region and sent "
                                  << st.requests_zmq << " request(s) over ZeroMQ");
  const size_t o_bytes = c_.reply_bytes() - proto::kHeaderBytes;
  for (size_t w = 0; w < replies.size(); ++w) {
    const RWorkerReply& r = replies[w];
    if (r.h.msg_type() != MsgType::AttendReply || r.frames.size() != 1 || r.frames[0].size() != o_bytes ||
        r.h.request_id != requests_[w].second)
      FD_THROW("echo R-worker " << w << " (" << client_->endpoint(w) << ") answered request " << requests_[w].second
                                << " with " << proto::msg_type_name(r.h.msg_type()) << " of " << r.frames.size()
                                << " frame(s), " << (r.frames.empty() ? 0 : r.frames[0].size()) << " bytes; expected "
                                << "ATTEND_REPLY with one o frame of " << o_bytes << " bytes");
  }
  return dt;
}

ShmLaneStats LinkSet::lane_totals() const {
  ShmLaneStats t;
  for (size_t w = 0; client_ && w < servers_.size(); ++w) {
    const ShmLaneStats st = client_->shm_stats(w);
    t.requests_shm += st.requests_shm, t.replies_shm += st.replies_shm;
    t.requests_ring += st.requests_ring, t.replies_ring += st.replies_ring;
  }
  return t;
}

std::string LinkSet::why_silent() const {
  // A worker's sockets close while it exits, a moment before the kernel makes it a zombie that waitid sees:
  // a connection found dropped can be reported before its process has ended. Look again for up to 2 s.
  std::string out;
  for (int tries = 0; tries < 200 && out.empty(); ++tries) {
    if (tries > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    out = exited_workers();
  }
  return out.empty() ? "" : " [" + out + "]";
}

std::string LinkSet::exited_workers() const {
  std::string out;
  for (size_t w = 0; w < servers_.size(); ++w) {
    siginfo_t info{};
    // WNOWAIT: look without reaping, so that ~SpawnedRWorker still owns (and reaps) the process.
    if (waitid(P_PID, id_t(servers_[w]->pid()), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) continue;
    std::string how = info.si_code == CLD_EXITED ? "exited with status " + std::to_string(info.si_status)
                                                 : "was killed by signal " + std::to_string(info.si_status);
    out += (out.empty() ? "" : "; ") +
           ("echo R-worker " + std::to_string(w) + " (pid " + std::to_string(info.si_pid) + ") " + how);
  }
  return out;
}

void LinkSet::close() {
  for (size_t w = 0; w < servers_.size(); ++w) {
    try {
      client_->shutdown(w, servers_[w]->token());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fd-transport-bench: SHUTDOWN of echo R-worker %zu: %s\n", w, e.what());
    }
  }
  for (size_t w = 0; w < servers_.size(); ++w) {
    const int st = servers_[w]->wait_exit(5000);
    if (st != 0) std::fprintf(stderr, "fd-transport-bench: echo R-worker %zu ended with %d after SHUTDOWN\n", w, st);
  }
}

}  // namespace fd::bench
