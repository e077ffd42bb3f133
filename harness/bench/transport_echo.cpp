#include "harness/bench/transport_echo.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "fastdecode/core/cli_main.h"
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

// A reply header the way the R-worker builds it: the request's id, layer and shape, the reply's type,
// frame count and status.
zmq::message_t reply_header(const Header& req, MsgType type, size_t n_frames, ErrorCode status = ErrorCode::None) {
  Header h;
  h.type = uint16_t(type);
  h.request_id = req.request_id;
  h.layer = req.layer;
  h.n_seq = req.n_seq;
  h.n_heads = req.n_heads;
  h.n_kv_heads = req.n_kv_heads;
  h.head_dim = req.head_dim;
  h.dtype = req.dtype;
  h.n_frames = uint8_t(n_frames);
  h.status = int32_t(status);
  const auto bytes = proto::encode_header(h);
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
  int io_threads = 1, fail_after = 0;
  double max_message_mb = 1024;
  bool print_endpoint = false;
  app.add_option("--listen", listen, "ZeroMQ endpoint to bind (as fd-rworker)")->capture_default_str();
  app.add_option("--ipc", ipc,
                 "bind ipc://PATH instead of --listen (fd::SpawnedRWorker always appends a loopback --listen)");
  app.add_flag("--print-endpoint", print_endpoint, "print the bound endpoint on stdout once listening (as fd-rworker)");
  app.add_option("--io-threads", io_threads, "zmq I/O threads")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--max-message-mb", max_message_mb, "largest accepted request (as fd-rworker)")
      ->check(CLI::Range(1.0, 65536.0))
      ->capture_default_str();
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
    zmq::context_t ctx(io_threads);
    zmq::socket_t sock(ctx, zmq::socket_type::router);
    sock.set(zmq::sockopt::linger, 0);
    sock.set(zmq::sockopt::maxmsgsize, int64_t(limits.max_message_bytes));
    const std::string ep = ipc.empty() ? listen : "ipc://" + ipc;
    try {
      sock.bind(ep);
    } catch (const zmq::error_t& e) {
      FD_THROW("cannot listen on " << ep << ": " << e.what());
    }
    if (print_endpoint) {
      std::printf("%s\n", sock.get(zmq::sockopt::last_endpoint).c_str());
      std::fflush(stdout);
    }
    ReplyBytes o;
    int attends = 0;
    bool shutdown = false;
    std::vector<zmq::message_t> parts;
    std::vector<proto::Frame> frames;
    while (!shutdown && !g_stop) {
      zmq::pollitem_t item{sock.handle(), 0, ZMQ_POLLIN, 0};
      try {
        zmq::poll(&item, 1, std::chrono::milliseconds(100));
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        throw;
      }
      if (!(item.revents & ZMQ_POLLIN)) {
        if (getppid() != parent) return 0;
        continue;
      }
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
      Header req{};
      if (frames[0].size == proto::kHeaderBytes) std::memcpy(&req, frames[0].data, proto::kHeaderBytes);
      std::vector<zmq::message_t> reply;
      try {
        const proto::Message m = proto::decode(frames.data(), frames.size(), limits);
        if (m.h.msg_type() == MsgType::Attend) {
          if (fail_after > 0 && attends >= fail_after) {
            std::fprintf(stderr, "fd-transport-bench serve: --fail-after %d: exiting with status 3\n", fail_after);
            std::fflush(stderr);
            std::_Exit(3);
          }
          ++attends;
          const size_t n =
              size_t(m.h.n_seq) * m.h.n_heads * m.h.head_dim * proto::wire_dtype_size(proto::WireDType(m.h.dtype));
          reply.push_back(reply_header(m.h, MsgType::AttendReply, 1));
          reply.emplace_back(o.get(n), n, nullptr, nullptr);  // zero-copy, constant bytes
        } else if (m.h.msg_type() == MsgType::Shutdown) {
          reply.push_back(reply_header(m.h, MsgType::Ok, 0));
          shutdown = true;
        } else {
          throw proto::ProtocolError(ErrorCode::Malformed, std::string(proto::msg_type_name(m.h.msg_type())) +
                                                               ": this echo R-worker answers ATTEND and SHUTDOWN only");
        }
      } catch (const proto::ProtocolError& e) {
        reply.clear();
        reply.push_back(reply_header(req, MsgType::Error, 1, e.code()));
        reply.emplace_back(e.what(), std::strlen(e.what()));
      }
      // Routing id, then the reply. A peer that vanished just loses it.
      sock.send(parts[0], zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      for (size_t i = 0; i < reply.size(); ++i)
        sock.send(reply[i], i + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
    return 0;
  });
}

}  // namespace fd::bench
