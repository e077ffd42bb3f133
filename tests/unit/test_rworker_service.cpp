#include "fastdecode/rworker/service.h"

#include <atomic>
#include <thread>

#include "fastdecode/rworker/server.h"

#include <map>
#include <random>

#include "rworker_test_util.h"
#include "test_helpers.h"
#include "tests/fuzz/rworker_fuzz.h"

// Failures print codes and message types by name (found by ADL: same namespace as the enums).
namespace fd::proto {
static void PrintTo(ErrorCode c, std::ostream* os) { *os << error_code_name(c); }
static void PrintTo(MsgType t, std::ostream* os) { *os << msg_type_name(t); }
}  // namespace fd::proto

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

struct Harness {
  RWorkerService svc;
  std::mt19937 rng{5};
  std::string peer;  // the client its messages come from
  // mem: what the test's one client session may hold; the session's own record costs kSessionBytes on top.
  explicit Harness(KVDType t = KVDType::F16, size_t mem = size_t(1) << 28)
      : svc(RWorkerConfig{t, mem + kSessionBytes, 2, best_isa(), Limits{}, "test"}) {}

  std::vector<zmq::message_t> send(const RawMessage& m) {
    const auto f = m.frames();
    return svc.handle(peer, f.data(), f.size());
  }
  MsgType send_type(const RawMessage& m) { return reply_header(send(m)).msg_type(); }
  ErrorCode send_error(const RawMessage& m) {
    const auto r = send(m);
    const Header h = reply_header(r);
    return h.msg_type() == MsgType::Error ? ErrorCode(h.status) : ErrorCode::None;
  }
  void hello() {
    Header h = dims(MsgType::Hello);
    h.layer = kLayers;
    ASSERT_EQ(send_type(make_message(h, {})), MsgType::HelloReply);
  }
  RawMessage ids_msg(MsgType t, const std::vector<uint64_t>& ids) { return make_message(dims(t, uint32_t(ids.size())), {bytes_of(ids)}); }
};

// Sequence ids with prompts of different lengths; K/V kept in fp32 (the fp16 values) for the reference.
struct SeqData {
  uint64_t id;
  std::vector<float> k, v;  // [tokens][kKV][kD], per layer 0 only
  int n = 0;
};

// The client's record of what a worker holds: per (sequence, layer), the K/V appended (as fp32 values of
// the fp16 sent), to compute the reference attention from.
using Cache = std::map<std::pair<uint64_t, uint32_t>, SeqData>;

void record(SeqData& s, const std::vector<uint16_t>& k, const std::vector<uint16_t>& v, size_t first_row, size_t rows) {
  for (size_t j = first_row * kKV * kD; j < (first_row + rows) * kKV * kD; ++j) {
    s.k.push_back(fp16_to_fp32(k[j]));
    s.v.push_back(fp16_to_fp32(v[j]));
  }
  s.n += int(rows);
}

// APPEND_KV of counts[i] fresh random tokens to ids[i] at `layer`; recorded in `cache` when it is Ok.
ErrorCode append_kv(Harness& w, Cache& cache, const std::vector<uint64_t>& ids, const std::vector<uint32_t>& counts,
                    uint32_t layer) {
  uint32_t total = 0;
  for (uint32_t c : counts) total += c;
  const auto k = fd::test::random_f16(size_t(total) * kKV * kD, w.rng), v = fd::test::random_f16(size_t(total) * kKV * kD, w.rng);
  Header a = dims(MsgType::AppendKV, uint32_t(ids.size()));
  a.layer = layer;
  a.n_tokens = total;
  const ErrorCode e = w.send_error(make_message(a, {bytes_of(ids), bytes_of(counts), bytes_of(k), bytes_of(v)}));
  if (e == ErrorCode::None) {
    size_t row = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      record(cache[{ids[i], layer}], k, v, row, counts[i]);
      row += counts[i];
    }
  }
  return e;
}

// ATTEND at `layer` for `ids` with fresh random q, k, v. On an AttendReply the new token is recorded
// and, with `check`, every output element is compared with the double reference over the recorded
// cache: a token the worker holds and the record lacks (or the other way round) shows there.
ErrorCode attend(Harness& w, Cache& cache, const std::vector<uint64_t>& ids, uint32_t layer, bool check = true) {
  const size_t ns = ids.size();
  const auto q = fd::test::random_f16(ns * kH * kD, w.rng), k = fd::test::random_f16(ns * kKV * kD, w.rng),
             v = fd::test::random_f16(ns * kKV * kD, w.rng);
  Header h = dims(MsgType::Attend, uint32_t(ns));
  h.layer = layer;
  const auto r = w.send(make_message(h, {bytes_of(ids), bytes_of(q), bytes_of(k), bytes_of(v)}));
  const Header rh = reply_header(r);
  if (rh.msg_type() == MsgType::Error) return ErrorCode(rh.status);
  EXPECT_EQ(rh.msg_type(), MsgType::AttendReply);
  EXPECT_EQ(r.size(), 2u);
  if (r.size() != 2 || r[1].size() != ns * kH * kD * 2) {
    ADD_FAILURE() << "bad ATTEND reply";
    return ErrorCode::Internal;
  }
  std::vector<uint16_t> o(ns * kH * kD);
  std::memcpy(o.data(), r[1].data(), r[1].size());
  for (size_t i = 0; i < ns; ++i) {
    SeqData& s = cache[{ids[i], layer}];
    record(s, k, v, i, 1);
    if (!check) continue;
    std::vector<float> qi(kH * kD);
    for (int j = 0; j < kH * kD; ++j) qi[j] = fp16_to_fp32(q[i * kH * kD + j]);
    const auto ref = fd::test::reference_attention(qi, s.k, s.v, s.n, kH, kKV, kD);
    int bad = 0;
    for (int j = 0; j < kH * kD; ++j) bad += std::fabs(fp16_to_fp32(o[i * kH * kD + j]) - ref[j]) > 2e-3 + 2e-3 * std::fabs(ref[j]);
    EXPECT_EQ(bad, 0) << "sequence " << ids[i] << " (" << s.n << " tokens): outputs off the reference";
  }
  return ErrorCode::None;
}

// What the worker reports about its cache, to compare before and after a refused request.
struct Usage {
  int64_t sequences, tokens, bytes;
  bool operator==(const Usage& o) const { return sequences == o.sequences && tokens == o.tokens && bytes == o.bytes; }
};
std::ostream& operator<<(std::ostream& os, const Usage& u) {
  return os << u.sequences << " sequences, " << u.tokens << " tokens, " << u.bytes << " bytes";
}
Usage usage(const RWorkerService& svc) {
  const json s = svc.stats();
  return {s["sequences"].get<int64_t>(), s["tokens"].get<int64_t>(), s["kv_bytes"].get<int64_t>()};
}

}  // namespace

TEST(RWorkerService, AttendMatchesDoubleReference) {
  Harness w;
  w.hello();
  std::vector<SeqData> seqs = {{11, {}, {}, 0}, {12, {}, {}, 0}, {13, {}, {}, 0}};
  ASSERT_EQ(w.send_type(w.ids_msg(MsgType::AddSeq, {11, 12, 13})), MsgType::Ok);
  // Prompt K/V for layer 0: 5, 40 and 0 tokens.
  const std::vector<uint32_t> counts = {5, 40, 0};
  const uint32_t total = 45;
  const auto k16 = fd::test::random_f16(size_t(total) * kKV * kD, w.rng), v16 = fd::test::random_f16(size_t(total) * kKV * kD, w.rng);
  Header a = dims(MsgType::AppendKV, 3);
  a.n_tokens = total;
  ASSERT_EQ(w.send_type(make_message(a, {bytes_of(std::vector<uint64_t>{11, 12, 13}), bytes_of(counts), bytes_of(k16), bytes_of(v16)})),
            MsgType::Ok);
  size_t off = 0;
  for (size_t i = 0; i < 3; ++i) {
    for (size_t j = 0; j < counts[i] * size_t(kKV * kD); ++j) {
      seqs[i].k.push_back(fp16_to_fp32(k16[off + j]));
      seqs[i].v.push_back(fp16_to_fp32(v16[off + j]));
    }
    off += counts[i] * size_t(kKV * kD);
    seqs[i].n = int(counts[i]);
  }
  // Several decode steps: ATTEND appends one token per sequence and attends over everything.
  for (int step = 0; step < 40; ++step) {
    const auto q = fd::test::random_f16(3 * kH * kD, w.rng), k = fd::test::random_f16(3 * kKV * kD, w.rng),
               v = fd::test::random_f16(3 * kKV * kD, w.rng);
    Header h = dims(MsgType::Attend, 3);
    h.request_id = 1000 + step;
    const auto r = w.send(make_message(h, {bytes_of(std::vector<uint64_t>{11, 12, 13}), bytes_of(q), bytes_of(k), bytes_of(v)}));
    const Header rh = reply_header(r);
    ASSERT_EQ(rh.msg_type(), MsgType::AttendReply);
    EXPECT_EQ(rh.request_id, uint64_t(1000 + step));
    EXPECT_GT(rh.compute_ns, 0u);
    ASSERT_EQ(r.size(), 2u);
    std::vector<uint16_t> o(3 * kH * kD);
    ASSERT_EQ(r[1].size(), o.size() * 2);
    std::memcpy(o.data(), r[1].data(), r[1].size());
    for (size_t i = 0; i < 3; ++i) {
      for (int j = 0; j < kKV * kD; ++j) {
        seqs[i].k.push_back(fp16_to_fp32(k[i * kKV * kD + j]));
        seqs[i].v.push_back(fp16_to_fp32(v[i * kKV * kD + j]));
      }
      ++seqs[i].n;
      std::vector<float> qi(kH * kD);
      for (int j = 0; j < kH * kD; ++j) qi[j] = fp16_to_fp32(q[i * kH * kD + j]);
      const auto ref = fd::test::reference_attention(qi, seqs[i].k, seqs[i].v, seqs[i].n, kH, kKV, kD);
      for (int j = 0; j < kH * kD; ++j)
        ASSERT_NEAR(fp16_to_fp32(o[i * kH * kD + j]), ref[j], 2e-3 + 2e-3 * std::fabs(ref[j]))
            << "step " << step << " seq " << i << " index " << j;
    }
  }
  const json s = w.svc.stats();
  EXPECT_EQ(s["tokens"], 45 + 3 * 40);
  EXPECT_EQ(s["sequences"], 3);
  // Where the ATTENDs' time went (issue 43): the parts add up to the compute time the replies carried.
  const json& parts = s["attend_parts_s"];
  double sum = 0;
  for (const char* k : {"prepare", "append", "query", "kernel", "output"}) {
    ASSERT_TRUE(parts.contains(k)) << k;
    EXPECT_GE(parts[k].get<double>(), 0.0) << k;
    sum += parts[k].get<double>();
  }
  EXPECT_GT(parts["kernel"].get<double>(), 0.0);
  EXPECT_NEAR(sum, s["attend_compute_s"].get<double>(), 1e-9 * s["attend_requests"].get<double>());
  ASSERT_EQ(w.send_type(w.ids_msg(MsgType::FreeSeq, {12})), MsgType::Ok);
  EXPECT_EQ(w.svc.stats()["tokens"], 5 + 40 + 40);
}

TEST(RWorkerService, ErrorsLeaveStateUnchanged) {
  // 3 blocks of KV, and the bookkeeping of the 2 sequences added below (counted against the limit too).
  Harness w(KVDType::F16, kv_fp16_block_bytes(kKV, kD) * 3 + 2 * KVStore::sequence_bytes(kLayers));
  EXPECT_EQ(w.send_error(w.ids_msg(MsgType::AddSeq, {1})), ErrorCode::NotConfigured);
  w.hello();
  ASSERT_EQ(w.send_type(w.ids_msg(MsgType::AddSeq, {1, 2})), MsgType::Ok);
  EXPECT_EQ(w.send_error(w.ids_msg(MsgType::AddSeq, {2})), ErrorCode::DuplicateSequence);
  EXPECT_EQ(w.send_error(w.ids_msg(MsgType::AddSeq, {5, 5})), ErrorCode::DuplicateSequence);
  EXPECT_EQ(w.send_error(w.ids_msg(MsgType::FreeSeq, {1, 9})), ErrorCode::UnknownSequence);
  EXPECT_EQ(w.svc.stats()["sequences"], 2);  // seq 1 not freed by the failed request
  const auto q = fd::test::random_f16(2 * kH * kD, w.rng), kv = fd::test::random_f16(2 * kKV * kD, w.rng);
  Header h = dims(MsgType::Attend, 2);
  EXPECT_EQ(w.send_error(make_message(h, {bytes_of(std::vector<uint64_t>{1, 3}), bytes_of(q), bytes_of(kv), bytes_of(kv)})),
            ErrorCode::UnknownSequence);
  h.layer = kLayers;
  EXPECT_EQ(w.send_error(make_message(h, {bytes_of(std::vector<uint64_t>{1, 2}), bytes_of(q), bytes_of(kv), bytes_of(kv)})),
            ErrorCode::BadLayer);
  Header other = dims(MsgType::Attend, 2);
  other.n_heads = 4;  // shape differs from the HELLO (frames sized to match the header)
  const auto q4 = fd::test::random_f16(2 * 4 * kD, w.rng);
  EXPECT_EQ(w.send_error(make_message(other, {bytes_of(std::vector<uint64_t>{1, 2}), bytes_of(q4), bytes_of(kv), bytes_of(kv)})),
            ErrorCode::ShapeMismatch);
  EXPECT_EQ(w.svc.stats()["tokens"], 0);  // nothing appended by any failed ATTEND
  // Memory: 3 blocks. Seq 1 takes 2 (40 tokens), seq 2 one; a 4th block for either is refused.
  Header a = dims(MsgType::AppendKV, 2);
  a.n_tokens = 41;
  const auto k41 = fd::test::random_f16(41 * kKV * kD, w.rng);
  ASSERT_EQ(w.send_type(make_message(a, {bytes_of(std::vector<uint64_t>{1, 2}), bytes_of(std::vector<uint32_t>{40, 1}),
                                         bytes_of(k41), bytes_of(k41)})),
            MsgType::Ok);
  a.n_tokens = 32;
  const auto k32 = fd::test::random_f16(32 * kKV * kD, w.rng);
  EXPECT_EQ(w.send_error(make_message(a, {bytes_of(std::vector<uint64_t>{1, 2}), bytes_of(std::vector<uint32_t>{0, 32}),
                                          bytes_of(k32), bytes_of(k32)})),
            ErrorCode::OutOfMemory);
  EXPECT_EQ(w.svc.stats()["tokens"], 41);
  // Requests the worker never takes are refused too.
  EXPECT_EQ(w.send_error(make_message(dims(MsgType::Ok), {})), ErrorCode::Malformed);
  // A second HELLO with another shape while sequences are live is refused; the same shape is fine.
  Header hb = dims(MsgType::Hello);
  hb.layer = kLayers + 1;
  EXPECT_EQ(w.send_error(make_message(hb, {})), ErrorCode::ShapeMismatch);
  w.hello();
  EXPECT_EQ(w.svc.stats()["tokens"], 41);
  // SHUTDOWN needs the worker's token; this worker has none: refused whatever the frame holds (RWorkerSessions).
  EXPECT_EQ(w.send_error(make_message(dims(MsgType::Shutdown), {})), ErrorCode::Malformed);  // no token frame
  EXPECT_EQ(w.send_error(make_message(dims(MsgType::Shutdown), {std::vector<uint8_t>(kShutdownTokenBytes, 0)})),
            ErrorCode::Forbidden);
  EXPECT_FALSE(w.svc.shutdown_requested());
}

// At least 100k mutated messages: the worker answers every one (an ERROR or a valid reply), never
// throws or crashes, and afterwards still computes correct attention for a clean sequence.
TEST(RWorkerService, FuzzHundredThousandMutatedMessages) {
  for (KVDType t : {KVDType::F16, KVDType::I4}) {
    Harness w(t, size_t(64) << 20);
    w.hello();
    fd::fuzz::Corpus corpus = fd::fuzz::seed_corpus(kLayers, kH, kKV, kD);
    std::mt19937_64 rng(t == KVDType::F16 ? 1 : 2);
    size_t errors = 0, ok = 0;
    const int n = t == KVDType::F16 ? 100000 : 20000;
    // Three clients (sessions) interleaved, one HELLO'd with another shape; now and then a connection ends.
    const std::string peers[3] = {"", "x", "y"};
    Header hy = dims(MsgType::Hello);
    hy.layer = kLayers + 2;
    const RawMessage my = make_message(hy, {});
    const auto fy = my.frames();
    w.svc.handle("y", fy.data(), fy.size());
    for (int i = 0; i < n; ++i) {
      const RawMessage m = fd::fuzz::mutate(corpus, rng);
      const auto f = m.frames();
      const std::string& peer = peers[rng() % 3];
      if (rng() % 1000 == 0) w.svc.end_session(peers[rng() % 3]);
      std::vector<zmq::message_t> r;
      ASSERT_NO_THROW(r = w.svc.handle(peer, f.data(), f.size())) << "message " << i;
      ASSERT_FALSE(r.empty());
      ASSERT_EQ(r[0].size(), kHeaderBytes);
      const Header rh = reply_header(r);
      ASSERT_EQ(rh.magic, kMagic);
      (rh.msg_type() == MsgType::Error ? errors : ok) += 1;
      if (w.svc.shutdown_requested()) w = Harness(t, size_t(64) << 20), w.hello();
    }
    std::printf("fuzz %s: %zu error replies, %zu other replies\n", std::string(kv_dtype_name(t)).c_str(), errors, ok);
    EXPECT_GT(errors, size_t(n) / 4);  // the mutations do hit the checks
    EXPECT_GT(ok, 100u);               // and valid traffic got through
    EXPECT_LE(w.svc.stats()["memory_used_bytes"].get<size_t>() + w.svc.stats()["memory_pooled_bytes"].get<size_t>(),
              (size_t(64) << 20) + kSessionBytes);  // within --memory-gb, whatever the clients did
    // A fresh sequence on the fuzzed worker (a new client's session) still gives the reference answer.
    w.peer = "check";
    w.hello();
    ASSERT_EQ(w.send_type(w.ids_msg(MsgType::AddSeq, {999999})), MsgType::Ok);
    const auto q = fd::test::random_f16(kH * kD, w.rng), k = fd::test::random_f16(kKV * kD, w.rng),
               v = fd::test::random_f16(kKV * kD, w.rng);
    const auto r = w.send(make_message(dims(MsgType::Attend, 1), {bytes_of(std::vector<uint64_t>{999999}), bytes_of(q), bytes_of(k), bytes_of(v)}));
    ASSERT_EQ(reply_header(r).msg_type(), MsgType::AttendReply);
    std::vector<uint16_t> o(kH * kD);
    std::memcpy(o.data(), r[1].data(), r[1].size());
    // One token: the output is exactly that token's V (per KV head group), up to fp16 rounding.
    for (int h = 0; h < kH; ++h)
      for (int d = 0; d < kD; ++d)
        ASSERT_NEAR(fp16_to_fp32(o[h * kD + d]), fp16_to_fp32(v[(h / (kH / kKV)) * kD + d]), 1e-3);
    // A 40-token prompt (one full block: quantized in the int4 store, from blocks the fuzzing recycled)
    // then a decode step: the fuzzed worker answers bit for bit as a fresh one given the same messages.
    Harness fresh(t, size_t(64) << 20);
    fresh.hello();
    Header ap = dims(MsgType::AppendKV, 1);
    ap.n_tokens = 40;
    const auto pk = fd::test::random_f16(size_t(40) * kKV * kD, w.rng), pv = fd::test::random_f16(pk.size(), w.rng);
    const auto q2 = fd::test::random_f16(kH * kD, w.rng), k2 = fd::test::random_f16(kKV * kD, w.rng),
               v2 = fd::test::random_f16(kKV * kD, w.rng);
    const std::vector<uint64_t> id2 = {999998};
    std::vector<std::vector<uint8_t>> answers;
    for (Harness* x : {&w, &fresh}) {
      ASSERT_EQ(x->send_type(x->ids_msg(MsgType::AddSeq, id2)), MsgType::Ok);
      ASSERT_EQ(x->send_type(make_message(ap, {bytes_of(id2), bytes_of(std::vector<uint32_t>{40}), bytes_of(pk), bytes_of(pv)})),
                MsgType::Ok);
      const auto r2 = x->send(make_message(dims(MsgType::Attend, 1), {bytes_of(id2), bytes_of(q2), bytes_of(k2), bytes_of(v2)}));
      ASSERT_EQ(reply_header(r2).msg_type(), MsgType::AttendReply);
      const auto* b = static_cast<const uint8_t*>(r2[1].data());
      answers.emplace_back(b, b + r2[1].size());
    }
    EXPECT_EQ(answers[0], answers[1]) << "the fuzzed worker's attention differs from a fresh worker's";
  }
}

// An ATTEND whose one-token appends need more memory than is free is refused as a whole: ERROR
// OutOfMemory, no sequence of the request changed (checked by the worker's totals and, token by token,
// by the reference attention of later ATTENDs over the client's record), and the worker serves
// requests that fit, and this one once memory is freed. fp16: a new block at a sequence's 33rd token;
// int4: the quantized block allocated when the fp16 tail fills at the 32nd.
TEST(RWorkerService, OutOfMemoryDuringAttendChangesNothing) {
  const size_t blk = kv_fp16_block_bytes(kKV, kD);
  {
    SCOPED_TRACE("fp16");
    Harness w(KVDType::F16, 4 * blk + 4 * KVStore::sequence_bytes(kLayers));  // 4 blocks beside 4 sequences' tables
    w.hello();
    Cache cache;
    ASSERT_EQ(w.send_type(w.ids_msg(MsgType::AddSeq, {1, 2, 3, 4})), MsgType::Ok);
    // Seq 1 has a full block (its next token needs a new one), 2 and 3 have room; 4 blocks, all used.
    ASSERT_EQ(append_kv(w, cache, {1, 2, 3, 4}, {32, 10, 30, 20}, 0), ErrorCode::None);
    const Usage full{4, 92, int64_t(4 * blk)};
    ASSERT_EQ(usage(w.svc), full);
    // Sequences that fit come first, so an append-as-you-go worker would change them before failing.
    EXPECT_EQ(attend(w, cache, {2, 3, 1}, 0), ErrorCode::OutOfMemory);
    EXPECT_EQ(usage(w.svc), full);
    EXPECT_EQ(attend(w, cache, {2}, 1), ErrorCode::OutOfMemory);  // a first token at layer 1 needs a block
    EXPECT_EQ(usage(w.svc), full);
    // What fits still works, and the outputs show seqs 2 and 3 hold only what was appended before.
    ASSERT_EQ(attend(w, cache, {3, 2}, 0), ErrorCode::None);
    EXPECT_EQ(usage(w.svc), (Usage{4, 94, int64_t(4 * blk)}));
    // One block free: seqs 2 and 3 at layer 1 need one each; each would fit alone, not both.
    ASSERT_EQ(w.send_type(w.ids_msg(MsgType::FreeSeq, {4})), MsgType::Ok);
    const Usage freed{3, 74, int64_t(3 * blk)};
    ASSERT_EQ(usage(w.svc), freed);
    EXPECT_EQ(attend(w, cache, {2, 3}, 1), ErrorCode::OutOfMemory);
    EXPECT_EQ(usage(w.svc), freed);
    // After the FREE the first refused request goes through: seq 1 gets its second block.
    ASSERT_EQ(attend(w, cache, {2, 3, 1}, 0), ErrorCode::None);
    EXPECT_EQ(usage(w.svc), (Usage{3, 77, int64_t(4 * blk)}));
    ASSERT_EQ(attend(w, cache, {1, 2}, 0), ErrorCode::None);  // seq 1's second block has room
    EXPECT_EQ(usage(w.svc), (Usage{3, 79, int64_t(4 * blk)}));
    EXPECT_EQ(attend(w, cache, {3}, 0), ErrorCode::OutOfMemory);  // full again: seq 3 (32) needs a block
    EXPECT_EQ(usage(w.svc), (Usage{3, 79, int64_t(4 * blk)}));
    EXPECT_EQ((cache[{1, 0}].n), 34);
  }
  {
    SCOPED_TRACE("int4");
    const size_t q4 = kv_block_bytes(KVDType::I4, kKV, kD);
    // Two fp16 tails (31 and 5 tokens) and one byte less than a quantized block free.
    Harness w(KVDType::I4, 2 * blk + q4 - 1 + 2 * KVStore::sequence_bytes(kLayers));
    w.hello();
    Cache cache;
    ASSERT_EQ(w.send_type(w.ids_msg(MsgType::AddSeq, {1, 2})), MsgType::Ok);
    ASSERT_EQ(append_kv(w, cache, {2, 1}, {5, 31}, 0), ErrorCode::None);
    const Usage before{2, 36, int64_t(2 * blk)};
    ASSERT_EQ(usage(w.svc), before);
    EXPECT_EQ(attend(w, cache, {2, 1}, 0), ErrorCode::OutOfMemory);  // seq 1's 32nd token fills its block
    EXPECT_EQ(usage(w.svc), before);
    EXPECT_EQ(attend(w, cache, {1}, 1), ErrorCode::OutOfMemory);  // layer 1: a first tail, refused too
    EXPECT_EQ(usage(w.svc), before);
    // Seq 2 is still an fp16 tail, so its reference is exact: it holds its 5 tokens and no 6th.
    ASSERT_EQ(attend(w, cache, {2}, 0), ErrorCode::None);
    ASSERT_EQ(w.send_type(w.ids_msg(MsgType::FreeSeq, {2})), MsgType::Ok);
    // Seq 1 (31 tokens, so the totals say) fills and quantizes its block now: no exact reference.
    ASSERT_EQ(attend(w, cache, {1}, 0, /*check=*/false), ErrorCode::None);
    EXPECT_EQ(usage(w.svc), (Usage{1, 32, int64_t(blk + q4)}));
  }
}

// Duplicate sequence ids within one request: ERROR DuplicateSequence for every request type, with
// nothing changed, also where the repeat is not adjacent and the ids before it are valid.
TEST(RWorkerService, DuplicateIdsInOneRequestChangeNothing) {
  Harness w;
  w.hello();
  Cache cache;
  ASSERT_EQ(w.send_type(w.ids_msg(MsgType::AddSeq, {5, 6})), MsgType::Ok);
  ASSERT_EQ(append_kv(w, cache, {5, 6}, {3, 4}, 0), ErrorCode::None);
  const Usage u{2, 7, int64_t(2 * kv_fp16_block_bytes(kKV, kD))};
  ASSERT_EQ(usage(w.svc), u);

  EXPECT_EQ(w.send_error(w.ids_msg(MsgType::AddSeq, {7, 7})), ErrorCode::DuplicateSequence);
  EXPECT_EQ(w.send_error(w.ids_msg(MsgType::AddSeq, {8, 9, 8})), ErrorCode::DuplicateSequence);
  EXPECT_EQ(usage(w.svc), u);
  EXPECT_EQ(attend(w, cache, {5, 5}, 0), ErrorCode::DuplicateSequence);
  EXPECT_EQ(attend(w, cache, {6, 5, 6}, 0), ErrorCode::DuplicateSequence);
  EXPECT_EQ(usage(w.svc), u);
  EXPECT_EQ(append_kv(w, cache, {5, 5}, {1, 1}, 0), ErrorCode::DuplicateSequence);
  EXPECT_EQ(append_kv(w, cache, {5, 6, 5}, {1, 2, 1}, 0), ErrorCode::DuplicateSequence);
  EXPECT_EQ(append_kv(w, cache, {6, 5, 6}, {0, 2, 0}, 0), ErrorCode::DuplicateSequence);
  EXPECT_EQ(usage(w.svc), u);
  EXPECT_EQ(w.send_error(w.ids_msg(MsgType::FreeSeq, {5, 5})), ErrorCode::DuplicateSequence);
  EXPECT_EQ(w.send_error(w.ids_msg(MsgType::FreeSeq, {6, 5, 6})), ErrorCode::DuplicateSequence);
  EXPECT_EQ(usage(w.svc), u);

  // Nothing was added: 7, 8 and 9 are new to the worker (an ADD of an existing id is refused).
  EXPECT_EQ(w.send_type(w.ids_msg(MsgType::AddSeq, {7, 8, 9})), MsgType::Ok);
  // Nothing was appended or freed: 5 and 6 hold exactly their 3 and 4 tokens.
  ASSERT_EQ(attend(w, cache, {5, 6}, 0), ErrorCode::None);
  EXPECT_EQ(usage(w.svc), (Usage{5, 9, u.bytes}));
}

// Issue 16's crash: HELLO with 2^31 - 1 layers, then ADD_SEQ and ATTEND, crashed the worker (the sequence was
// registered before its layer table failed to allocate). A layer count over kMaxHelloLayers is malformed, and
// nothing after it finds a half-made sequence.
TEST(RWorkerService, HugeHelloLayerCountsAreMalformed) {
  Harness w;
  for (uint32_t layers : {uint32_t(0x7fffffff), uint32_t(0x80000000), uint32_t(0xffffffff), kMaxHelloLayers + 1}) {
    Header h = dims(MsgType::Hello);
    h.layer = layers;
    EXPECT_EQ(w.send_error(make_message(h, {})), ErrorCode::Malformed) << layers << " layers";
  }
  EXPECT_EQ(w.send_error(w.ids_msg(MsgType::AddSeq, {1})), ErrorCode::NotConfigured);
  const auto q = fd::test::random_f16(kH * kD, w.rng), kv = fd::test::random_f16(kKV * kD, w.rng);
  EXPECT_EQ(w.send_error(make_message(dims(MsgType::Attend, 1), {bytes_of(std::vector<uint64_t>{1}), bytes_of(q), bytes_of(kv), bytes_of(kv)})),
            ErrorCode::NotConfigured);
  Header ok = dims(MsgType::Hello);
  ok.layer = kMaxHelloLayers;  // the bound itself is accepted
  EXPECT_EQ(w.send_type(make_message(ok, {})), MsgType::HelloReply);
}

// Empty sequences cost memory too (their per-layer tables): 2 x 1M ADD_SEQ once took 333 MB with
// memory_used_bytes = 0. Their bookkeeping counts against --memory-gb, a request that does not fit is refused
// whole, and FREE gives it back.
TEST(RWorkerService, SequenceBookkeepingCountsAgainstTheMemoryLimit) {
  constexpr uint32_t kManyLayers = 1000;
  const size_t per_seq = KVStore::sequence_bytes(int(kManyLayers));
  Harness w(KVDType::F16, 20 * per_seq + per_seq / 2);  // room for 20 empty sequences, not 21
  Header h = dims(MsgType::Hello);
  h.layer = kManyLayers;
  const auto r = w.send(make_message(h, {}));
  ASSERT_EQ(reply_header(r).msg_type(), MsgType::HelloReply);
  const json info = json::parse(std::string(static_cast<const char*>(r.at(1).data()), r.at(1).size()));
  EXPECT_EQ(info.at("sequence_bytes").get<size_t>(), per_seq);
  std::vector<uint64_t> many(21);
  for (size_t i = 0; i < many.size(); ++i) many[i] = 100 + i;
  EXPECT_EQ(w.send_error(w.ids_msg(MsgType::AddSeq, many)), ErrorCode::OutOfMemory);
  EXPECT_EQ(w.svc.stats()["sequences"], 0);  // none of the 21 was added
  EXPECT_EQ(w.svc.stats()["memory_used_bytes"], kSessionBytes);  // the session alone
  many.pop_back();
  ASSERT_EQ(w.send_type(w.ids_msg(MsgType::AddSeq, many)), MsgType::Ok);
  EXPECT_EQ(w.svc.stats()["memory_used_bytes"].get<size_t>(), 20 * per_seq + kSessionBytes);
  EXPECT_EQ(w.svc.stats()["kv_bytes"], 0);
  EXPECT_EQ(w.send_error(w.ids_msg(MsgType::AddSeq, {7})), ErrorCode::OutOfMemory);
  ASSERT_EQ(w.send_type(w.ids_msg(MsgType::FreeSeq, many)), MsgType::Ok);
  EXPECT_EQ(w.svc.stats()["memory_used_bytes"], kSessionBytes);
  EXPECT_EQ(w.send_type(w.ids_msg(MsgType::AddSeq, {7})), MsgType::Ok);
}

// Issue 16: 40 x 7 MB frames reached 274 MB with --max-message-mb 8, all held before the size was checked. The
// loop checks the running total as frames arrive: past the limit it holds nothing more (the frames are dropped
// as received), answers ERROR too-large, and goes on serving. Its own count of bytes held stays under the limit.
// (libzmq still assembles the whole message before the loop sees it: docs/SECURITY.md.)
TEST(RWorkerServer, OversizedMessageIsRefusedFrameByFrame) {
  constexpr size_t kLimit = 8'000'000, kFrame = 7'000'000;
  RWorkerConfig cfg{KVDType::F16, size_t(1) << 28, 1, best_isa(), Limits{}, "test"};
  cfg.limits.max_message_bytes = kLimit;
  RWorkerService svc(cfg);
  RouterCounters counters;
  std::atomic<bool> stop{false};
  std::string endpoint;
  std::atomic<bool> bound{false};
  RouterLoop loop;
  loop.listen = "tcp://127.0.0.1:*";
  loop.max_message_bytes = kLimit;
  loop.counters = &counters;
  loop.handle = [&](const std::string& peer, const Frame* f, size_t n) { return svc.handle(peer, f, n); };
  loop.on_disconnect = [&](const std::string& peer) { svc.end_session(peer); };
  loop.done = [&] { return stop.load(); };
  loop.on_bound = [&](const std::string& ep) {
    endpoint = ep;
    bound = true;
  };
  std::thread server([&] { run_router_loop(loop); });
  while (!bound) std::this_thread::yield();
  zmq::context_t ctx(1);
  zmq::socket_t d(ctx, zmq::socket_type::dealer);
  d.set(zmq::sockopt::linger, 0);
  d.set(zmq::sockopt::rcvtimeo, 60000);  // a hang guard only
  d.connect(endpoint);
  const auto recv_reply = [&] {
    std::vector<zmq::message_t> r;
    EXPECT_TRUE(zmq::recv_multipart(d, std::back_inserter(r)));
    return r;
  };
  // An ATTEND header claiming frames of any size, then 40 frames of 7 MB.
  Header h = dims(MsgType::Attend, 1);
  h.request_id = 77;
  h.n_frames = 40;
  const auto hb = encode_header(h);
  d.send(zmq::buffer(hb.data(), hb.size()), zmq::send_flags::sndmore);
  const std::vector<uint8_t> big(kFrame, 0x5a);
  for (int i = 0; i < 40; ++i) d.send(zmq::buffer(big), i + 1 < 40 ? zmq::send_flags::sndmore : zmq::send_flags::none);
  auto r = recv_reply();
  ASSERT_GE(r.size(), 2u);
  const Header rh = reply_header(r);
  EXPECT_EQ(rh.msg_type(), MsgType::Error);
  EXPECT_EQ(ErrorCode(rh.status), ErrorCode::TooLarge);
  EXPECT_EQ(rh.request_id, 77u);
  EXPECT_LE(counters.max_bytes_held, kLimit);
  EXPECT_EQ(counters.refused_too_large, 1u);
  EXPECT_EQ(svc.stats()["requests"], 0);  // the handler never saw it
  // Too many small frames are refused the same way (malformed), and a valid request afterwards is served.
  d.send(zmq::buffer(hb.data(), hb.size()), zmq::send_flags::sndmore);
  for (size_t i = 0; i < 2 * kMaxRequestFrames; ++i)
    d.send(zmq::buffer(big.data(), 8), i + 1 < 2 * kMaxRequestFrames ? zmq::send_flags::sndmore : zmq::send_flags::none);
  r = recv_reply();
  ASSERT_GE(r.size(), 2u);
  EXPECT_EQ(ErrorCode(reply_header(r).status), ErrorCode::Malformed);
  EXPECT_EQ(counters.refused_too_large, 2u);
  const auto sb = encode_header(dims(MsgType::Stats));
  d.send(zmq::buffer(sb.data(), sb.size()), zmq::send_flags::none);
  r = recv_reply();
  ASSERT_GE(r.size(), 1u);
  EXPECT_EQ(reply_header(r).msg_type(), MsgType::StatsReply);
  stop = true;
  server.join();
}

// A client decides how many bad requests it sends, so error lines are rate-limited: at most N per one-second
// window, the rest counted and summed up in one "suppressed K" line before the next line allowed.
TEST(RWorkerServer, ErrorLogIsRateLimited) {
  LogLimiter lim(3);
  std::string summary;
  const int64_t s = 1'000'000'000, t0 = 5 * s;
  int allowed = 0;
  for (int i = 0; i < 1000; ++i) allowed += lim.allow(t0 + i, &summary);
  EXPECT_EQ(allowed, 3);
  EXPECT_EQ(lim.suppressed_total(), 997u);
  ASSERT_TRUE(lim.allow(t0 + s, &summary));  // the next window
  EXPECT_EQ(summary, "suppressed 997 error lines (at most 3 per second)");
  ASSERT_TRUE(lim.allow(t0 + s + 1, &summary));
  EXPECT_EQ(summary, "");  // reported once
  LogLimiter unlimited(0);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(unlimited.allow(t0, &summary));
}
