// The shared-memory lane (fastdecode/wire/shm.h) between RWorkerClient and fd-rworker processes: the same bytes as
// over ZeroMQ, offers refused (and the client's fallback visible), bad descriptors answered with ERROR while the
// worker keeps serving, space reused and given back with the replies, a worker dying mid-request lost as before.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "fastdecode/model/weights.h"
#include "fastdecode/spart/spart.h"
#include "fastdecode/sworker/rworker_spawn.h"
#include "fastdecode/sworker/srank.h"
#include "fastdecode/wire/rworker_client.h"
#include "fastdecode/wire/shm.h"
#include "tests/unit/rworker_test_util.h"
#include "tests/unit/test_helpers.h"

using namespace fd;
using namespace fd::proto;

namespace {

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

Header dims(MsgType t, uint32_t n_seq, uint32_t layer = 0) {
  Header h = make_header(t, kH, kKV, kD, WireDType::F16);
  h.n_seq = n_seq;
  h.layer = layer;
  return h;
}

RWorkerClientOptions with_shm(size_t bytes) {
  RWorkerClientOptions o;
  o.timeout_ms = 20000;
  o.shm_bytes = bytes;
  return o;
}

std::vector<uint8_t> bytes_of(const zmq::message_t& m) {
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

}  // namespace

// Two sessions on one worker, fed the same steps, one through the region and one over ZeroMQ: byte-identical
// replies (the prompt's APPEND_KV through the region too).
TEST(ShmLane, RoundTripsAreByteIdenticalToZeroMQ) {
  Worker a("w0");
  RWorkerClient viashm({a.endpoint()}, with_shm(size_t(8) << 20)), viazmq({a.endpoint()}, with_shm(0));
  for (RWorkerClient* c : {&viashm, &viazmq}) {
    c->hello(0, kLayers, kH, kKV, kD, WireDType::F16);
    c->add_seqs(0, {1, 2, 3});
  }
  EXPECT_EQ(viashm.shm_stats(0).state, "active") << viashm.shm_stats(0).reason;
  EXPECT_EQ(viazmq.shm_stats(0).state, "off");
  std::mt19937 rng(5);
  // A prompt: 5, 0 and 7 tokens.
  const std::vector<uint64_t> ids = {1, 2, 3};
  const std::vector<uint32_t> counts = {5, 0, 7};
  const auto pk = fd::test::random_f16(12 * kKV * kD, rng), pv = fd::test::random_f16(12 * kKV * kD, rng);
  Header ap = dims(MsgType::AppendKV, 3, 1);
  ap.n_tokens = 12;
  for (RWorkerClient* c : {&viashm, &viazmq})
    c->call(0, ap, {{ids.data(), 24}, {counts.data(), 12}, {pk.data(), pk.size() * 2}, {pv.data(), pv.size() * 2}});
  for (int step = 0; step < 20; ++step) {
    const Step s(3, rng);
    const uint32_t layer = uint32_t(step % kLayers);
    const RWorkerReply r1 = viashm.call(0, dims(MsgType::Attend, 3, layer), s.frames());
    const RWorkerReply r2 = viazmq.call(0, dims(MsgType::Attend, 3, layer), s.frames());
    ASSERT_EQ(r1.h.msg_type(), MsgType::AttendReply);
    EXPECT_EQ(r1.h.flags, 0) << "the client hands on the reply as ZeroMQ would have brought it";
    ASSERT_EQ(r1.frames.size(), 1u);
    ASSERT_EQ(r1.frames[0].size(), size_t(3 * kH * kD * 2));
    ASSERT_EQ(bytes_of(r1.frames[0]), bytes_of(r2.frames[0])) << "step " << step;
  }
  const ShmLaneStats st = viashm.shm_stats(0);
  EXPECT_EQ(st.requests_shm, 21u);  // the APPEND_KV and 20 ATTENDs; HELLO, ADD_SEQ go over ZeroMQ
  EXPECT_EQ(st.replies_shm, 20u);   // APPEND_KV's OK has no frames: over ZeroMQ
  EXPECT_EQ(st.requests_zmq, 0u);
  EXPECT_EQ(st.free_bytes, st.bytes - shm::kRegionHeaderBytes) << "every request's and reply's space given back";
  EXPECT_EQ(viashm.stats(0)["tokens"], 2 * (12 + 20 * 3));  // both sessions
  // CLOSE ends the session and the worker's mapping: a new session on this connection runs over ZeroMQ.
  viashm.close_session(0);
  EXPECT_EQ(viashm.shm_stats(0).state, "closed");
  viashm.hello(0, kLayers, kH, kKV, kD, WireDType::F16);
  viashm.add_seqs(0, {1, 2, 3});
  const Step s(3, rng);
  EXPECT_EQ(viashm.call(0, dims(MsgType::Attend, 3), s.frames()).frames.at(0).size(), size_t(3 * kH * kD * 2));
  EXPECT_EQ(viashm.shm_stats(0).requests_shm, 21u);
}

// A request written into a block of the region (RWorkerClient::shm_alloc, as the S-rank has the S-Part write q/k/v)
// goes as it lies: no byte copied in, the same reply as the same bytes sent from the caller's memory; the block is
// given back when destroyed; no block while the lane is not active, or larger than the free space.
TEST(ShmLane, RequestInABlockOfTheRegionGoesAsItLies) {
  Worker a("w0");
  const size_t region = size_t(1) << 20;
  RWorkerClient c({a.endpoint()}, with_shm(region));
  EXPECT_FALSE(c.shm_alloc(0, 64)) << "the lane is pending until the first reply";
  c.hello(0, kLayers, kH, kKV, kD, WireDType::F16);
  c.add_seqs(0, {1, 2, 3});
  ASSERT_EQ(c.shm_stats(0).state, "active");
  EXPECT_FALSE(c.shm_alloc(0, region)) << "larger than the data area";
  std::mt19937 rng(9);
  const Step s(3, rng);
  const std::vector<ConstBuffer> from = s.frames();
  size_t total = 0;
  for (const ConstBuffer& b : from) total += b.size;
  const uint64_t free0 = c.shm_stats(0).free_bytes;
  {
    ShmBlock blk = c.shm_alloc(0, total);
    ASSERT_TRUE(blk);
    EXPECT_EQ(blk.size(), total);
    EXPECT_LT(c.shm_stats(0).free_bytes, free0);
    std::vector<ConstBuffer> in;
    size_t at = 0;
    for (const ConstBuffer& b : from) {
      std::memcpy(blk.data() + at, b.data, b.size);
      in.push_back({blk.data() + at, b.size});
      at += b.size;
    }
    const RWorkerReply r1 = c.call(0, dims(MsgType::Attend, 3), in);
    ShmLaneStats st = c.shm_stats(0);
    EXPECT_EQ(st.bytes_copied, 0u);
    EXPECT_EQ(st.bytes_in_place, total);
    const std::vector<uint8_t> o1 = bytes_of(r1.frames.at(0));
    const RWorkerReply r2 = c.call(0, dims(MsgType::Attend, 3), from);  // the same bytes from the caller's memory
    st = c.shm_stats(0);
    EXPECT_EQ(st.bytes_copied, total);
    EXPECT_EQ(st.bytes_in_place, total);
    EXPECT_EQ(o1, bytes_of(r2.frames.at(0)));
    ShmBlock moved = std::move(blk);  // the block moves; given back once
    EXPECT_FALSE(blk);
    EXPECT_EQ(moved.data(), in[0].data);
  }
  EXPECT_EQ(c.shm_stats(0).free_bytes, free0) << "the block given back with its holder";
  c.mark_dead(0, "test");
  EXPECT_FALSE(c.shm_alloc(0, 64)) << "no block once the lane is closed";
}

// The worker refuses: shared memory turned off, a region over its limit. The client says why and serves the
// worker over ZeroMQ.
TEST(ShmLane, RefusedOfferFallsBackToZeroMQVisibly) {
  Worker off("off", {"--shm-max-mb", "0"}), small("small", {"--shm-max-mb", "1"});
  RWorkerClient c({off.endpoint(), small.endpoint()}, with_shm(size_t(4) << 20));
  std::mt19937 rng(6);
  for (size_t w = 0; w < 2; ++w) {
    c.hello(w, kLayers, kH, kKV, kD, WireDType::F16);
    c.add_seqs(w, {1});
    const Step s(1, rng);
    const RWorkerReply r = c.call(w, dims(MsgType::Attend, 1), s.frames());
    EXPECT_EQ(r.frames.at(0).size(), size_t(kH * kD * 2));
    const ShmLaneStats st = c.shm_stats(w);
    EXPECT_EQ(st.state, "refused");
    EXPECT_EQ(st.requests_shm, 0u);
  }
  EXPECT_THAT(c.shm_stats(0).reason, ::testing::HasSubstr("unsupported: shared memory refused: this worker takes no shared memory"));
  EXPECT_THAT(c.shm_stats(1).reason, ::testing::HasSubstr("too-large: shared memory refused: region of 4194304 bytes is over"));
}

// What a peer that is not the region's maker can offer: a wrong token, a name that is not ours, a name it cannot
// open (as a worker on another host finds the client's name), too large a region. Each is refused with what was
// wrong, nothing is mapped, and the worker keeps serving.
TEST(ShmLane, WorkerRefusesOffersItCannotTrust) {
  Worker a("w0", {"--shm-max-mb", "2"});
  RawPeer p(a.endpoint());
  const auto region = shm::Region::create(size_t(1) << 20);
  Header h;
  h.type = uint16_t(MsgType::ShmAttach);
  const auto offer = [&](shm::Attach at) {
    auto [rh, f] = p.call(h, {shm::encode_attach(at)}, 1);
    return p.error_of(rh, f);
  };
  shm::Attach good{region->name(), region->size(), region->token()};
  shm::Attach bad = good;
  bad.token[3] ^= 1;
  EXPECT_THAT(offer(bad), ::testing::HasSubstr("forbidden: shared memory refused: " + region->name() + ": the token in the region is not the one offered"));
  bad = good;
  bad.name = "/not-ours-" + region->name().substr(8);
  EXPECT_THAT(offer(bad), ::testing::HasSubstr("forbidden: shared memory refused: name '" + bad.name + "' does not start with /fd-shm-"));
  bad = good;
  bad.name = "/fd-shm-0-0123456789abcdef";  // no such object on this host
  EXPECT_THAT(offer(bad), ::testing::HasSubstr("forbidden: shared memory refused: cannot open /fd-shm-0-0123456789abcdef"));
  bad = good;
  bad.size = size_t(4) << 20;
  EXPECT_THAT(offer(bad), ::testing::HasSubstr("too-large: shared memory refused: region of 4194304 bytes is over"));
  bad = good;
  bad.size = good.size - 4096;  // not the object's size
  EXPECT_THAT(offer(bad), ::testing::HasSubstr("forbidden: shared memory refused: " + region->name() + " is 1048576 bytes"));
  h.version = 2;  // SHM_ATTACH came with version 3 (docs/RWORKER.md): a version 2 offer is malformed, nothing mapped
  EXPECT_THAT(offer(good), ::testing::HasSubstr("malformed: SHM_ATTACH is a protocol version 3 message; this one says version 2"));
  h.version = kVersion;
  EXPECT_EQ(offer(good), "no error: OK");
  RWorkerClient c({a.endpoint()}, 20000);  // still serving
  // This STATS and the version 2 offer (refused by the handler's decode); the loop answered every other offer itself.
  EXPECT_EQ(c.stats(0)["requests"].get<int>(), 2);
}

// Requests in the region whose descriptor is bad: an ERROR (malformed) each, nothing changed, the worker serving on.
TEST(ShmLane, BadDescriptorsGetErrorAndWorkerKeepsServing) {
  Worker a("w0");
  RawPeer p(a.endpoint());
  const auto region = shm::Region::create(size_t(1) << 20);
  Header h;
  h.type = uint16_t(MsgType::ShmAttach);
  {
    auto [rh, f] = p.call(h, {shm::encode_attach({region->name(), region->size(), region->token()})}, 1);
    ASSERT_EQ(rh.msg_type(), MsgType::Ok) << p.error_of(rh, f);
  }
  Header hello = dims(MsgType::Hello, 0);
  hello.layer = kLayers;
  ASSERT_EQ(p.call(hello, {}, 0).first.msg_type(), MsgType::HelloReply);
  const std::vector<uint64_t> ids = {7};
  ASSERT_EQ(p.call(dims(MsgType::AddSeq, 1), {fd::test::bytes_of(ids)}, 1).first.msg_type(), MsgType::Ok);
  // A valid ATTEND of one sequence lies at 4096: ids 8, q 1024, k 512, v 512 bytes; its reply space at 8192.
  const uint64_t R = region->size(), o_bytes = kH * kD * 2;
  std::memcpy(region->base() + 4096, ids.data(), 8);
  std::memset(region->base() + 4160, 0x3c, 2048);
  const std::vector<shm::Span> good = {{4096, 8}, {4160, 1024}, {5184, 512}, {5696, 512}};
  Header at = dims(MsgType::Attend, 1);
  at.flags = kFlagShm;
  const auto send = [&](std::vector<shm::Span> frames, shm::Span reply, Header hh) {
    return p.call(hh, {shm::encode_descriptor({std::move(frames), reply})}, 4);
  };
  const auto error_with = [&](std::vector<shm::Span> frames, shm::Span reply) {
    auto [rh, f] = send(std::move(frames), reply, at);
    return p.error_of(rh, f);
  };
  auto frames = good;
  frames[1].offset = R;  // past the end
  EXPECT_THAT(error_with(frames, {8192, o_bytes}), ::testing::HasSubstr("malformed: shared-memory descriptor: frame 1 at offset"));
  frames = good;
  frames[2] = {4096, ~uint64_t(0) - 100};  // offset + size overflows
  EXPECT_THAT(error_with(frames, {8192, o_bytes}), ::testing::HasSubstr("malformed: shared-memory descriptor: frame 2 at offset 4096"));
  frames = good;
  frames[0].offset = 0;  // the token's page
  EXPECT_THAT(error_with(frames, {8192, o_bytes}), ::testing::HasSubstr("is not inside the data area"));
  EXPECT_THAT(error_with(good, {R - 100, o_bytes}), ::testing::HasSubstr("malformed: shared-memory descriptor: reply space"));
  EXPECT_THAT(error_with(good, {8192, o_bytes - 1}), ::testing::HasSubstr("malformed: shared-memory reply space of 1023 bytes"));
  frames = good;
  frames[1].size = 1000;  // the sizes are decode()'s to check, as over ZeroMQ
  EXPECT_THAT(error_with(frames, {8192, o_bytes}), ::testing::HasSubstr("malformed: ATTEND frame 1 is 1000 bytes"));
  {
    auto [rh, f] = p.call(at, {shm::encode_descriptor({good, {8192, o_bytes}}), {1, 2}}, 4);  // a frame too many
    EXPECT_THAT(p.error_of(rh, f), ::testing::HasSubstr("malformed: a message in shared memory has one descriptor frame"));
  }
  {
    Header st = dims(MsgType::Stats, 0);
    st.flags = kFlagShm;
    auto [rh, f] = p.call(st, {shm::encode_descriptor({{}, {8192, 0}})}, 0);
    EXPECT_THAT(p.error_of(rh, f), ::testing::HasSubstr("malformed: STATS cannot come through shared memory"));
  }
  // Nothing was appended by any of them; the good one is answered in the region.
  auto [rh, f] = send(good, {8192, o_bytes}, at);
  ASSERT_EQ(rh.msg_type(), MsgType::AttendReply) << p.error_of(rh, f);
  EXPECT_EQ(rh.flags, kFlagShm);
  const shm::Descriptor d = shm::parse_descriptor({static_cast<const uint8_t*>(f.at(0).data()), f.at(0).size()}, 1, R);
  EXPECT_EQ(d.frames.at(0).offset, 8192u);
  EXPECT_EQ(d.frames.at(0).size, o_bytes);
  auto [sh, sf] = p.call(dims(MsgType::Stats, 0), {}, 0);
  EXPECT_EQ(json::parse(sf.at(0).to_string())["tokens"], 1);
  // Another peer without a region: its flagged message is refused by decode().
  RawPeer q(a.endpoint());
  auto [qh, qf] = q.call(at, {shm::encode_descriptor({good, {8192, o_bytes}})}, 4);
  EXPECT_THAT(q.error_of(qh, qf), ::testing::HasSubstr("malformed: ATTEND flagged as in shared memory, but no shared-memory region"));
}

// A region with room for a few requests carries many more, one after another; replies held keep their space until
// destroyed (a request that finds no room goes over ZeroMQ meanwhile), even past the client's end.
TEST(ShmLane, SpaceIsReusedAndGivenBackWithTheReplies) {
  Worker a("w0");
  const size_t bytes = 64 * 1024;  // 60 KiB of data area: an ATTEND of 4 sequences takes 8 KiB + 4 KiB of reply
  auto c = std::make_unique<RWorkerClient>(std::vector<std::string>{a.endpoint()}, with_shm(bytes));
  c->hello(0, kLayers, kH, kKV, kD, WireDType::F16);
  c->add_seqs(0, {1, 2, 3, 4});
  const uint64_t all = bytes - shm::kRegionHeaderBytes;
  std::mt19937 rng(7);
  for (int i = 0; i < 200; ++i) {
    const Step s(4, rng);
    c->call(0, dims(MsgType::Attend, 4, uint32_t(i % kLayers)), s.frames());
  }
  EXPECT_EQ(c->shm_stats(0).requests_shm, 200u);
  EXPECT_EQ(c->shm_stats(0).requests_zmq, 0u);
  EXPECT_EQ(c->shm_stats(0).free_bytes, all);
  // Held replies: each keeps its 4 KiB until it is destroyed.
  std::vector<RWorkerReply> held;
  std::vector<uint8_t> first;
  for (int i = 0; i < 16; ++i) {
    const Step s(4, rng);
    held.push_back(c->call(0, dims(MsgType::Attend, 4), s.frames()));
    if (i == 0) first = bytes_of(held[0].frames[0]);
  }
  EXPECT_EQ(bytes_of(held[0].frames[0]), first) << "a held reply's bytes were overwritten by later requests";
  const ShmLaneStats st = c->shm_stats(0);
  EXPECT_GE(st.requests_shm, 200u + 5);
  EXPECT_GT(st.requests_zmq, 0u) << "the region cannot hold 16 replies and a request";
  EXPECT_LT(st.free_bytes, all);
  held.resize(1);
  EXPECT_EQ(c->shm_stats(0).free_bytes, all - 4096) << "one reply held";
  c.reset();  // the client ends; the reply it handed out stays readable
  EXPECT_EQ(bytes_of(held[0].frames[0]), first);
  held.clear();
}

// A worker killed while it holds a request that came through the region: RWorkerLost, as over ZeroMQ.
TEST(ShmLane, WorkerDyingMidRequestIsLost) {
  Worker a("w0");
  RWorkerClient c({a.endpoint()}, with_shm(size_t(1) << 20));
  c.hello(0, kLayers, kH, kKV, kD, WireDType::F16);
  c.add_seqs(0, {1});
  ASSERT_EQ(c.shm_stats(0).state, "active");
  kill(a.pid(), SIGSTOP);
  std::mt19937 rng(8);
  const Step s(1, rng);
  const uint64_t id = c.send(0, dims(MsgType::Attend, 1), s.frames());
  EXPECT_EQ(c.shm_stats(0).requests_shm, 1u);
  kill(a.pid(), SIGKILL);
  try {
    c.wait({{0, id}}, 10000);
    ADD_FAILURE() << "no RWorkerLost";
  } catch (const RWorkerLost& e) {
    EXPECT_EQ(e.workers(), std::vector<size_t>{0});
    EXPECT_THAT(e.what(), ::testing::HasSubstr("is lost"));
  }
  c.mark_dead(0, "killed");
  EXPECT_EQ(c.shm_stats(0).state, "closed");
}

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

// The S-Part the S-rank registers the workers' regions with: the CPU one, with register_host / unregister_host
// recorded (and answered as `accept` says: a device that takes the memory, or one that refuses it).
class RecordingSPart : public SPart {
 public:
  struct Log {
    std::vector<std::pair<void*, size_t>> registered;
    std::vector<void*> unregistered;
    std::vector<size_t> host_allocs;  // alloc_host sizes, in order
  };
  RecordingSPart(std::unique_ptr<SPart> inner, Log* log, bool accept) : in_(std::move(inner)), log_(log), accept_(accept) {}
  const ModelConfig& config() const override { return in_->config(); }
  std::string describe() const override { return in_->describe(); }
  HostBuffer alloc_host(size_t bytes) override {
    log_->host_allocs.push_back(bytes);
    return in_->alloc_host(bytes);
  }
  void embed(int s, const int32_t* t, const int64_t* p, int64_t T) override { in_->embed(s, t, p, T); }
  using SPart::attention_input;
  void attention_input(int s, int l, DType dt, const std::vector<HostRowsOut>& parts) override { in_->attention_input(s, l, dt, parts); }
  void set_attention(int s, DType dt, const std::vector<HostRows>& parts) override { in_->set_attention(s, dt, parts); }
  void prefill_attention(int s, const std::vector<int64_t>& starts) override { in_->prefill_attention(s, starts); }
  void attention_output_and_mlp(int s, int l) override { in_->attention_output_and_mlp(s, l); }
  void logits(int s, const std::vector<int32_t>& rows, float* out) override { in_->logits(s, rows, out); }
  bool register_host(void* p, size_t bytes) override {
    log_->registered.push_back({p, bytes});
    return accept_;
  }
  void unregister_host(void* p) override { log_->unregistered.push_back(p); }

 private:
  std::unique_ptr<SPart> in_;
  Log* log_;
  bool accept_;
};

// The S-rank registers each worker's region with its S-Part's device right after the HELLOs (ATTEND's replies land
// there: copied up by DMA on the CUDA S-Part), unregisters a region at the first step after its lane ended, and what
// is left when it goes; a region the device refused is neither tried again nor unregistered.
TEST(ShmLane, SRankRegistersTheRegionsWithItsDevice) {
  const ModelConfig c = load_model_config(fd::test::repo_path("experiments/models/tiny-llama.json"));
  auto src = make_random_source(3, DType::F16);
  const ModelWeights w = load_model_weights(c, *src);
  Worker a("w0"), b("w1");
  for (const bool accept : {true, false}) {
    RecordingSPart::Log log;
    std::vector<void*> base;  // the regions' addresses
    {
      auto client = std::make_unique<RWorkerClient>(std::vector<std::string>{a.endpoint(), b.endpoint()}, with_shm(size_t(1) << 20));
      SRank rank(std::make_unique<RecordingSPart>(make_cpu_spart(w), &log, accept), std::move(client), nullptr, {});
      ASSERT_EQ(log.registered.size(), 2u) << "both regions registered with the HELLOs";
      for (size_t i = 0; i < 2; ++i) {
        const auto r = rank.client().shm_region(i);
        ASSERT_TRUE(r) << "worker " << i << "'s lane: " << rank.client().shm_stats(i).state;
        EXPECT_EQ(log.registered[i], std::make_pair(static_cast<void*>(r->base()), r->size()));
        EXPECT_EQ(rank.region_pinned(i), accept);
        base.push_back(r->base());
      }
      rank.client().mark_dead(1, "test: its lane ends");
      rank.run(StepPlan{});
      EXPECT_EQ(log.registered.size(), 2u) << "nothing new to register, a refused region not tried again";
      EXPECT_EQ(log.unregistered, accept ? std::vector<void*>{base[1]} : std::vector<void*>{});
      EXPECT_FALSE(rank.region_pinned(1));
      EXPECT_EQ(rank.region_pinned(0), accept);
      log.unregistered.clear();
      rank.run(StepPlan{});
      EXPECT_TRUE(log.unregistered.empty()) << "unregistered once";
      base.resize(1);  // worker 0's region, still registered when the rank goes
    }
    EXPECT_EQ(log.unregistered, accept ? base : std::vector<void*>{}) << "worker 0's region, left when the rank went";
  }
}

// The prefill's host K/V buffers (pinned on a CUDA S-Part: ~0.5 s a GB) are made with the rank when it is told the
// prefill budget, not in the first prefill's time to first token, each at most kPrefillReserveBytes; without a budget,
// at first use.
TEST(ShmLane, SRankMakesThePrefillBuffersUpFront) {
  const ModelConfig c = load_model_config(fd::test::repo_path("experiments/models/tiny-llama.json"));
  auto src = make_random_source(3, DType::F16);
  const ModelWeights w = load_model_weights(c, *src);
  Worker a("w0");
  for (const int64_t tokens : {int64_t(0), int64_t(100), int64_t(1) << 24}) {
    RecordingSPart::Log log;
    auto client = std::make_unique<RWorkerClient>(std::vector<std::string>{a.endpoint()}, with_shm(0));
    SRankOptions o;
    o.prefill_reserve_tokens = tokens;
    SRank rank(std::make_unique<RecordingSPart>(make_cpu_spart(w), &log, false), std::move(client), nullptr, o);
    const size_t kv_row = size_t(c.kv_dim()) * 4;  // the wire dtype of SRankOptions: fp32
    // At most kPrefillReserveBytes each (untouched here: malloc'd, never written).
    const size_t each = std::min(kPrefillReserveBytes, size_t(tokens) * kv_row);
    EXPECT_EQ(log.host_allocs, tokens ? std::vector<size_t>(4, each) : std::vector<size_t>{}) << tokens << " tokens";
    rank.client().close_session(0);
  }
}
