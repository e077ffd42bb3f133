#include "fastdecode/wire/register.h"

#include <unistd.h>

#include <set>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "fastdecode/core/clock.h"
#include "fastdecode/core/error.h"
#include "fastdecode/core/json_util.h"

namespace fd {

std::string advertised_endpoint(const std::string& bound) {
  if (bound.rfind("tcp://", 0) != 0) return bound;
  const size_t colon = bound.rfind(':');
  const std::string host = bound.substr(6, colon - 6);
  if (host != "0.0.0.0" && host != "*" && host != "[::]" && host != "::") return bound;
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || !*name) FD_THROW("cannot tell this host's name to advertise " << bound);
  return "tcp://" + std::string(name) + bound.substr(colon);
}

void register_with(const std::string& register_ep, const std::string& endpoint, const std::string& name, int timeout_ms,
                   const std::string& curve_public) {
  zmq::context_t ctx(1);
  json msg = {{"fd_register", 1}, {"endpoint", endpoint}, {"name", name}};
  if (!curve_public.empty()) msg["curve_public"] = curve_public;
  const std::string text = msg.dump();
  const int64_t deadline = now_ns() + int64_t(timeout_ms) * 1'000'000;
  std::string last = "no answer";
  // A REQ socket that timed out cannot send again: a fresh one per try.
  while (now_ns() < deadline) {
    zmq::socket_t req(ctx, zmq::socket_type::req);
    req.set(zmq::sockopt::linger, 0);
    try {
      req.connect(register_ep);
    } catch (const zmq::error_t& e) {
      throw ConfigError("--register " + register_ep + ": " + e.what());
    }
    req.send(zmq::buffer(text), zmq::send_flags::none);
    zmq::pollitem_t item{req.handle(), 0, ZMQ_POLLIN, 0};
    const int64_t left = std::max<int64_t>(1, std::min<int64_t>((deadline - now_ns()) / 1'000'000, 2000));
    zmq::poll(&item, 1, std::chrono::milliseconds(left));
    if (!(item.revents & ZMQ_POLLIN)) continue;
    zmq::message_t reply;
    if (!req.recv(reply)) continue;
    if (reply.to_string() == "ok") return;
    FD_THROW("the S-worker at " << register_ep << " refused the registration of " << endpoint << ": " << peer_text(reply.data(), reply.size(), 400));
  }
  FD_THROW("no S-worker answered at " << register_ep << " within " << timeout_ms << " ms (" << last
                                       << "): is engine.rworkers.register set to it and the run started?");
}

struct Registrar::Impl {
  zmq::context_t ctx{1};
  zmq::socket_t sock{ctx, zmq::socket_type::router};
  std::string bound;
};

Registrar::Registrar(const std::string& endpoint) : impl_(std::make_unique<Impl>()) {
  impl_->sock.set(zmq::sockopt::linger, 0);
  impl_->sock.set(zmq::sockopt::maxmsgsize, int64_t(1) << 16);  // a registration is a few hundred bytes
  try {
    impl_->sock.bind(endpoint);
  } catch (const zmq::error_t& e) {
    throw ConfigError("engine.rworkers.register: cannot listen on " + endpoint + ": " + e.what());
  }
  impl_->bound = impl_->sock.get(zmq::sockopt::last_endpoint);
}

Registrar::~Registrar() = default;

const std::string& Registrar::endpoint() const { return impl_->bound; }

std::vector<Registration> Registrar::wait(size_t n, int timeout_ms, const std::function<void(size_t, size_t)>& progress) {
  std::vector<Registration> out;
  std::set<std::string> seen;
  const int64_t deadline = now_ns() + int64_t(timeout_ms) * 1'000'000;
  while (out.size() < n) {
    const int64_t left = (deadline - now_ns()) / 1'000'000;
    if (left <= 0)  // as an endpoint nothing answers at: a config error, before any work
      throw ConfigError("engine.rworkers.expect " + std::to_string(n) + ": " + std::to_string(out.size()) +
                        " R-worker(s) registered at " + impl_->bound + " within engine.rworkers.register_timeout_ms " +
                        std::to_string(timeout_ms) + " ms (start them with fd-rworker --register " + impl_->bound + ")");
    zmq::pollitem_t item{impl_->sock.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(std::min<int64_t>(left, 500)));
    if (!(item.revents & ZMQ_POLLIN)) continue;
    std::vector<zmq::message_t> parts;
    if (!zmq::recv_multipart(impl_->sock, std::back_inserter(parts), zmq::recv_flags::dontwait)) continue;
    if (parts.size() != 3 || parts[1].size() != 0) continue;  // not a REQ's envelope: ignored
    std::string answer = "ok";
    Registration r;
    try {
      const json j = json::parse(parts[2].to_string());
      if (!j.is_object() || j.value("fd_register", 0) != 1 || !j.contains("endpoint") || !j["endpoint"].is_string())
        throw std::runtime_error("not a registration");
      r.endpoint = j["endpoint"].get<std::string>();
      r.name = j.value("name", std::string());
      // What a registering peer sends is logged and used: an endpoint or a name longer than any real one is refused.
      if (r.endpoint.size() > 256 || r.name.size() > 128)
        throw std::runtime_error("an endpoint over 256 bytes or a name over 128 bytes");
      if (r.endpoint.rfind("tcp://", 0) != 0 && r.endpoint.rfind("ipc://", 0) != 0)
        throw std::runtime_error("endpoint " + peer_text(r.endpoint) + " is not tcp:// or ipc://");
    } catch (const std::exception& e) {
      answer = "bad registration: " + peer_text(std::string(e.what()), 300);
    }
    std::vector<zmq::message_t> reply;
    reply.push_back(std::move(parts[0]));
    reply.emplace_back();
    reply.emplace_back(answer);
    zmq::send_multipart(impl_->sock, reply, zmq::send_flags::dontwait);
    if (answer != "ok" || !seen.insert(r.endpoint).second) continue;
    out.push_back(r);
    if (progress) progress(out.size(), n);
  }
  return out;
}

}  // namespace fd
