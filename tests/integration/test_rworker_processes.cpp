// fd-rworker processes over TCP loopback, driven by the S-side client: correctness against a double
// reference with two workers in flight at once, garbage on the socket, a stopped worker (deadline),
// a killed worker, and clean shutdown.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <random>

#include "fastdecode/rworker/service.h"
#include "fastdecode/wire/rworker_client.h"
#include "fastdecode/sworker/rworker_spawn.h"
#include "tests/unit/rworker_test_util.h"
#include "tests/unit/test_helpers.h"


using namespace fd;
using namespace fd::proto;

namespace {

constexpr int kLayers = 2, kH = 8, kKV = 4, kD = 64;

// A child fd-rworker on an ephemeral loopback port (the engine's own spawning code).
struct Worker : SpawnedRWorker {
  explicit Worker(const std::string& name, const std::string& kv_dtype = "fp16")
      : SpawnedRWorker(std::string(FD_BIN_DIR) + "/fd-rworker",
                       {"--threads", "2", "--memory-gb", "0.5", "--kv-dtype", kv_dtype, "--name", name}) {}
};

Header dims(MsgType t, uint32_t n_seq, uint32_t layer = 0) {
  Header h = make_header(t, kH, kKV, kD, WireDType::F16);
  h.n_seq = n_seq;
  h.layer = layer;
  return h;
}

}  // namespace

TEST(RWorkerProcesses, TwoWorkersConcurrentAttendMatchesReference) {
  Worker a("w0"), b("w1", "int8");
  RWorkerClient c({a.endpoint(), b.endpoint()}, 20000);
  for (size_t w = 0; w < 2; ++w) {
    const json info = c.hello(w, kLayers, kH, kKV, kD, WireDType::F16);
    EXPECT_EQ(info["block_tokens"], 32);
  }
  // Worker 0 holds sequences 1, 2; worker 1 holds 3 (int8 KV: compared with a looser bound).
  c.add_seqs(0, {1, 2});
  c.add_seqs(1, {3});
  std::mt19937 rng(9);
  std::vector<std::vector<float>> K(4), V(4);  // per sequence, layer 1 only
  for (int step = 0; step < 70; ++step) {
    const auto q = fd::test::random_f16(3 * kH * kD, rng), k = fd::test::random_f16(3 * kKV * kD, rng),
               v = fd::test::random_f16(3 * kKV * kD, rng);
    const std::vector<uint64_t> ids0 = {1, 2}, ids1 = {3};
    const size_t qs = kH * kD * 2, ks = kKV * kD * 2;
    // Both requests in flight before waiting: the S-worker's pattern.
    const uint64_t r0 = c.send(0, dims(MsgType::Attend, 2, 1),
                               {{ids0.data(), 16}, {q.data(), 2 * qs}, {k.data(), 2 * ks}, {v.data(), 2 * ks}});
    const uint64_t r1 = c.send(1, dims(MsgType::Attend, 1, 1),
                               {{ids1.data(), 8}, {q.data() + 2 * kH * kD, qs}, {k.data() + 2 * kKV * kD, ks}, {v.data() + 2 * kKV * kD, ks}});
    const auto replies = c.wait({{0, r0}, {1, r1}});
    ASSERT_EQ(replies[0].h.msg_type(), MsgType::AttendReply);
    ASSERT_EQ(replies[1].h.request_id, r1);
    for (int s = 0; s < 3; ++s) {
      for (int j = 0; j < kKV * kD; ++j) {
        K[s].push_back(fp16_to_fp32(k[s * kKV * kD + j]));
        V[s].push_back(fp16_to_fp32(v[s * kKV * kD + j]));
      }
      std::vector<float> qs32(kH * kD);
      for (int j = 0; j < kH * kD; ++j) qs32[j] = fp16_to_fp32(q[s * kH * kD + j]);
      const auto ref = fd::test::reference_attention(qs32, K[s], V[s], step + 1, kH, kKV, kD);
      const auto& frame = s < 2 ? replies[0].frames[0] : replies[1].frames[0];
      const size_t row = s < 2 ? size_t(s) : 0;
      std::vector<uint16_t> o(kH * kD);
      std::memcpy(o.data(), static_cast<const uint8_t*>(frame.data()) + row * kH * kD * 2, o.size() * 2);
      const double tol = s < 2 ? 2e-3 : 2e-2;  // int8 keys/values: ~1% relative error per element
      for (int j = 0; j < kH * kD; ++j)
        ASSERT_NEAR(fp16_to_fp32(o[j]), ref[j], tol + tol * std::fabs(ref[j])) << "step " << step << " seq " << s << " i " << j;
    }
  }
  EXPECT_EQ(c.stats(0)["tokens"], 2 * 70);
  EXPECT_EQ(c.stats(1)["kv_dtype"], "int8");
  c.free_seqs(0, {1, 2});
  EXPECT_EQ(c.stats(0)["session"]["memory_used_bytes"], 0);
  EXPECT_EQ(c.stats(0)["memory_used_bytes"], fd::kSessionBytes);  // what remains: the session itself
  c.shutdown(0, a.token());
  c.shutdown(1, b.token());
  EXPECT_EQ(a.wait_exit(), 0);
  EXPECT_EQ(b.wait_exit(), 0);
}

TEST(RWorkerProcesses, GarbageGetsErrorAndWorkerKeepsServing) {
  Worker a("w0");
  zmq::context_t ctx(1);
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.set(zmq::sockopt::rcvtimeo, 20000);
  raw.connect(a.endpoint());
  std::mt19937 rng(4);
  for (int i = 0; i < 200; ++i) {
    const int n = 1 + int(rng() % 4);
    for (int p = 0; p < n; ++p) {
      std::string bytes(rng() % 100, '\0');
      for (auto& ch : bytes) ch = char(rng());
      raw.send(zmq::buffer(bytes), p + 1 < n ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
    std::vector<zmq::message_t> reply;
    ASSERT_TRUE(zmq::recv_multipart(raw, std::back_inserter(reply)));
    Header h;
    ASSERT_EQ(reply[0].size(), kHeaderBytes);
    std::memcpy(&h, reply[0].data(), kHeaderBytes);
    ASSERT_EQ(h.msg_type(), MsgType::Error);
  }
  RWorkerClient c({a.endpoint()}, 20000);
  c.hello(0, kLayers, kH, kKV, kD, WireDType::F16);
  c.add_seqs(0, {5});
  EXPECT_EQ(c.stats(0)["sequences"], 1);
  EXPECT_GE(c.stats(0)["errors"].get<int>(), 200);
  // An ERROR reply reaches the caller as an fd::Error naming the worker.
  const std::string msg = fd::test::error_message([&] { c.add_seqs(0, {5}); });
  EXPECT_THAT(msg, ::testing::HasSubstr("R-worker 0 (" + a.endpoint() + ")"));
  EXPECT_THAT(msg, ::testing::HasSubstr("duplicate-sequence"));
}

TEST(RWorkerProcesses, StoppedOrKilledWorkerMissesDeadlineNeverHangs) {
  Worker a("w0"), b("w1");
  RWorkerClient c({a.endpoint(), b.endpoint()}, 20000);
  c.hello(0, kLayers, kH, kKV, kD, WireDType::F16);
  c.hello(1, kLayers, kH, kKV, kD, WireDType::F16);
  kill(b.pid(), SIGSTOP);
  const uint64_t r0 = c.send(0, dims(MsgType::Stats, 0), {});
  const uint64_t r1 = c.send(1, dims(MsgType::Stats, 0), {});
  // Every worker still owing a reply at the deadline is named: the stopped one is among them even when
  // the healthy worker 0 was slow too (a loaded machine).
  const std::string msg = fd::test::error_message([&] { c.wait({{0, r0}, {1, r1}}, 300); });
  EXPECT_THAT(msg, ::testing::HasSubstr("R-worker 1 (" + b.endpoint() + ") missed its deadline of 300 ms"));
  kill(a.pid(), SIGSTOP);  // both stopped: both named
  const uint64_t r3 = c.send(0, dims(MsgType::Stats, 0), {});
  const std::string both = fd::test::error_message([&] { c.wait({{0, r3}, {1, r1}}, 300); });
  EXPECT_THAT(both, ::testing::HasSubstr("R-worker 0 (" + a.endpoint() + ") missed its deadline of 300 ms"));
  EXPECT_THAT(both, ::testing::HasSubstr("R-worker 1 (" + b.endpoint() + ") missed its deadline of 300 ms"));
  kill(a.pid(), SIGCONT);
  kill(b.pid(), SIGCONT);
  c.wait({{0, r3}}, 20000);
  kill(a.pid(), SIGKILL);
  // A killed worker's connection drops: the client knows it lost it before any deadline (the send or the wait
  // names it, whichever comes after the drop).
  const std::string killed = fd::test::error_message([&] {
    const uint64_t r2 = c.send(0, dims(MsgType::Stats, 0), {});
    c.wait({{0, r2}}, 2000);
  });
  EXPECT_THAT(killed, ::testing::AnyOf(::testing::HasSubstr("R-worker 0 (" + a.endpoint() + ") is lost: its connection dropped"),
                                       ::testing::HasSubstr("R-worker 0 (" + a.endpoint() + ") missed its deadline of 2000 ms")));
  EXPECT_TRUE(c.lost(0));
  // The resumed worker answers again (its late reply to r1 is also there).
  EXPECT_EQ(c.stats(1)["name"], "w1");
}

// send() copies a request's small frames (ids, counts) into the message: the caller may reuse or free them as soon as
// it returns. A FREE_SEQ queued behind 15 MB that a stopped worker does not read (libzmq would read a zero-copy frame
// only when it gets to it) frees the id it was sent with, not what its buffer held by then (the S-rank clears its
// pending frees' ids before their replies come: a freed buffer's bytes once went out as a sequence id, CI-flaky).
TEST(RWorkerProcesses, SmallFramesAreTheCallersOnceSendReturns) {
  Worker a("w0");
  RWorkerClient c({a.endpoint()}, 20000);
  c.hello(0, kLayers, kH, kKV, kD, WireDType::F16);
  c.add_seqs(0, {11, 12});
  kill(a.pid(), SIGSTOP);
  std::vector<uint8_t> filler(15u << 20, 0);  // a STATS with a frame it does not take: ERROR malformed, later
  const uint64_t f = c.send(0, dims(MsgType::Stats, 0), {{filler.data(), filler.size()}});
  std::vector<uint64_t> ids{11};
  const uint64_t r = c.send_free_seqs(0, ids);
  ids[0] = 12;  // the caller's buffer, changed once send() returned
  kill(a.pid(), SIGCONT);
  const std::string msg = fd::test::error_message([&] { c.wait({{0, f}, {0, r}}, 20000); });
  EXPECT_THAT(msg, ::testing::HasSubstr("malformed"));  // the filler's answer; the FREE_SEQ's is OK
  EXPECT_EQ(c.stats(0)["sequences"], 1);
  EXPECT_NO_THROW(c.free_seqs(0, {12}));  // 12 is still there: 11 went
  EXPECT_THAT(fd::test::error_message([&] { c.free_seqs(0, {11}); }), ::testing::HasSubstr("unknown-sequence"));
}

// The client checks replies as the worker checks requests: a reply whose frames do not match its
// header's dimensions, or a message that is not a reply type, is an fd::Error naming the worker (a
// peer on the socket that is not an fd-rworker, here a raw ROUTER, cannot hand the engine bad tensors).
TEST(RWorkerProcesses, ClientRejectsMalformedReplies) {
  zmq::context_t ctx(1);
  zmq::socket_t fake(ctx, zmq::socket_type::router);
  fake.set(zmq::sockopt::linger, 0);
  fake.bind("tcp://127.0.0.1:*");
  const std::string ep = fake.get(zmq::sockopt::last_endpoint);
  RWorkerClient c({ep}, 20000);
  auto answer = [&](Header reply, std::vector<std::vector<uint8_t>> frames) {
    const uint64_t id = c.send(0, dims(MsgType::Stats, 0), {});
    std::vector<zmq::message_t> req;
    EXPECT_TRUE(zmq::recv_multipart(fake, std::back_inserter(req)));
    reply.request_id = id;
    reply.n_frames = uint8_t(frames.size());
    const auto hb = encode_header(reply);
    fake.send(req[0], zmq::send_flags::sndmore);  // the DEALER's identity
    fake.send(zmq::buffer(hb.data(), hb.size()), frames.empty() ? zmq::send_flags::none : zmq::send_flags::sndmore);
    for (size_t i = 0; i < frames.size(); ++i)
      fake.send(zmq::buffer(frames[i]), i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    return fd::test::error_message([&] { c.wait({{0, id}}, 20000); });
  };
  // An ATTEND reply for 1 sequence of 8 heads x 64 (fp16) must carry 1024 bytes; this one carries 1000.
  const std::string short_frame = answer(dims(MsgType::AttendReply, 1), {std::vector<uint8_t>(1000)});
  EXPECT_THAT(short_frame, ::testing::HasSubstr("R-worker 0 (" + ep + ") sent a malformed reply"));
  EXPECT_THAT(short_frame, ::testing::HasSubstr("expected 1024"));
  // A request type is not an answer.
  EXPECT_THAT(answer(dims(MsgType::FreeSeq, 1), {std::vector<uint8_t>(8)}), ::testing::HasSubstr("which is not a reply"));
  // A well-formed reply goes through.
  const uint64_t id = c.send(0, dims(MsgType::Stats, 0), {});
  std::vector<zmq::message_t> req;
  ASSERT_TRUE(zmq::recv_multipart(fake, std::back_inserter(req)));
  Header ok = dims(MsgType::Ok, 0);
  ok.request_id = id;
  const auto hb = encode_header(ok);
  fake.send(req[0], zmq::send_flags::sndmore);
  fake.send(zmq::buffer(hb.data(), hb.size()), zmq::send_flags::none);
  EXPECT_EQ(c.wait({{0, id}}, 20000).at(0).h.msg_type(), MsgType::Ok);
}

// A worker that cannot start (here: pinned to a CPU the machine does not have) is reported with its
// command line and how it ended, not as a raw wait status.
TEST(RWorkerProcesses, WorkerThatCannotStartIsNamedWithItsCommand) {
  const std::string msg = fd::test::error_message([&] {
    SpawnedRWorker w(std::string(FD_BIN_DIR) + "/fd-rworker", {"--threads", "1", "--cpus", "1000"});
  });
  EXPECT_THAT(msg, ::testing::HasSubstr("--cpus 1000` exited with status 1 without reporting an endpoint"));
}
