#include "fastdecode/rworker/server.h"

#include <omp.h>
#include <sched.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "fastdecode/core/clock.h"

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
  const auto recv_one = [&](zmq::message_t& m) {
    for (;;) {
      try {
        // The rest of a multipart message is already queued (libzmq delivers whole messages): no wait here.
        return bool(sock.recv(m, zmq::recv_flags::none));
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) throw;
      }
    }
  };
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
    // Frame by frame: the running total is checked as each frame comes; past the limit the frames are dropped
    // as they are received (only the header is kept, to address the reply).
    zmq::message_t m;
    if (!recv_one(m)) continue;
    bool more = m.more();
    parts.push_back(std::move(m));  // the routing id
    size_t held = 0, seen = 0, n_frames = 0;
    bool over = false;
    while (more) {
      zmq::message_t f;
      if (!recv_one(f)) break;
      more = f.more();
      ++n_frames;
      seen += f.size();
      if (over) continue;  // dropped here: never held beside the others
      if (held + f.size() > loop.max_message_bytes || n_frames > kMaxRequestFrames) {
        over = true;
        parts.resize(std::min<size_t>(parts.size(), 2));  // routing id and header only
        continue;
      }
      held += f.size();
      parts.push_back(std::move(f));
      if (loop.counters) loop.counters->max_bytes_held = std::max(loop.counters->max_bytes_held, held);
    }
    if (parts.size() < 2 && !over) continue;  // a routing id alone: nothing to answer
    std::vector<zmq::message_t> reply;
    if (over) {
      if (loop.counters) ++loop.counters->refused_too_large;
      proto::Header req{};
      if (parts.size() >= 2 && parts[1].size() == proto::kHeaderBytes) std::memcpy(&req, parts[1].data(), proto::kHeaderBytes);
      const bool too_many = n_frames > kMaxRequestFrames;
      const std::string text =
          too_many ? "message of " + std::to_string(n_frames) + " frames: at most " + std::to_string(kMaxRequestFrames)
                   : "message of at least " + std::to_string(seen) + " bytes over the " + std::to_string(loop.max_message_bytes) +
                         "-byte limit (refused as its frames arrived)";
      const auto head = proto::encode_header(proto::reply_header(
          req, proto::MsgType::Error, 1, int32_t(too_many ? proto::ErrorCode::Malformed : proto::ErrorCode::TooLarge)));
      reply.emplace_back(head.data(), head.size());
      reply.emplace_back(text.data(), text.size());
      if (loop.on_refused) loop.on_refused(reply);
    } else {
      frames.clear();
      for (size_t i = 1; i < parts.size(); ++i)
        frames.push_back({static_cast<const uint8_t*>(parts[i].data()), parts[i].size()});
      reply = loop.handle(frames.data(), frames.size());
    }
    // Reply: routing id, then the frames. A peer that vanished just loses its reply.
    sock.send(parts[0], zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    for (size_t i = 0; i < reply.size(); ++i)
      sock.send(reply[i], i + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
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
  // Error lines are rate-limited (a client chooses how many bad requests it sends); --verbose logs every one.
  LogLimiter limiter(opt.verbose ? 0 : opt.log_errors_per_s);
  const auto log_error = [&](const std::vector<zmq::message_t>& reply) {
    proto::Header h;
    std::memcpy(&h, reply[0].data(), proto::kHeaderBytes);
    if (h.msg_type() != proto::MsgType::Error || reply.size() < 2) return;
    std::string summary;
    if (!limiter.allow(now_ns(), &summary)) return;
    if (!summary.empty()) std::fprintf(stderr, "%s: %s\n", service.config().name.c_str(), summary.c_str());
    std::fprintf(stderr, "%s: ERROR (%s) to request %llu: %.*s\n", service.config().name.c_str(),
                 proto::error_code_name(proto::ErrorCode(h.status)), (unsigned long long)h.request_id,
                 int(std::min<size_t>(reply[1].size(), 400)), static_cast<const char*>(reply[1].data()));
  };
  loop.handle = [&](const proto::Frame* frames, size_t n) {
    std::vector<zmq::message_t> reply = service.handle(frames, n);
    log_error(reply);
    return reply;
  };
  loop.on_refused = log_error;
  run_router_loop(loop);
}

}  // namespace fd
