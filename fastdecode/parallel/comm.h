// Communicators between the S-ranks of one engine (issue 14; docs/plans/issue14-parallel.md §3). The ranks
// of a group are threads of one process; each thread holds its own rank's handle and calls it only from that
// thread (abort() and busy_ms_and_reset() excepted: any thread may call them).
//
// Backends (a group is made by one factory call that returns every rank's handle, in rank order):
//   gloo   all_reduce_sum, all_gather, send/recv over TCP loopback (Gloo 0.5.0, ring algorithms). Built when
//          CMake finds Gloo (FD_ENABLE_GLOO, libgloo-dev); otherwise make_gloo_group refuses.
//   local  send/recv only, through a bounded in-process mailbox (copy in, copy out): pipeline stages on one
//          device or without a network library. Its collectives refuse.
//   nccl   all_reduce_sum, all_gather, send/recv of DEVICE buffers, ordered on the caller's CUDA stream (the
//          `stream` parameter, a cudaStream_t as void*): one GPU per rank, ranks as threads of one process
//          (ncclCommInitAll). Built when CMake finds CUDA and NCCL (FD_ENABLE_NCCL); otherwise it refuses.
// gloo and local calls have a deadline (the group's timeout_ms): past it the call throws fd::Error naming the
// rank, the peer and the operation. After any error the handle is broken: later calls throw again at once.
// nccl calls are enqueued on the stream and return; they have no deadline of their own (a lost peer shows as
// the step's R-worker or stream wait never ending — the engine's other deadlines bound the run).
// gloo and local move host buffers only: their `stream` parameters must be nullptr (device_buffers() false).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace fd {

enum class CommType { F32, I32, U8 };
size_t comm_type_size(CommType t);
const char* comm_type_name(CommType t);  // "f32" | "i32" | "u8"

// One rank's handle on a group. all_reduce_sum and all_gather are collective: every rank of the group makes
// the same calls (same count and type) in the same order.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string describe() const = 0;  // "gloo 0.5.0 tcp 127.0.0.1" | "local mailbox 8" | "nccl 2.28.3"
  // True when the buffers are device memory ordered on `stream` (nccl); false: host memory, stream nullptr.
  virtual bool device_buffers() const { return false; }

  // In place: buf[i] = sum over ranks of buf[i]. Every rank receives the same bytes (ring reduce-scatter, then
  // all-gather of the reduced segments), so replicas of the residual stay bit-identical. F32 and I32 only.
  virtual void all_reduce_sum(void* buf, size_t count, CommType t, void* stream = nullptr) = 0;
  // out = [rank 0's `in` | rank 1's | ...] (rank-major), `count` elements from each rank; out holds
  // size() * count elements and must not overlap `in` (except `in` == out + rank() * count).
  virtual void all_gather(const void* in, void* out, size_t count, CommType t, void* stream = nullptr) = 0;
  // Point to point, in order per (sender, receiver): the k-th recv from a peer gets the k-th send to it, and
  // both must name the same byte count. send may return before delivery: `buf` must stay unchanged until
  // flush_sends() returns (the local backend copies at once, so there it is free at return).
  virtual void send(const void* buf, size_t bytes, int peer, void* stream = nullptr) = 0;
  virtual void recv(void* buf, size_t bytes, int peer, void* stream = nullptr) = 0;
  // Waits until every earlier send of this rank was delivered (its buffer is then reusable).
  virtual void flush_sends() = 0;
  // Wakes every blocked call on every rank of the group with fd::Error("... aborted ..."); every later call
  // on any rank throws too. Idempotent.
  virtual void abort() = 0;

  // Wall time this rank spent inside the calls above since the last reset, in ms (the engine's breakdown).
  double busy_ms_and_reset();

 protected:
  // Adds the time from construction to destruction to busy_ns_ (one per call, also when the call throws).
  class BusyScope {
   public:
    explicit BusyScope(Communicator& c);
    ~BusyScope();
    BusyScope(const BusyScope&) = delete;
    BusyScope& operator=(const BusyScope&) = delete;

   private:
    Communicator& c_;
    int64_t t0_;
  };
  // Throws fd::Error unless `stream` is nullptr (this step has no device buffers).
  void require_host(void* stream, const char* op) const;
  // Throws fd::Error unless 0 <= peer < size() and peer != rank().
  void check_peer(int peer, const char* op) const;

 private:
  std::atomic<int64_t> busy_ns_{0};
};

using CommGroup = std::vector<std::unique_ptr<Communicator>>;

// Gloo over TCP on 127.0.0.1: every rank connects to every other (connectFullMesh through one in-memory
// store, from `size` short-lived threads); returns when the mesh is up. timeout_ms bounds the set-up and
// every later call. Throws fd::ConfigError when this build has no Gloo (have_gloo() false). The first call
// makes the process ignore SIGPIPE if it had the default action (Gloo's socket writes would raise it when a
// peer closed; see comm_gloo.cpp).
CommGroup make_gloo_group(int size, int timeout_ms);
// The in-process mailbox: at most `capacity` undelivered messages per (sender, receiver); a send into a full
// mailbox waits (up to timeout_ms) for the receiver.
CommGroup make_local_group(int size, int timeout_ms, int capacity = 8);
// NCCL over the given CUDA devices, rank i on devices[i] (ncclCommInitAll from the calling thread). A device
// twice is refused (NCCL allows one rank per device in a communicator), as is a device that does not answer.
// Throws fd::ConfigError when this build has no NCCL (have_nccl() false). The first call sets
// NCCL_NVLS_ENABLE=0 when unset (NVLink multicast stays off: .library/device/KINDS.md).
CommGroup make_nccl_group(const std::vector<int>& devices);

namespace detail {
// The factories' shared argument checks: 1 <= size <= 64, timeout_ms >= 1 (fd::ConfigError naming `backend`).
void check_group_args(const char* backend, int size, int timeout_ms);
}  // namespace detail

bool have_gloo();            // this build has the Gloo backend
std::string gloo_version();  // "0.5.0", or "" without Gloo
bool have_nccl();            // this build has the NCCL backend
std::string nccl_version();  // "2.28.3" (the library's, at run time), or "" without NCCL

}  // namespace fd
