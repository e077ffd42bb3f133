// The floors under a tiny ATTEND's round trip on the shared-memory lane (issue 43, "small-message floor"): what two
// processes on this host pay to hand a 64-byte message back and forth, by the two ways the lane could signal.
//   zmq-ipc     a ZeroMQ DEALER -> ROUTER echo over ipc, 64 bytes each way: the mechanism the lane's headers use
//               today (each message passes the sender's and the receiver's ZeroMQ I/O threads)
//   futex-shm   a doorbell in a shared page: the sender stores a sequence number and wakes the peer with FUTEX_WAKE,
//               the peer answers the same way (one wake-up each way; no payload beyond the word)
// Each is a peer process (`fd-transport-bench floor-peer MODE ...`, this program) and the measuring side; one round
// trip per iteration. Neither decodes or validates anything: they bound from below what the lane's signalling could
// cost, next to round_trip/shm-inplace (the real ATTEND through RWorkerClient and the echo worker).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace fd::bench {

enum class FloorMode { ZmqIpc, FutexShm };
const char* floor_name(FloorMode m);  // "zmq-ipc", "futex-shm"

// A peer process and the measuring side's end of the link; the peer exits when this is destroyed (asked to; killed if
// it does not within a second).
class FloorLink {
 public:
  // ipc_dir: where the zmq-ipc socket file goes (make_ipc_dir). timeout_ms: the longest a round trip may take before
  // it throws fd::Error (a peer that died or hangs); the peer's start (its first answer, or mapping the page) may take
  // up to 20 s. zmq-ipc's first answer is a round trip of its own (counted by fail_after).
  // fail_after > 0 (testing): the peer exits with status 3 instead of answering its (fail_after + 1)-th message.
  FloorLink(FloorMode m, const std::string& ipc_dir, int index, int timeout_ms, int fail_after = 0);
  ~FloorLink();
  FloorLink(const FloorLink&) = delete;
  FloorLink& operator=(const FloorLink&) = delete;
  double round_trip();  // seconds

 private:
  void stop();
  FloorMode mode_;
  int timeout_ms_;
  int pid_ = -1;
  void* ctx_ = nullptr;   // zmq
  void* sock_ = nullptr;  // zmq
  std::string endpoint_;
  void* page_ = nullptr;  // futex: the shared page
  uint32_t seq_ = 0;
};

// `fd-transport-bench floor-peer zmq ENDPOINT [FAIL_AFTER]` | `floor-peer futex SHM_NAME [FAIL_AFTER]`: the peer's
// side; returns its exit status (3 when it stopped answering after FAIL_AFTER messages).
int floor_peer_main(int argc, char** argv);

}  // namespace fd::bench
