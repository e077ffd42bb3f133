// The rings in a shared-memory region's header page (fastdecode/wire/shm.h, docs/RWORKER.md "Rings"): a message goes
// exactly one way under a racing taker, the rings carry requests and replies while both sides poll, the client's order
// holds across the two ways, and a client that lies about its order cannot make the worker hold more than a bound.
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "fastdecode/wire/shm.h"
#include "tests/integration/shm_lane_util.h"

using namespace fd;
using namespace fd::proto;
using namespace shm_lane_test;

// The rings in the region's header page (shm::RingEnd), in one process: a message goes into a slot only while the
// taker polls (else it is withdrawn, for ZeroMQ), comes out whole and in turn, a full ring says so, and under two
// threads racing the taker's word against the publisher every message goes exactly one way: taken once if put()
// said Published, never taken if it said Withdrawn or Full.
TEST(ShmRings, AMessageGoesOneWayOnly) {
  const std::shared_ptr<shm::Region> r = shm::Region::create(size_t(64) << 10);
  shm::RingEnd pub(r->base(), shm::Ring::Requests), taker(r->base(), shm::Ring::Requests);
  std::array<uint8_t, kHeaderBytes> head{};
  const auto msg = [&](uint32_t i) {
    std::memcpy(head.data(), &i, 4);
    return head;
  };
  std::vector<shm::RingMessage> got;
  EXPECT_FALSE(pub.taker_spinning());
  EXPECT_EQ(pub.put(msg(1), {1, 2, 3}, 7), shm::RingEnd::Put::Withdrawn) << "nobody polls: the message goes over ZeroMQ";
  EXPECT_EQ(taker.take(got), 0u) << "a withdrawn message is never taken";
  taker.set_spinning(true);
  EXPECT_TRUE(pub.taker_spinning());
  for (uint32_t i = 2; i < 2 + shm::kRingSlots; ++i)
    EXPECT_EQ(pub.put(msg(i), std::vector<uint8_t>(16 * i % 97, uint8_t(i)), 100 + i), shm::RingEnd::Put::Published) << i;
  EXPECT_EQ(pub.put(msg(99), {}, 0), shm::RingEnd::Put::Full) << "every slot is the taker's";
  ASSERT_EQ(taker.take(got), shm::kRingSlots);
  for (uint32_t i = 0; i < shm::kRingSlots; ++i) {
    uint32_t n = 0;
    std::memcpy(&n, got[i].head.data(), 4);
    EXPECT_EQ(n, i + 2);
    EXPECT_EQ(got[i].zmq_before, 102u + i);
    EXPECT_EQ(got[i].desc, std::vector<uint8_t>(16 * (i + 2) % 97, uint8_t(i + 2)));
  }
  EXPECT_EQ(taker.take(got), 0u);
  // A slot out of turn (the peer's bug) stops the taker: nothing after it is taken.
  shm::RingEnd stranger(r->base(), shm::Ring::Requests);  // its own count starts at 0: out of turn now
  EXPECT_EQ(stranger.put(msg(5), {}, 0), shm::RingEnd::Put::Published);
  EXPECT_EQ(taker.take(got), 0u);

  // The race, on the other ring: a publisher thread against a taker that keeps setting and clearing its word.
  const std::shared_ptr<shm::Region> r2 = shm::Region::create(size_t(64) << 10);
  shm::RingEnd p2(r2->base(), shm::Ring::Replies), t2(r2->base(), shm::Ring::Replies);
  constexpr uint32_t kN = 100000;
  std::vector<int> put_said(kN, -1), taken(kN, 0);
  std::atomic<bool> done{false};
  std::thread publisher([&] {
    std::array<uint8_t, kHeaderBytes> h{};
    for (uint32_t i = 0; i < kN; ++i) {
      std::memcpy(h.data(), &i, 4);
      shm::RingEnd::Put said;
      while ((said = p2.put(h, {}, i)) == shm::RingEnd::Put::Full) std::this_thread::yield();  // ZeroMQ would take it
      put_said[i] = int(said);
    }
    done = true;
  });
  std::vector<shm::RingMessage> got2;
  for (uint32_t round = 0; !done || round % 2 == 1; ++round) {
    t2.set_spinning(round % 2 == 0);
    for (int k = 0; k < 1 + int(round % 7); ++k) t2.take(got2);
  }
  publisher.join();
  t2.set_spinning(false);
  t2.take(got2);
  for (const auto& m : got2) {
    uint32_t i = 0;
    std::memcpy(&i, m.head.data(), 4);
    ASSERT_LT(i, kN);
    ++taken[i];
  }
  size_t published = 0, withdrawn = 0, full = 0;
  for (uint32_t i = 0; i < kN; ++i) {
    const bool pub_ok = put_said[i] == int(shm::RingEnd::Put::Published);
    published += pub_ok, withdrawn += put_said[i] == int(shm::RingEnd::Put::Withdrawn), full += put_said[i] == int(shm::RingEnd::Put::Full);
    ASSERT_EQ(taken[i], pub_ok ? 1 : 0) << "message " << i << ": put() said " << put_said[i] << " (0 published, 1 full, 2 withdrawn)";
  }
  EXPECT_GT(published, 0u);
  EXPECT_GT(withdrawn, 0u);
  std::printf("race: %zu published, %zu withdrawn, %zu full of %u\n", published, withdrawn, full, kN);
}

namespace {
// A worker that polls for 20 ms after each request (so it polls whenever this test's client sends the next one) and a
// client that polls for 20 ms before it blocks: the rings carry requests and replies.
struct PollingPair {
  Worker w{"w0", {"--spin-us", "20000"}};
  RWorkerClient c;
  static RWorkerClientOptions opts() {
    RWorkerClientOptions o = with_shm(size_t(8) << 20);
    o.spin_us = 20000;
    return o;
  }
  PollingPair() : c({w.endpoint()}, opts()) {
    c.hello(0, kLayers, kH, kKV, kD, WireDType::F16);
  }
};
}  // namespace

// Through the rings, the same bytes as over ZeroMQ (another session on the same worker, blocking), and the worker's
// count of what it took from the rings matches the client's.
TEST(ShmLane, RingsCarryRequestsAndRepliesWhileBothPoll) {
  PollingPair p;
  RWorkerClient viazmq({p.w.endpoint()}, with_shm(0));
  viazmq.hello(0, kLayers, kH, kKV, kD, WireDType::F16);
  for (RWorkerClient* c : {&p.c, &viazmq}) c->add_seqs(0, {1, 2, 3});
  std::mt19937 rng(11);
  for (int step = 0; step < 40; ++step) {
    const Step s(3, rng);
    const uint32_t layer = uint32_t(step % kLayers);
    const RWorkerReply r1 = p.c.call(0, dims(MsgType::Attend, 3, layer), s.frames());
    const RWorkerReply r2 = viazmq.call(0, dims(MsgType::Attend, 3, layer), s.frames());
    ASSERT_EQ(r1.h.msg_type(), MsgType::AttendReply);
    EXPECT_EQ(r1.h.flags, 0);
    ASSERT_EQ(bytes_of(r1.frames.at(0)), bytes_of(r2.frames.at(0))) << "step " << step;
  }
  const ShmLaneStats st = p.c.shm_stats(0);
  EXPECT_EQ(st.requests_shm, 40u);
  EXPECT_GT(st.requests_ring, 0u) << "no request went through the ring";
  EXPECT_GT(st.replies_ring, 0u) << "no reply came through the ring";
  EXPECT_EQ(st.free_bytes, st.bytes - shm::kRegionHeaderBytes) << "every request's and reply's space given back";
  const json rings = p.c.stats(0)["rings"];
  EXPECT_EQ(rings["requests"].get<uint64_t>(), st.requests_ring);
  EXPECT_EQ(rings["replies"].get<uint64_t>(), st.replies_ring);
  std::printf("rings: %llu of 40 requests, %llu of 40 replies\n", (unsigned long long)st.requests_ring,
              (unsigned long long)st.replies_ring);
}

// The worker takes requests in the order the client sent them, whichever way each came: an ADD_SEQ over ZeroMQ, then
// (without waiting) the new sequence's APPEND_KV and ATTEND through the ring — which is faster than ZeroMQ and would
// otherwise reach the worker first, for a sequence it does not know yet — then its FREE_SEQ over ZeroMQ.
TEST(ShmLane, RingsKeepTheClientsOrder) {
  PollingPair p;
  std::mt19937 rng(12);
  p.c.add_seqs(0, {1});  // a round trip first: the worker polls from here on
  const auto k = fd::test::random_f16(2 * kKV * kD, rng), v = fd::test::random_f16(2 * kKV * kD, rng);
  const std::vector<uint32_t> counts = {2};
  for (uint64_t id = 100; id < 130; ++id) {
    const std::vector<uint64_t> ids = {id};
    std::vector<std::pair<size_t, uint64_t>> sent;
    Header add;
    add.type = uint16_t(MsgType::AddSeq);
    add.n_seq = 1;
    sent.push_back({0, p.c.send(0, add, {{ids.data(), 8}})});
    Header ap = dims(MsgType::AppendKV, 1, 0);
    ap.n_tokens = 2;
    sent.push_back({0, p.c.send(0, ap, {{ids.data(), 8}, {counts.data(), 4}, {k.data(), k.size() * 2}, {v.data(), v.size() * 2}})});
    const Step s(1, rng, id);
    sent.push_back({0, p.c.send(0, dims(MsgType::Attend, 1, 0), s.frames())});
    sent.push_back({0, p.c.send_free_seqs(0, ids)});
    const std::vector<RWorkerReply> r = p.c.wait(sent);  // throws on any ERROR (unknown sequence, ...)
    EXPECT_EQ(r[2].h.msg_type(), MsgType::AttendReply);
  }
  const ShmLaneStats st = p.c.shm_stats(0);
  EXPECT_GT(st.requests_ring, 0u) << "no request went through the ring: the order was not tested";
  EXPECT_EQ(p.c.stats(0)["sequences"], 1);
  std::printf("rings: %llu of 60 requests\n", (unsigned long long)st.requests_ring);
}

// A client that writes its own ring out of the protocol (every request claiming a ZeroMQ message it never sent): the
// worker holds a bounded number of them waiting, then leaves the rest in the ring (which fills), and serves others.
TEST(ShmLane, RingRequestsWaitingAreBounded) {
  PollingPair p;
  p.c.add_seqs(0, {1});  // a round trip: the worker polls from here on, and this client's ring is at its start
  const std::shared_ptr<const shm::Region> r = p.c.shm_region(0);
  ASSERT_TRUE(r);
  shm::RingEnd hostile(const_cast<uint8_t*>(r->base()), shm::Ring::Requests);  // the client's ring, from slot 0
  ASSERT_TRUE(hostile.taker_spinning());
  std::array<uint8_t, kHeaderBytes> head{};
  const Header h = dims(MsgType::Attend, 1);
  std::memcpy(head.data(), &h, kHeaderBytes);
  int put = 0;
  for (int i = 0; i < 200; ++i) {
    const shm::RingEnd::Put said = hostile.put(head, std::vector<uint8_t>(80, 0), uint64_t(1) << 40);
    if (said == shm::RingEnd::Put::Full) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the worker's turn to take what it will
      if (hostile.put(head, std::vector<uint8_t>(80, 0), uint64_t(1) << 40) == shm::RingEnd::Put::Full) break;
    }
    ++put;
  }
  EXPECT_LT(put, 200) << "the worker kept taking requests it must hold";
  RWorkerClient other({p.w.endpoint()}, with_shm(0));
  other.hello(0, kLayers, kH, kKV, kD, WireDType::F16);
  const json st = other.stats(0);
  EXPECT_LE(st["rings"]["waiting_max"].get<uint64_t>(), 4 * shm::kRingSlots) << st.dump();
  EXPECT_GT(st["rings"]["waiting_max"].get<uint64_t>(), 0u) << "the worker took none of them";
  std::printf("put %d; the worker held at most %llu\n", put, (unsigned long long)st["rings"]["waiting_max"].get<uint64_t>());
}
