// The shared-memory lane (fastdecode/wire/shm.h) between RWorkerClient and fd-rworker processes: the same bytes as
// over ZeroMQ, offers refused (and the client's fallback visible), bad descriptors answered with ERROR while the
// worker keeps serving, space reused and given back with the replies, a worker dying mid-request lost as before.
#include <signal.h>

#include <random>

#include "fastdecode/model/weights.h"
#include "fastdecode/spart/spart.h"
#include "fastdecode/sworker/rworker_spawn.h"
#include "fastdecode/sworker/srank.h"
#include "fastdecode/wire/rworker_client.h"
#include "fastdecode/wire/shm.h"
#include "tests/unit/rworker_test_util.h"
#include "tests/unit/test_helpers.h"
#include "tests/integration/shm_lane_util.h"

using namespace fd;
using namespace fd::proto;
using namespace shm_lane_test;


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
