// The Gloo communicator (built when CMake finds Gloo with its TCP transport): the ranks are threads of this
// process, each with its own gloo::rendezvous::Context over TCP on 127.0.0.1, meshed through one in-memory
// HashStore. Collectives are Gloo's ring algorithms; point to point uses unbound buffers with one slot per
// message, so ordering follows from numbering, not from the transport.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/config.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <signal.h>

#include <chrono>
#include <csignal>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "fastdecode/core/error.h"
#include "fastdecode/parallel/comm.h"

#if !GLOO_HAVE_TRANSPORT_TCP
#error "the Gloo communicator needs Gloo's TCP transport (GLOO_HAVE_TRANSPORT_TCP); CMake checks gloo/config.h"
#endif

namespace fd {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Slots (Gloo's 64-bit message keys, matched per pair of ranks). Gloo's collectives use prefixes 0x01-0x08 in
// the top byte; point-to-point messages use 0x80/0x81 (+ the direction) and the message's number below, and
// abort() one poison slot.
constexpr uint64_t kP2PSlot = uint64_t{0x80} << 56;
constexpr uint64_t kPoisonSlot = uint64_t{0xff} << 56;
uint64_t p2p_slot(int src, int dst, uint64_t seq) {
  return kP2PSlot | (uint64_t{src < dst ? 1u : 0u} << 56) | (seq & ((uint64_t{1} << 56) - 1));
}

std::string version_string() {
  return std::to_string(GLOO_VERSION_MAJOR) + "." + std::to_string(GLOO_VERSION_MINOR) + "." +
         std::to_string(GLOO_VERSION_PATCH);
}

// What the ranks of one group share.
struct GlooShared {
  int size = 0, timeout_ms = 0;
  std::vector<std::shared_ptr<gloo::Context>> ctx;  // every rank's context: abort() closes them all
  std::mutex m;                                     // guards the fields below
  bool aborted = false;
  int aborted_by = -1;
  // (src, dst, message number) -> bytes, from whichever side of a message came first. The second side
  // compares before it reaches Gloo: Gloo would end the process on a size mismatch (in its I/O thread).
  std::map<std::tuple<int, int, uint64_t>, size_t> announced;
};

// Closes every connection of `ctx` through Gloo's public API: a zero-timeout wait on a posted recv makes the
// transport signal an error to every pair of the context, which wakes every pending operation on it (those
// inside Gloo's collectives too) and closes the sockets, so the peers see it as well. A pair that failed
// already refuses the recv (its own operations were woken then), so the next peer's pair is tried.
void poison(const std::shared_ptr<gloo::Context>& ctx) {
  if (!ctx || ctx->size < 2) return;
  char dummy = 0;
  for (int k = 1; k < ctx->size; ++k) {
    try {
      auto ub = ctx->createUnboundBuffer(&dummy, 1);
      ub->recv((ctx->rank + k) % ctx->size, kPoisonSlot);
      ub->waitRecv(milliseconds(0));
    } catch (const std::exception& e) {
      // Expected: the wait times out, which is the point; anything else means that pair had failed before.
      if (std::string(e.what()).find("Timed out") != std::string::npos) return;
    }
  }
}

class GlooComm final : public Communicator {
 public:
  GlooComm(std::shared_ptr<GlooShared> g, int rank)
      : g_(std::move(g)), rank_(rank), ctx_(g_->ctx[rank]), send_seq_(g_->size, 0), recv_seq_(g_->size, 0) {}

  int rank() const override { return rank_; }
  int size() const override { return g_->size; }
  std::string describe() const override { return "gloo " + version_string() + " tcp 127.0.0.1"; }

  void all_reduce_sum(void* buf, size_t count, CommType t, void* stream) override {
    BusyScope busy(*this);
    const std::string op = "all_reduce_sum of " + std::to_string(count) + " " + comm_type_name(t) + ring_peers();
    require_host(stream, op.c_str());
    if (t != CommType::F32 && t != CommType::I32) FD_THROW(who() << ": " << op << ": only f32 and i32 can be summed");
    check_usable(op);
    const uint32_t tag = next_tag_++;
    if (count == 0 || g_->size == 1) return;
    try {
      gloo::AllreduceOptions opts(ctx_);
      // RING explicitly: its reduce-scatter + all-gather hands every rank the same reduced bytes.
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setTag(tag);
      opts.setTimeout(milliseconds(g_->timeout_ms));
      if (t == CommType::F32) {
        opts.setOutput(static_cast<float*>(buf), count);
        opts.setReduceFunction(&add<float>);
      } else {
        opts.setOutput(static_cast<int32_t*>(buf), count);
        opts.setReduceFunction(&add<int32_t>);
      }
      gloo::allreduce(opts);
    } catch (const std::exception& e) {
      fail(op, e.what());
    }
  }

  void all_gather(const void* in, void* out, size_t count, CommType t, void* stream) override {
    BusyScope busy(*this);
    const std::string op = "all_gather of " + std::to_string(count) + " " + comm_type_name(t) + ring_peers();
    require_host(stream, op.c_str());
    check_usable(op);
    const uint32_t tag = next_tag_++;
    const size_t bytes = count * comm_type_size(t);
    if (bytes == 0) return;
    auto* out8 = static_cast<uint8_t*>(out);
    try {
      gloo::AllgatherOptions opts(ctx_);
      opts.setTag(tag);
      opts.setTimeout(milliseconds(g_->timeout_ms));
      // In place when `in` already sits at this rank's part of `out` (Gloo copies `in` there otherwise).
      if (static_cast<const uint8_t*>(in) != out8 + rank_ * bytes)
        opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), bytes);
      opts.setOutput(out8, bytes * g_->size);
      gloo::allgather(opts);
    } catch (const std::exception& e) {
      fail(op, e.what());
    }
  }

  void send(const void* buf, size_t bytes, int peer, void* stream) override {
    BusyScope busy(*this);
    const std::string op = "send of " + std::to_string(bytes) + " bytes to rank " + std::to_string(peer);
    prologue(stream, peer, op);
    const uint64_t seq = send_seq_[peer]++;
    match_size(rank_, peer, seq, bytes, op);
    try {
      auto ub = ctx_->createUnboundBuffer(bytes ? const_cast<void*>(buf) : &empty_, bytes);
      ub->send(peer, p2p_slot(rank_, peer, seq), 0, bytes);
      pending_.push_back({std::move(ub), peer, bytes});
    } catch (const std::exception& e) {
      fail(op, e.what());
    }
  }

  void recv(void* buf, size_t bytes, int peer, void* stream) override {
    BusyScope busy(*this);
    const std::string op = "recv of " + std::to_string(bytes) + " bytes from rank " + std::to_string(peer);
    prologue(stream, peer, op);
    const uint64_t seq = recv_seq_[peer]++;
    match_size(peer, rank_, seq, bytes, op);
    bool ok = false;
    try {
      auto ub = ctx_->createUnboundBuffer(bytes ? buf : &empty_, bytes);
      ub->recv(peer, p2p_slot(peer, rank_, seq), 0, bytes);
      ok = ub->waitRecv(milliseconds(g_->timeout_ms));
    } catch (const std::exception& e) {
      fail(op, e.what());
    }
    if (!ok) fail(op, "the wait was interrupted");
  }

  void flush_sends() override {
    BusyScope busy(*this);
    check_usable("flush_sends");
    const auto deadline = Clock::now() + milliseconds(g_->timeout_ms);
    auto pending = std::move(pending_);
    pending_.clear();
    for (auto& p : pending) {
      const std::string op = "flush_sends (a send of " + std::to_string(p.bytes) + " bytes to rank " +
                             std::to_string(p.peer) + ")";
      bool ok = false;
      try {
        const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
        ok = p.buf->waitSend(std::max(left, milliseconds(0)));
      } catch (const std::exception& e) {
        fail(op, e.what());
      }
      if (!ok) fail(op, "the wait was interrupted");
    }
  }

  void abort() override {
    {
      std::lock_guard<std::mutex> lock(g_->m);
      if (g_->aborted) return;
      g_->aborted = true;
      g_->aborted_by = rank_;
    }
    for (const auto& c : g_->ctx) poison(c);
  }

 private:
  struct PendingSend {
    std::unique_ptr<gloo::transport::UnboundBuffer> buf;
    int peer;
    size_t bytes;
  };
  std::shared_ptr<GlooShared> g_;
  int rank_;
  std::shared_ptr<gloo::Context> ctx_;
  uint32_t next_tag_ = 0;  // collectives are numbered alike on every rank (same calls, same order)
  std::vector<uint64_t> send_seq_, recv_seq_;  // per peer: the next message's number
  std::vector<PendingSend> pending_;           // sends not yet known delivered (flush_sends waits for them)
  std::string broken_;                         // the first error of this handle; later calls repeat it
  char empty_ = 0;                             // what a zero-byte message points at

  template <typename T>
  static void add(void* c, const void* a, const void* b, size_t n) {
    auto* pc = static_cast<T*>(c);
    const auto* pa = static_cast<const T*>(a);
    const auto* pb = static_cast<const T*>(b);
    for (size_t i = 0; i < n; ++i) pc[i] = pa[i] + pb[i];
  }

  std::string who() const {
    return "gloo communicator rank " + std::to_string(rank_) + " of " + std::to_string(g_->size);
  }
  // The ring's neighbours, for the error message of a collective.
  std::string ring_peers() const {
    if (g_->size < 2) return "";
    return " (ring: from rank " + std::to_string((rank_ + g_->size - 1) % g_->size) + ", to rank " +
           std::to_string((rank_ + 1) % g_->size) + ")";
  }

  [[noreturn]] void fail(const std::string& op, const std::string& gloo_what) {
    std::string why;
    {
      std::lock_guard<std::mutex> lock(g_->m);
      if (g_->aborted) why = "aborted (abort() was called on rank " + std::to_string(g_->aborted_by) + ")";
    }
    if (why.empty() && gloo_what.find("Timed out") != std::string::npos)
      why = "timed out after " + std::to_string(g_->timeout_ms) + " ms";
    if (why.empty()) why = "transport error";
    broken_ = op + " failed: " + why + " [gloo: " + gloo_what + "]";
    FD_THROW(who() << ": " << broken_);
  }
  void check_usable(const std::string& op) {
    if (!broken_.empty()) FD_THROW(who() << ": " << op << " refused: this handle is broken by an earlier error: " << broken_);
    std::lock_guard<std::mutex> lock(g_->m);
    if (g_->aborted) {
      broken_ = op + " failed: aborted (abort() was called on rank " + std::to_string(g_->aborted_by) + ")";
      FD_THROW(who() << ": " << broken_);
    }
  }
  void prologue(void* stream, int peer, const std::string& op) {
    require_host(stream, op.c_str());
    check_peer(peer, op.c_str());
    check_usable(op);
  }
  // The size check for message `seq` from src to dst (see GlooShared::announced).
  void match_size(int src, int dst, uint64_t seq, size_t bytes, const std::string& op) {
    std::lock_guard<std::mutex> lock(g_->m);
    const auto key = std::make_tuple(src, dst, seq);
    auto it = g_->announced.find(key);
    if (it == g_->announced.end()) {
      g_->announced.emplace(key, bytes);
      return;
    }
    const size_t other = it->second;
    g_->announced.erase(it);
    if (other != bytes) {
      broken_ = op + " failed: message " + std::to_string(seq) + " from rank " + std::to_string(src) + " to rank " +
                std::to_string(dst) + " has " + std::to_string(other) + " bytes on the other side (sender and " +
                "receiver must name the same size)";
      FD_THROW(who() << ": " << broken_);
    }
  }
};

// Gloo writes to its sockets with writev(2), which raises SIGPIPE when the peer has closed the connection
// (after an abort or a timeout); by default that signal ends the process. So the first Gloo group sets SIGPIPE
// to be ignored, unless the program installed its own handler: the write then fails with EPIPE, which Gloo
// reports as an error (Gloo's own tests do the same).
void ignore_sigpipe_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
  });
}

}  // namespace

CommGroup make_gloo_group(int size, int timeout_ms) {
  detail::check_group_args("gloo", size, timeout_ms);
  ignore_sigpipe_once();
  auto g = std::make_shared<GlooShared>();
  g->size = size;
  g->timeout_ms = timeout_ms;
  g->ctx.resize(size);
  // connectFullMesh blocks until every rank has published its address, so each rank runs it in its own thread.
  gloo::rendezvous::HashStore store;
  std::vector<std::string> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        gloo::transport::tcp::attr attr;
        attr.hostname = "127.0.0.1";
        auto dev = gloo::transport::tcp::CreateDevice(attr);
        auto ctx = std::make_shared<gloo::rendezvous::Context>(r, size);
        ctx->setTimeout(milliseconds(timeout_ms));
        ctx->connectFullMesh(store, dev);
        g->ctx[r] = ctx;
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r)
    if (!errors[r].empty())
      FD_THROW("gloo communicator: rank " << r << " of " << size << " could not connect over TCP on 127.0.0.1 within "
                                          << timeout_ms << " ms: " << errors[r]);
  CommGroup out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<GlooComm>(g, r));
  return out;
}

bool have_gloo() { return true; }
std::string gloo_version() { return version_string(); }

}  // namespace fd
