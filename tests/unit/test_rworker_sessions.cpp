// R-worker sessions (issue 16; docs/SECURITY.md): one per client, driven through RWorkerService with the client
// (peer) id the socket loop passes: ids scoped per session, the shared memory limit, the per-session quota, the
// session count, the SHUTDOWN token, TRUNCATE checked before any change.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "fastdecode/rworker/service.h"
#include "rworker_test_util.h"

using namespace fd;
using namespace fd::proto;
using fd::test::bytes_of;
using fd::test::make_message;
using fd::test::RawMessage;

namespace {

constexpr int kLayers = 2, kH = 8, kKV = 2, kD = 64;

Header dims(MsgType t, uint32_t n_seq = 0) { return make_header(t, kH, kKV, kD, WireDType::F16, n_seq); }

Header reply_header(const std::vector<zmq::message_t>& r) {
  Header h;
  std::memcpy(&h, r.at(0).data(), kHeaderBytes);
  return h;
}

}  // namespace

namespace {

// A client of a service driven directly: its messages carry its peer id, as the socket loop passes them.
struct Client {
  RWorkerService& svc;
  std::string peer;
  std::vector<zmq::message_t> send(const RawMessage& m) {
    const auto f = m.frames();
    return svc.handle(peer, f.data(), f.size());
  }
  ErrorCode error(const RawMessage& m) {
    const Header h = reply_header(send(m));
    return h.msg_type() == MsgType::Error ? ErrorCode(h.status) : ErrorCode::None;
  }
  ErrorCode hello(uint32_t layers = kLayers) {
    Header h = dims(MsgType::Hello);
    h.layer = layers;
    return error(make_message(h, {}));
  }
  RawMessage ids(MsgType t, const std::vector<uint64_t>& v) { return make_message(dims(t, uint32_t(v.size())), {bytes_of(v)}); }
  ErrorCode append(const std::vector<uint64_t>& v, uint32_t tokens_each, std::mt19937& rng) {
    Header a = dims(MsgType::AppendKV, uint32_t(v.size()));
    a.n_tokens = uint32_t(v.size()) * tokens_each;
    const auto k = fd::test::random_f16(size_t(a.n_tokens) * kKV * kD, rng);
    return error(make_message(a, {bytes_of(v), bytes_of(std::vector<uint32_t>(v.size(), tokens_each)), bytes_of(k), bytes_of(k)}));
  }
  json stats() {
    const auto r = send(make_message(dims(MsgType::Stats), {}));
    return json::parse(std::string(static_cast<const char*>(r.at(1).data()), r.at(1).size()));
  }
};

}  // namespace

// Another client cannot read, append to, free, probe or re-shape a client's sequences, nor stop the worker without
// its token: ids are scoped per session. Ending a session (CLOSE, or its connection gone) frees all it held.
TEST(RWorkerSessions, IdsAreScopedPerClient) {
  RWorkerService svc(RWorkerConfig{KVDType::F16, size_t(1) << 26, 2, best_isa(), Limits{}, "test"});
  std::mt19937 rng(3);
  Client a{svc, "a"}, b{svc, "b"};
  ASSERT_EQ(a.hello(), ErrorCode::None);
  ASSERT_EQ(a.error(a.ids(MsgType::AddSeq, {1, 2})), ErrorCode::None);
  ASSERT_EQ(a.append({1, 2}, 5, rng), ErrorCode::None);
  // b, before any HELLO: nothing of a's is reachable.
  EXPECT_EQ(b.error(b.ids(MsgType::FreeSeq, {1})), ErrorCode::NotConfigured);
  EXPECT_EQ(b.append({1}, 0, rng), ErrorCode::NotConfigured);  // the 0-token probe of a live id
  const auto q = fd::test::random_f16(kH * kD, rng), kv = fd::test::random_f16(kKV * kD, rng);
  EXPECT_EQ(b.error(make_message(dims(MsgType::Attend, 1), {bytes_of(std::vector<uint64_t>{1}), bytes_of(q), bytes_of(kv), bytes_of(kv)})),
            ErrorCode::NotConfigured);
  // b's own session (another shape is fine): its id 1 is not a's.
  ASSERT_EQ(b.hello(kLayers + 3), ErrorCode::None);
  EXPECT_EQ(b.error(b.ids(MsgType::FreeSeq, {1})), ErrorCode::UnknownSequence);
  EXPECT_EQ(b.append({1}, 0, rng), ErrorCode::UnknownSequence);
  ASSERT_EQ(b.error(b.ids(MsgType::AddSeq, {1})), ErrorCode::None);
  ASSERT_EQ(b.append({1}, 7, rng), ErrorCode::None);
  EXPECT_EQ(b.error(b.ids(MsgType::FreeSeq, {1})), ErrorCode::None);
  EXPECT_EQ(a.stats()["session"]["tokens"], 2 * 5 * 1);  // a's sequences untouched (layer 0 only)
  EXPECT_EQ(a.stats()["session"]["sequences"], 2);
  EXPECT_EQ(b.stats()["session"]["sequences"], 0);
  EXPECT_EQ(b.stats()["sequences"], 2);  // worker-wide counts are visible, never ids
  EXPECT_EQ(b.error(make_message(dims(MsgType::Shutdown), {std::vector<uint8_t>(kShutdownTokenBytes, 0)})), ErrorCode::Forbidden);
  EXPECT_FALSE(svc.shutdown_requested());
  // a's connection gone: its session ends, its memory comes back, b is untouched.
  const size_t before = svc.stats()["memory_used_bytes"].get<size_t>();
  svc.end_session("a");
  EXPECT_EQ(svc.sessions(), 1u);
  EXPECT_LT(svc.stats()["memory_used_bytes"].get<size_t>(), before);
  EXPECT_EQ(svc.stats()["sequences"], 0);
  EXPECT_EQ(a.error(a.ids(MsgType::FreeSeq, {1})), ErrorCode::NotConfigured);  // a must HELLO again
  // CLOSE ends b's.
  EXPECT_EQ(b.error(make_message(dims(MsgType::Close), {})), ErrorCode::None);
  EXPECT_EQ(svc.sessions(), 0u);
  EXPECT_EQ(svc.stats()["memory_used_bytes"], 0);
}

// The worker's memory is shared: one client's sequences leave less for the others, a per-session quota bounds each
// one's share, and the number of sessions is bounded; SHUTDOWN obeys the token only.
TEST(RWorkerSessions, QuotaLimitAndToken) {
  const size_t blk = kv_fp16_block_bytes(kKV, kD), seq = KVStore::sequence_bytes(kLayers);
  RWorkerConfig cfg{KVDType::F16, 2 * kSessionBytes + 4 * blk + 2 * seq, 2, best_isa(), Limits{}, "test"};
  cfg.session_quota_bytes = 3 * blk + seq;
  cfg.max_sessions = 2;
  cfg.shutdown_token = std::string(kShutdownTokenBytes, 'k');
  RWorkerService svc(cfg);
  std::mt19937 rng(4);
  Client a{svc, "a"}, b{svc, "b"}, c{svc, "c"};
  ASSERT_EQ(a.hello(), ErrorCode::None);
  ASSERT_EQ(b.hello(), ErrorCode::None);
  EXPECT_EQ(c.hello(), ErrorCode::Busy);  // max_sessions 2
  ASSERT_EQ(a.error(a.ids(MsgType::AddSeq, {1})), ErrorCode::None);
  ASSERT_EQ(b.error(b.ids(MsgType::AddSeq, {1})), ErrorCode::None);
  ASSERT_EQ(a.append({1}, 96, rng), ErrorCode::None);          // 3 blocks at layer 0: a's quota
  EXPECT_EQ(a.append({1}, 1, rng), ErrorCode::OutOfMemory);    // a 4th is over it
  ASSERT_EQ(b.append({1}, 32, rng), ErrorCode::None);          // the worker's 4th block
  EXPECT_EQ(b.append({1}, 1, rng), ErrorCode::OutOfMemory);    // over the worker's limit (b's quota has room)
  EXPECT_EQ(a.error(make_message(dims(MsgType::Shutdown), {std::vector<uint8_t>(kShutdownTokenBytes, 'x')})), ErrorCode::Forbidden);
  EXPECT_FALSE(svc.shutdown_requested());
  EXPECT_EQ(a.error(make_message(dims(MsgType::Shutdown), {std::vector<uint8_t>(kShutdownTokenBytes, 'k')})), ErrorCode::None);
  EXPECT_TRUE(svc.shutdown_requested());
}

// TRUNCATE over the wire: all-or-nothing per message (a sequence that cannot be cut stops the whole request).
TEST(RWorkerSessions, TruncateIsCheckedBeforeAnyChange) {
  RWorkerService svc(RWorkerConfig{KVDType::I8, size_t(1) << 26, 2, best_isa(), Limits{}, "test"});
  std::mt19937 rng(5);
  Client a{svc, "a"};
  ASSERT_EQ(a.hello(), ErrorCode::None);
  ASSERT_EQ(a.error(a.ids(MsgType::AddSeq, {1, 2})), ErrorCode::None);
  ASSERT_EQ(a.append({1, 2}, 40, rng), ErrorCode::None);
  const auto cut = [&](std::vector<uint32_t> len) {
    return a.error(make_message(dims(MsgType::Truncate, 2), {bytes_of(std::vector<uint64_t>{1, 2}), bytes_of(len)}));
  };
  EXPECT_EQ(cut({35, 20}), ErrorCode::Unsupported);  // seq 2 would reopen a quantized block: neither is cut
  EXPECT_EQ(a.stats()["session"]["tokens"], 80);
  EXPECT_EQ(cut({35, 39}), ErrorCode::None);
  EXPECT_EQ(a.stats()["session"]["tokens"], 74);
  EXPECT_EQ(a.error(make_message(dims(MsgType::Truncate, 1), {bytes_of(std::vector<uint64_t>{9}), bytes_of(std::vector<uint32_t>{1})})),
            ErrorCode::UnknownSequence);
}

