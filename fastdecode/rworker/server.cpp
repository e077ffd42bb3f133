#include "fastdecode/rworker/server.h"

#include <omp.h>
#include <sched.h>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace fd {

void pin_openmp_threads(const std::vector<int>& cpus, int n_threads) {
  if (cpus.empty()) return;
  int failures = 0, err = 0;
#pragma omp parallel num_threads(n_threads) reduction(+ : failures) reduction(max : err)
  {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpus[size_t(omp_get_thread_num()) % cpus.size()], &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) ++failures, err = errno;
  }
  if (failures) {
    std::string list;
    for (int c : cpus) list += (list.empty() ? "" : ",") + std::to_string(c);
    FD_THROW("could not pin " << failures << " of " << n_threads << " compute threads to CPUs " << list
                              << " (--cpus): " << std::strerror(err) << "; this machine has "
                              << sysconf(_SC_NPROCESSORS_ONLN) << " CPUs online");
  }
}

void run_router_loop(const RouterLoop& loop) {
  zmq::context_t ctx(loop.io_threads);
  zmq::socket_t sock(ctx, zmq::socket_type::router);
  sock.set(zmq::sockopt::linger, 0);
  sock.set(zmq::sockopt::maxmsgsize, int64_t(loop.max_message_bytes));
  sock.set(zmq::sockopt::router_mandatory, 0);
  try {
    sock.bind(loop.listen);
  } catch (const zmq::error_t& e) {
    FD_THROW("cannot listen on " << loop.listen << ": " << e.what());
  }
  if (loop.on_bound) loop.on_bound(sock.get(zmq::sockopt::last_endpoint));

  std::vector<zmq::message_t> parts;
  std::vector<proto::Frame> frames;
  while (!loop.done()) {
    zmq::pollitem_t item{sock.handle(), 0, ZMQ_POLLIN, 0};
    try {
      zmq::poll(&item, 1, std::chrono::milliseconds(100));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      throw;
    }
    if (!(item.revents & ZMQ_POLLIN)) continue;
    parts.clear();
    try {
      if (!zmq::recv_multipart(sock, std::back_inserter(parts))) continue;
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      throw;
    }
    if (parts.size() < 2) continue;  // a routing id alone: nothing to answer
    frames.clear();
    for (size_t i = 1; i < parts.size(); ++i)
      frames.push_back({static_cast<const uint8_t*>(parts[i].data()), parts[i].size()});
    std::vector<zmq::message_t> reply = loop.handle(frames.data(), frames.size());
    // Reply: routing id, then the frames. A peer that vanished just loses its reply.
    sock.send(parts[0], zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    for (size_t i = 0; i < reply.size(); ++i)
      sock.send(reply[i], i + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
}

void run_rworker_server(RWorkerService& service, const RWorkerServerOptions& opt, const std::atomic<bool>* stop,
                        const std::function<void(const std::string&)>& on_bound) {
  RouterLoop loop;
  loop.listen = opt.listen;
  loop.io_threads = opt.io_threads;
  loop.max_message_bytes = service.config().limits.max_message_bytes;
  loop.on_bound = on_bound;
  // Polled every 100 ms: a worker whose parent is gone (re-parented, so getppid() changed) stops by itself.
  loop.done = [&] {
    return service.shutdown_requested() || (stop && stop->load()) || (opt.parent_pid > 0 && long(getppid()) != opt.parent_pid);
  };
  loop.handle = [&](const proto::Frame* frames, size_t n) {
    std::vector<zmq::message_t> reply = service.handle(frames, n);
    if (opt.verbose || reply.size() > 1) {
      proto::Header h;
      std::memcpy(&h, reply[0].data(), proto::kHeaderBytes);
      if (h.msg_type() == proto::MsgType::Error)
        std::fprintf(stderr, "%s: ERROR (%s) to request %llu: %.*s\n", service.config().name.c_str(),
                     proto::error_code_name(proto::ErrorCode(h.status)), (unsigned long long)h.request_id,
                     int(reply[1].size()), static_cast<const char*>(reply[1].data()));
    }
    return reply;
  };
  run_router_loop(loop);
}

}  // namespace fd
