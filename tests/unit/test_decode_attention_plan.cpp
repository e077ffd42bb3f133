// CPU decode attention (kernels/cpu/decode_attention.h): the work split (a long context cut over threads and merged,
// the workspace reused), the knobs that change what is read when but not the result (prefetch distance, kv heads a
// task), the byte formula and bad parameters. Helpers: decode_attention_test_util.h.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "decode_attention_test_util.h"

namespace {

// One sequence with context 8192 must be split across threads; the split result (merged partial
// states) agrees with the unsplit one and with the reference.
class DecodeAttentionSplit : public ::testing::TestWithParam<Isa> {};

TEST_P(DecodeAttentionSplit, LongSingleSequenceIsSplitAndMerged) {
  const Isa isa = GetParam();
  FD_SKIP_UNLESS_ISA(isa);
  for (KVDType dt : kDtypes) {
    const Batch b = make_batch(dt, {8192 + 5}, 8, 2, 128, 99);
    const std::vector<double> ref = reference(b);
    std::vector<float> o1(ref.size()), o16(ref.size());
    const auto plan1 = fd::decode_attention_plan(b.params(o1.data()), 1);
    const auto plan16 = fd::decode_attention_plan(b.params(o1.data()), 16);
    EXPECT_EQ(plan1.n_split_pairs, 0);
    EXPECT_EQ(plan16.n_split_pairs, 2 / plan16.heads_per_task);  // every pair (both kv heads, one or two a pair)
    EXPECT_GE(plan16.n_tasks, 16);          // every thread gets a chunk (chunks >= 64 KiB)
    fd::DecodeAttentionWorkspace ws;
    fd::decode_attention(b.params(o1.data()), isa, 1, ws);
    fd::decode_attention(b.params(o16.data()), isa, 16, ws);
    EXPECT_TRUE(close(o1, ref, 8, 128)) << fd::kv_dtype_name(dt);
    EXPECT_TRUE(close(o16, ref, 8, 128)) << fd::kv_dtype_name(dt);
    for (size_t i = 0; i < o1.size(); ++i) ASSERT_NEAR(o1[i], o16[i], 1e-5) << "index " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(DecodeAttention, DecodeAttentionSplit, ::testing::ValuesIn(kIsas),
                         [](const auto& info) { return isa_param_name(info.param); });

// The workspace grows once; a second call of the same shape allocates nothing and gives the same bits.
TEST(DecodeAttention, WorkspaceReusedWithoutReallocation) {
  const Batch b = make_batch(KVDType::F16, {4096, 100, 33}, 32, 8, 128, 5);
  std::vector<float> o1(3 * 32 * 128), o2(o1.size());
  fd::DecodeAttentionWorkspace ws;
  fd::decode_attention(b.params(o1.data()), fd::best_isa(), 4, ws);
  const float* pp = ws.partial.data();
  const int64_t* ip = ws.index.data();
  fd::decode_attention(b.params(o2.data()), fd::best_isa(), 4, ws);
  EXPECT_EQ(pp, ws.partial.data());
  EXPECT_EQ(ip, ws.index.data());
  EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)));
}

// The prefetch distance and the kv heads a task reads change what is read when, never what is computed: every ISA,
// dtype and query mode gives the same bits as one head a task at distance 1, at distances 0 (none), 2 and the
// maximum and at 2 and 4 heads a task (one head's blocks in the same order either way), for sequences shorter and
// longer than the distance; split over threads, where the cut moves with the heads a task, within 1e-5. One case per
// ISA (an ISA this CPU lacks skips its case).
class DecodeAttentionKnobs : public ::testing::TestWithParam<Isa> {};

TEST_P(DecodeAttentionKnobs, PrefetchAndHeadsPerTaskKeepTheBits) {
  const Isa isa = GetParam();
  FD_SKIP_UNLESS_ISA(isa);
  for (KVDType dt : kDtypes) {
    const Batch b = make_batch(dt, {1, 31, 32 + 7, 3 * 32, 9 * 32 + 30, 2048 + 5}, 8, 4, 128, 17);
    for (const fd::QueryQuant qq : {fd::QueryQuant::F32, fd::QueryQuant::I8})
      for (int threads : {1, 3}) {
        fd::DecodeAttentionWorkspace ws;
        std::vector<float> base(size_t(6) * 8 * 128, NAN), o(base.size(), NAN);
        fd::DecodeAttentionParams p0 = b.params(base.data(), qq);
        p0.heads_per_task = 1;
        fd::decode_attention(p0, isa, threads, ws);
        for (const auto [pf, hpt] : {std::pair{0, 1}, {2, 1}, {fd::kMaxPrefetchBlocks, 1}, {1, 2}, {1, 4}, {2, 4}}) {
          fd::DecodeAttentionParams p = b.params(o.data(), qq);
          p.prefetch_blocks = pf, p.heads_per_task = hpt;
          EXPECT_EQ(fd::decode_attention_plan(p, threads).n_pairs, 6 * 4 / hpt);
          std::fill(o.begin(), o.end(), NAN);
          fd::decode_attention(p, isa, threads, ws);
          const std::string what = std::string(fd::isa_name(isa)) + " " + std::string(fd::kv_dtype_name(dt)) +
                                   " query " + std::string(fd::query_quant_name(qq)) + " threads " +
                                   std::to_string(threads) + ": prefetch_blocks " + std::to_string(pf) +
                                   ", heads_per_task " + std::to_string(hpt);
          // Over threads the long sequence is cut by bytes a pair, so the merge (and its rounding) moves with
          // heads_per_task; the same bits where nothing is cut.
          if (threads == 1 || hpt == 1)
            EXPECT_EQ(0, std::memcmp(o.data(), base.data(), o.size() * sizeof(float))) << what << " changed the output";
          else
            for (size_t i = 0; i < o.size(); ++i) ASSERT_NEAR(o[i], base[i], 1e-5) << what << ", index " << i;
        }
      }
  }
}

INSTANTIATE_TEST_SUITE_P(DecodeAttention, DecodeAttentionKnobs, ::testing::ValuesIn(kIsas),
                         [](const auto& info) { return isa_param_name(info.param); });

// heads_per_task = 0 takes the fewest heads, a divisor of n_kv_heads, whose bytes of a full block reach 8 KiB.
TEST(DecodeAttention, HeadsPerTaskAuto) {
  auto hpt = [](KVDType dt, int H, int D, int set = 0) {
    fd::DecodeAttentionParams p;
    p.dtype = dt, p.n_heads = 4 * H, p.n_kv_heads = H, p.head_dim = D, p.heads_per_task = set;
    return fd::decode_attention_heads_per_task(p);
  };
  EXPECT_EQ(hpt(KVDType::F16, 32, 128), 1);  // 16 KiB a head
  EXPECT_EQ(hpt(KVDType::I8, 32, 128), 1);   // 8 KiB + 256 B
  EXPECT_EQ(hpt(KVDType::I4, 32, 128), 2);   // 5 KiB
  EXPECT_EQ(hpt(KVDType::I4, 8, 128), 2);
  EXPECT_EQ(hpt(KVDType::I4, 9, 128), 3);    // the next divisor up
  EXPECT_EQ(hpt(KVDType::I4, 7, 128), 7);    // 7 is prime: all 7 (at most 8)
  EXPECT_EQ(hpt(KVDType::I4, 11, 128), 1);   // no divisor in [2, 8]
  EXPECT_EQ(hpt(KVDType::I4, 2, 64), 2);     // wants 4 of 2.5 KiB: both
  EXPECT_EQ(hpt(KVDType::I4, 6, 64), 6);     // wants 4: 6 is the next divisor up
  EXPECT_EQ(hpt(KVDType::I4, 32, 64), 4);    // 2.5 KiB
  EXPECT_EQ(hpt(KVDType::I8, 32, 64), 2);    // 4 KiB + 256 B
  EXPECT_EQ(hpt(KVDType::F16, 32, 32), 2);   // 4 KiB
  EXPECT_EQ(hpt(KVDType::I4, 32, 32), 8);    // 1.25 KiB: at most 8
  EXPECT_EQ(hpt(KVDType::I4, 32, 128, 4), 4);  // set: taken as it is
}

TEST(DecodeAttention, KvBytesFormula) {
  const Batch b = make_batch(KVDType::I4, {64 + 3, 32}, 8, 2, 64, 3);
  std::vector<float> o(2 * 8 * 64);
  // full blocks at the dtype's size + tail tokens in fp16 (K and V)
  const int64_t want = 3 * int64_t(fd::kv_block_bytes(KVDType::I4, 2, 64)) + 3 * 2 * 64 * 2 * 2;
  EXPECT_EQ(fd::decode_attention_kv_bytes(b.params(o.data())), want);
}

TEST(DecodeAttention, BadParamsThrow) {
  const Batch b = make_batch(KVDType::F16, {40}, 8, 2, 64, 7);
  std::vector<float> o(8 * 64);
  fd::DecodeAttentionWorkspace ws;
  auto run = [&](auto edit) {
    fd::DecodeAttentionParams p = b.params(o.data());
    edit(p);
    fd::decode_attention(p, Isa::Scalar, 1, ws);
  };
  auto msg = [&](auto edit) {
    try {
      run(edit);
    } catch (const fd::Error& e) {
      return std::string(e.what());
    }
    return std::string("no throw");
  };
  EXPECT_NE(msg([](auto& p) { p.head_dim = 48; }).find("head_dim"), std::string::npos);
  EXPECT_NE(msg([](auto& p) { p.head_dim = 288; }).find("head_dim"), std::string::npos);
  EXPECT_NE(msg([](auto& p) { p.n_kv_heads = 3; }).find("multiple of n_kv_heads"), std::string::npos);
  EXPECT_NE(msg([](auto& p) { p.n_heads = 0; }).find("n_heads"), std::string::npos);
  EXPECT_NE(msg([](auto& p) { p.q = nullptr; }).find("null"), std::string::npos);
  EXPECT_NE(msg([](auto& p) { p.scale = NAN; }).find("scale"), std::string::npos);
  EXPECT_NE(msg([](auto& p) { p.n_seq = -1; }).find("n_seq"), std::string::npos);
  EXPECT_NE(msg([](auto& p) { p.dtype = KVDType(7); }).find("dtype"), std::string::npos);
  EXPECT_NE(msg([](auto& p) { p.query = fd::QueryQuant(5); }).find("query quantization"), std::string::npos);
  EXPECT_NE(msg([](auto& p) { p.prefetch_blocks = -1; }).find("prefetch_blocks"), std::string::npos);
  EXPECT_NE(msg([](auto& p) { p.heads_per_task = 3; }).find("heads_per_task"), std::string::npos);  // 2 kv heads
  EXPECT_NE(msg([](auto& p) { p.heads_per_task = -1; }).find("heads_per_task"), std::string::npos);
  EXPECT_NE(msg([](auto& p) { p.prefetch_blocks = fd::kMaxPrefetchBlocks + 1; }).find("prefetch_blocks"),
            std::string::npos);
  fd::SeqKVView bad = b.seqs[0];
  bad.n_tail = 32;
  EXPECT_NE(msg([&](auto& p) { p.seqs = &bad; }).find("n_tail"), std::string::npos);
  fd::SeqKVView empty;
  EXPECT_NE(msg([&](auto& p) { p.seqs = &empty; }).find("no tokens"), std::string::npos);
  EXPECT_THROW(fd::decode_attention(b.params(o.data()), Isa::Scalar, 0, ws), fd::Error);
  EXPECT_THROW(fd::decode_attention(b.params(o.data()), Isa(9), 1, ws), fd::Error);
  // n_seq == 0 is a documented no-op, even with null pointers.
  fd::DecodeAttentionParams none;
  none.n_heads = none.n_kv_heads = 1;
  none.head_dim = 64;
  none.scale = 0.125f;
  EXPECT_NO_THROW(fd::decode_attention(none, Isa::Scalar, 2, ws));
}

}  // namespace
