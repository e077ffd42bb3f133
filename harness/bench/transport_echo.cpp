#include "harness/bench/transport_echo.h"

#include "fastdecode/rworker/server.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>
#include <zmq.hpp>

#include "fastdecode/core/cli_main.h"
#include "fastdecode/rworker/server.h"
#include "fastdecode/wire/wire.h"

namespace fd::bench {
namespace {

using proto::ErrorCode;
using proto::Header;
using proto::MsgType;

volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) {
  g_stop = 1;
}

zmq::message_t reply_header_frame(const Header& req, MsgType type, size_t n_frames, ErrorCode status = ErrorCode::None) {
  const auto bytes = proto::encode_header(proto::reply_header(req, type, n_frames, int32_t(status)));
  return zmq::message_t(bytes.data(), bytes.size());
}

// The o frames' bytes: constant, so they are sent zero-copy without tracking their release. Only grows,
// and keeps every buffer it handed out: a reply may still be on its way when a larger one is needed.
class ReplyBytes {
 public:
  void* get(size_t n) {
    if (n > cap_ || bufs_.empty()) {
      bufs_.push_back(std::make_unique<uint8_t[]>(std::max<size_t>(n, 1)));
      std::memset(bufs_.back().get(), 0x3c, std::max<size_t>(n, 1));  // fp16 0x3c3c ~ 1.06: finite
      cap_ = n;
    }
    return bufs_.back().get();
  }

 private:
  std::vector<std::unique_ptr<uint8_t[]>> bufs_;
  size_t cap_ = 0;
};

}  // namespace

int transport_echo_main(int argc, char** argv) {
  CLI::App app{
      "fd-transport-bench serve: the benchmark's R-worker. Decodes every request with the R-worker's "
      "validation (proto::decode) and answers ATTEND with a real ATTEND_REPLY and an o frame of the "
      "request's size, computing nothing; SHUTDOWN -> OK and exit.",
      "fd-transport-bench serve"};
  std::string listen = "tcp://127.0.0.1:*", ipc;
  int io_threads = 1, fail_after = 0, spin_us = 0;
  double max_message_mb = 1024;
  bool print_endpoint = false;
  app.add_option("--listen", listen, "ZeroMQ endpoint to bind (as fd-rworker)")->capture_default_str();
  app.add_option("--ipc", ipc,
                 "bind ipc://PATH instead of --listen (fd::SpawnedRWorker always appends a loopback --listen)");
  app.add_flag("--print-endpoint", print_endpoint, "print the bound endpoint on stdout once listening (as fd-rworker)");
  app.add_option("--io-threads", io_threads, "zmq I/O threads")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--spin-us", spin_us, "poll without sleeping this long after each reply before blocking (as fd-rworker)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_option("--max-message-mb", max_message_mb, "largest accepted request (as fd-rworker)")
      ->check(CLI::Range(1.0, 65536.0))
      ->capture_default_str();
  long parent_pid = 0;  // accepted as fd-rworker takes it (fd::SpawnedRWorker passes it); this server ends with its parent anyway
  app.add_option("--parent-pid", parent_pid, "as fd-rworker: exit when this process is no longer the parent (always done here)")
      ->check(CLI::PositiveNumber);
  app.add_option("--fail-after", fail_after,
                 "testing: answer N ATTENDs, then exit with status 3 on the next one (a dying R-worker)")
      ->check(CLI::NonNegativeNumber);
  return fd::guarded_main(app, argc, argv, [&]() -> int {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // started by a benchmark: end with it, whatever way it ends
    const pid_t parent = getppid();
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    proto::Limits limits;
    limits.max_message_bytes = size_t(max_message_mb * 1e6);
    ReplyBytes o;
    int attends = 0;
    bool shutdown = false;
    fd::RouterLoop loop;
    loop.listen = ipc.empty() ? listen : "ipc://" + ipc;
    loop.io_threads = io_threads;
    loop.spin_us = spin_us;
    loop.max_message_bytes = limits.max_message_bytes;
    loop.on_bound = [&](const std::string& ep) {
      if (!print_endpoint) return;
      std::printf("%s\n", ep.c_str());
      std::fflush(stdout);
    };
    loop.done = [&] { return shutdown || g_stop || getppid() != parent; };  // the benchmark went away: so do we
    loop.handle = [&](const std::string&, const proto::Frame* frames, size_t n) {
      Header req{};
      if (frames[0].size == proto::kHeaderBytes) std::memcpy(&req, frames[0].data, proto::kHeaderBytes);
      std::vector<zmq::message_t> reply;
      try {
        const proto::Message m = proto::decode(frames, n, limits);
        if (m.h.msg_type() == MsgType::Attend) {
          if (fail_after > 0 && attends >= fail_after) {
            std::fprintf(stderr, "fd-transport-bench serve: --fail-after %d: exiting with status 3\n", fail_after);
            std::fflush(stderr);
            std::_Exit(3);
          }
          ++attends;
          const size_t bytes =
              size_t(m.h.n_seq) * m.h.n_heads * m.h.head_dim * proto::wire_dtype_size(proto::WireDType(m.h.dtype));
          reply.push_back(reply_header_frame(m.h, MsgType::AttendReply, 1));
          reply.emplace_back(o.get(bytes), bytes, nullptr, nullptr);  // zero-copy, constant bytes
        } else if (m.h.msg_type() == MsgType::Shutdown) {
          reply.push_back(reply_header_frame(m.h, MsgType::Ok, 0));
          shutdown = true;
        } else {
          throw proto::ProtocolError(ErrorCode::Malformed, std::string(proto::msg_type_name(m.h.msg_type())) +
                                                               ": this echo R-worker answers ATTEND and SHUTDOWN only");
        }
      } catch (const proto::ProtocolError& e) {
        reply.clear();
        reply.push_back(reply_header_frame(req, MsgType::Error, 1, e.code()));
        reply.emplace_back(e.what(), std::strlen(e.what()));
      }
      return reply;
    };
    fd::run_router_loop(loop);
    return 0;
  });
}

}  // namespace fd::bench
