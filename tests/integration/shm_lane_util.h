// What the shared-memory lane's tests share (test_shm_lane.cpp, test_shm_rings.cpp): a spawned fd-rworker, headers of
// the tests' model shape, a client offering a region, a step's ATTEND inputs, a raw DEALER.
#pragma once
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fastdecode/sworker/rworker_spawn.h"
#include "fastdecode/wire/rworker_client.h"
#include "tests/unit/rworker_test_util.h"
#include "tests/unit/test_helpers.h"

namespace shm_lane_test {

using namespace fd;
using namespace fd::proto;

constexpr int kLayers = 2, kH = 8, kKV = 4, kD = 64;

struct Worker : SpawnedRWorker {
  explicit Worker(const std::string& name, std::vector<std::string> more = {})
      : SpawnedRWorker(std::string(FD_BIN_DIR) + "/fd-rworker", with(name, std::move(more))) {}
  static std::vector<std::string> with(const std::string& name, std::vector<std::string> more) {
    std::vector<std::string> a = {"--threads", "1", "--memory-gb", "0.2", "--name", name};
    a.insert(a.end(), more.begin(), more.end());
    return a;
  }
};

inline Header dims(MsgType t, uint32_t n_seq, uint32_t layer = 0) {
  Header h = make_header(t, kH, kKV, kD, WireDType::F16);
  h.n_seq = n_seq;
  h.layer = layer;
  return h;
}

inline RWorkerClientOptions with_shm(size_t bytes) {
  RWorkerClientOptions o;
  o.timeout_ms = 20000;
  o.shm_bytes = bytes;
  return o;
}

inline std::vector<uint8_t> bytes_of(const zmq::message_t& m) {
  const auto* p = static_cast<const uint8_t*>(m.data());
  return {p, p + m.size()};
}

// One step's ATTEND inputs for n sequences.
struct Step {
  std::vector<uint64_t> ids;
  std::vector<uint16_t> q, k, v;
  Step(uint32_t n, std::mt19937& rng, uint64_t first_id = 1)
      : q(fd::test::random_f16(n * kH * kD, rng)), k(fd::test::random_f16(n * kKV * kD, rng)), v(fd::test::random_f16(n * kKV * kD, rng)) {
    for (uint32_t i = 0; i < n; ++i) ids.push_back(first_id + i);
  }
  std::vector<ConstBuffer> frames() const {
    return {{ids.data(), ids.size() * 8}, {q.data(), q.size() * 2}, {k.data(), k.size() * 2}, {v.data(), v.size() * 2}};
  }
};

// A DEALER of its own, to send what RWorkerClient never would.
struct RawPeer {
  zmq::context_t ctx{1};
  zmq::socket_t s{ctx, zmq::socket_type::dealer};
  explicit RawPeer(const std::string& ep) {
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::rcvtimeo, 20000);
    s.connect(ep);
  }
  // Sends header + frames, returns the reply's header and frames.
  std::pair<Header, std::vector<zmq::message_t>> call(Header h, const std::vector<std::vector<uint8_t>>& frames, uint8_t n_frames) {
    h.n_frames = n_frames;
    const auto head = encode_header(h);
    s.send(zmq::buffer(head.data(), head.size()), frames.empty() ? zmq::send_flags::none : zmq::send_flags::sndmore);
    for (size_t i = 0; i < frames.size(); ++i)
      s.send(zmq::buffer(frames[i].data(), frames[i].size()), i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    std::vector<zmq::message_t> reply;
    EXPECT_TRUE(zmq::recv_multipart(s, std::back_inserter(reply)));
    Header r;
    std::memcpy(&r, reply.at(0).data(), kHeaderBytes);
    reply.erase(reply.begin());
    return {r, std::move(reply)};
  }
  std::string error_of(const Header& h, const std::vector<zmq::message_t>& frames) {
    if (h.msg_type() != MsgType::Error) return std::string("no error: ") + msg_type_name(h.msg_type());
    return std::string(error_code_name(ErrorCode(h.status))) + ": " + frames.at(0).to_string();
  }
};


}  // namespace shm_lane_test
