// The R-worker's socket loop: a ROUTER bound to an endpoint, one request at a time through
// RWorkerService, until SHUTDOWN or a stop signal.
#pragma once
#include <atomic>
#include <functional>
#include <vector>
#include <string>

#include "fastdecode/rworker/service.h"

namespace fd {

struct RWorkerServerOptions {
  std::string listen = "tcp://127.0.0.1:5555";
  std::vector<int> cpus;  // pin the compute threads to these CPUs (round robin); empty = no pinning
  int io_threads = 2;
  bool verbose = false;
  long parent_pid = 0;  // > 0: stop serving once this process is no longer our parent (it died: no orphans)
};

// The ROUTER loop every R-worker process runs (fd-rworker; the benchmark's echo R-worker): bind, then
// one request at a time — its frames (routing id stripped) to `handle`, the frames it returns back to
// the sender (a vanished peer just loses its reply) — until `done()` says so (checked after every
// request and every 100 ms of quiet). `on_bound` receives the endpoint actually bound (tcp://...:*
// resolves to a port). Throws fd::Error if it cannot bind.
struct RouterLoop {
  std::string listen;
  int io_threads = 1;
  size_t max_message_bytes = size_t(1) << 30;  // one frame over it: libzmq drops the peer's connection
  std::function<std::vector<zmq::message_t>(const proto::Frame* frames, size_t n)> handle;
  std::function<bool()> done;
  std::function<void(const std::string&)> on_bound;
};
void run_router_loop(const RouterLoop& loop);

// Runs until SHUTDOWN or *stop becomes true (checked every 100 ms). `on_bound` receives the endpoint
// actually bound (tcp://...:* resolves to a port). Throws fd::Error if it cannot bind.
void run_rworker_server(RWorkerService& service, const RWorkerServerOptions& opt, const std::atomic<bool>* stop,
                        const std::function<void(const std::string&)>& on_bound = nullptr);

// Pins the calling process's OpenMP threads (n of them) to `cpus`, round robin. No-op when empty.
void pin_openmp_threads(const std::vector<int>& cpus, int n_threads);

}  // namespace fd
