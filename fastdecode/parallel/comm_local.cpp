// The local communicator: ranks are threads of this process and exchange messages through one bounded
// mailbox per (sender, receiver), copied in by send and out by recv. It has no collectives.
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <sstream>

#include "fastdecode/core/error.h"
#include "fastdecode/parallel/comm.h"

namespace fd {
namespace {

using Clock = std::chrono::steady_clock;

// What the ranks of one group share.
struct LocalShared {
  int size = 0, timeout_ms = 0, capacity = 0;
  std::mutex m;
  std::condition_variable cv;                        // any mailbox or the abort flag changed
  std::vector<std::deque<std::vector<uint8_t>>> box;  // [src * size + dst]: undelivered messages, oldest first
  bool aborted = false;
  int aborted_by = -1;
};

class LocalComm final : public Communicator {
 public:
  LocalComm(std::shared_ptr<LocalShared> g, int rank) : g_(std::move(g)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return g_->size; }
  std::string describe() const override { return "local mailbox " + std::to_string(g_->capacity); }

  void all_reduce_sum(void*, size_t, CommType, void*) override { no_collectives("all_reduce_sum"); }
  void all_gather(const void*, void*, size_t, CommType, void*) override { no_collectives("all_gather"); }

  void send(const void* buf, size_t bytes, int peer, void* stream) override {
    BusyScope busy(*this);
    const std::string op = "send of " + std::to_string(bytes) + " bytes to rank " + std::to_string(peer);
    prologue(stream, peer, op);
    std::vector<uint8_t> copy(static_cast<const uint8_t*>(buf), static_cast<const uint8_t*>(buf) + bytes);
    std::unique_lock<std::mutex> lock(g_->m);
    auto& q = g_->box[rank_ * g_->size + peer];
    const bool ok = g_->cv.wait_until(lock, deadline(), [&] {
      return g_->aborted || static_cast<int>(q.size()) < g_->capacity;
    });
    if (g_->aborted) fail(op, aborted_text());
    if (!ok)
      fail(op, "timed out after " + std::to_string(g_->timeout_ms) + " ms: the mailbox to rank " +
                   std::to_string(peer) + " is full (" + std::to_string(g_->capacity) +
                   " undelivered messages; is rank " + std::to_string(peer) + " receiving?)");
    q.push_back(std::move(copy));
    g_->cv.notify_all();
  }

  void recv(void* buf, size_t bytes, int peer, void* stream) override {
    BusyScope busy(*this);
    const std::string op = "recv of " + std::to_string(bytes) + " bytes from rank " + std::to_string(peer);
    prologue(stream, peer, op);
    std::unique_lock<std::mutex> lock(g_->m);
    auto& q = g_->box[peer * g_->size + rank_];
    const bool ok = g_->cv.wait_until(lock, deadline(), [&] { return g_->aborted || !q.empty(); });
    if (g_->aborted) fail(op, aborted_text());
    if (!ok)
      fail(op, "timed out after " + std::to_string(g_->timeout_ms) + " ms: rank " + std::to_string(peer) +
                   " sent nothing");
    if (q.front().size() != bytes)
      fail(op, "rank " + std::to_string(peer) + " sent " + std::to_string(q.front().size()) +
                   " bytes (sender and receiver must name the same size)");
    if (bytes > 0) std::memcpy(buf, q.front().data(), bytes);
    q.pop_front();
    g_->cv.notify_all();
  }

  // Sends copy at once: nothing to wait for.
  void flush_sends() override {
    BusyScope busy(*this);
    check_usable("flush_sends");
  }

  void abort() override {
    std::lock_guard<std::mutex> lock(g_->m);
    if (!g_->aborted) {
      g_->aborted = true;
      g_->aborted_by = rank_;
    }
    g_->cv.notify_all();
  }

 private:
  std::shared_ptr<LocalShared> g_;
  int rank_;
  std::string broken_;  // the first error of this handle; later calls repeat it

  Clock::time_point deadline() const { return Clock::now() + std::chrono::milliseconds(g_->timeout_ms); }
  std::string who() const {
    return "local communicator rank " + std::to_string(rank_) + " of " + std::to_string(g_->size);
  }
  std::string aborted_text() const { return "aborted (abort() was called on rank " + std::to_string(g_->aborted_by) + ")"; }

  [[noreturn]] void fail(const std::string& op, const std::string& why) {
    broken_ = op + " failed: " + why;
    FD_THROW(who() << ": " << broken_);
  }
  [[noreturn]] void no_collectives(const char* op) {
    BusyScope busy(*this);
    FD_THROW(who() << ": " << op << ": the local communicator has no collectives (tensor parallel needs gloo or nccl)");
  }
  void check_usable(const std::string& op) {
    if (!broken_.empty()) FD_THROW(who() << ": " << op << " refused: this handle is broken by an earlier error: " << broken_);
    std::lock_guard<std::mutex> lock(g_->m);
    if (g_->aborted) fail(op, aborted_text());
  }
  void prologue(void* stream, int peer, const std::string& op) {
    require_host(stream, op.c_str());
    check_peer(peer, op.c_str());
    check_usable(op);
  }
};

}  // namespace

CommGroup make_local_group(int size, int timeout_ms, int capacity) {
  detail::check_group_args("local", size, timeout_ms);
  if (capacity < 1) FD_THROW_BAD_INPUT("local communicator: capacity " << capacity << " must be >= 1");
  auto g = std::make_shared<LocalShared>();
  g->size = size;
  g->timeout_ms = timeout_ms;
  g->capacity = capacity;
  g->box.resize(static_cast<size_t>(size) * size);
  CommGroup out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<LocalComm>(g, r));
  return out;
}

}  // namespace fd
