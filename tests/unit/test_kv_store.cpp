#include "fastdecode/rworker/kv_store.h"

#include "fastdecode/core/dtype.h"
#include "rworker_test_util.h"
#include "test_helpers.h"

using namespace fd;

namespace {
constexpr int kH = 2, kD = 64;

// K/V of n tokens where every element encodes (token, head, dim) so any misplacement shows.
std::vector<uint16_t> coded(int n, int start, float sign) {
  std::vector<uint16_t> v(size_t(n) * kH * kD);
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < kH; ++h)
      for (int d = 0; d < kD; ++d)
        v[(size_t(t) * kH + h) * kD + d] = fp32_to_fp16(sign * float((start + t) % 97 + h * 0.25 + d / 128.0));
  return v;
}
}  // namespace

TEST(KVStore, Fp16LayoutAcrossBlocks) {
  KVStore s(KVDType::F16, 3, kH, kD, size_t(1) << 30);
  s.add(7);
  const auto k1 = coded(20, 0, 1), v1 = coded(20, 0, -1);
  s.append_f16(7, 1, k1.data(), v1.data(), 20);  // prompt
  for (int t = 20; t < 70; ++t) {                // decode, one token at a time
    const auto k = coded(1, t, 1), v = coded(1, t, -1);
    s.append_f16(7, 1, k.data(), v.data(), 1);
  }
  EXPECT_EQ(s.length(7, 1), 70);
  EXPECT_EQ(s.length(7, 0), 0);
  const SeqKVView view = s.view(7, 1);
  ASSERT_EQ(view.n_full, 2);
  ASSERT_EQ(view.n_tail, 6);
  const auto all_k = coded(70, 0, 1), all_v = coded(70, 0, -1);
  for (int t = 0; t < 70; ++t) {
    const uint16_t* blk = t < 64 ? static_cast<const uint16_t*>(view.blocks[t / 32]) : view.tail;
    const int r = t % 32;
    for (int h = 0; h < kH; ++h)
      for (int d = 0; d < kD; ++d) {
        ASSERT_EQ(blk[(h * 32 + r) * kD + d], all_k[(size_t(t) * kH + h) * kD + d]) << t << " " << h << " " << d;
        ASSERT_EQ(blk[kH * 32 * kD + (h * 32 + r) * kD + d], all_v[(size_t(t) * kH + h) * kD + d]);
      }
  }
  EXPECT_EQ(s.total_tokens(), 70);
  EXPECT_EQ(s.bytes_used(), 3 * kv_fp16_block_bytes(kH, kD));
}

TEST(KVStore, MemoryLimitChangesNothing) {
  const size_t blk = kv_fp16_block_bytes(kH, kD);
  KVStore s(KVDType::F16, 1, kH, kD, 2 * blk);
  s.add(1);
  s.add(2);
  const auto k = coded(40, 0, 1), v = coded(40, 0, 1);
  EXPECT_EQ(s.extra_bytes(1, 0, 40), 2 * blk);
  s.append_f16(1, 0, k.data(), v.data(), 40);
  EXPECT_EQ(s.bytes_used(), 2 * blk);
  EXPECT_THROW(s.append_f16(2, 0, k.data(), v.data(), 1), Error);
  EXPECT_EQ(s.length(2, 0), 0);
  EXPECT_EQ(s.bytes_used(), 2 * blk);
  s.append_f16(1, 0, k.data(), v.data(), 24);  // fills the tail of seq 1 exactly: no new block
  EXPECT_EQ(s.length(1, 0), 64);
  s.free(1);
  EXPECT_EQ(s.bytes_used(), 0u);
  s.append_f16(2, 0, k.data(), v.data(), 1);  // memory is back
  EXPECT_EQ(s.length(2, 0), 1);
  EXPECT_THROW(s.add(2), Error);
  EXPECT_THROW(s.free(1), Error);
  EXPECT_THROW(s.length(2, 1), Error);
}

TEST(KVStore, QuantizedBlocksAndAccounting) {
  for (KVDType t : {KVDType::I8, KVDType::I4}) {
    SCOPED_TRACE(std::string(kv_dtype_name(t)));
    KVStore s(t, 1, kH, kD, size_t(1) << 30);
    s.add(3);
    const auto k = coded(100, 0, 1), v = coded(100, 0, 1);
    s.append_f16(3, 0, k.data(), v.data(), 100);
    const SeqKVView view = s.view(3, 0);
    EXPECT_EQ(view.n_full, 3);
    EXPECT_EQ(view.n_tail, 4);
    // The newest partial block stays fp16, exactly.
    EXPECT_EQ(view.tail[(1 * 32 + 2) * kD + 5], k[(size_t(98) * kH + 1) * kD + 5]);
    EXPECT_EQ(s.bytes_used(), 3 * kv_block_bytes(t, kH, kD) + kv_fp16_block_bytes(kH, kD));
    EXPECT_EQ(s.bytes_at(100), s.bytes_used());
    EXPECT_LT(kv_block_bytes(t, kH, kD), kv_fp16_block_bytes(kH, kD));
    // The first block dequantizes close to what was stored.
    std::vector<uint16_t> back(kv_fp16_block_bytes(kH, kD) / 2);
    kv_dequantize_block(t, view.blocks[0], back.data(), kH, kD);
    const float tol = t == KVDType::I8 ? 0.5f : 7.0f;  // values up to ~97: int8 step ~0.4, int4 ~6.5
    EXPECT_NEAR(fp16_to_fp32(back[(0 * 32 + 9) * kD + 3]), fp16_to_fp32(k[(size_t(9) * kH + 0) * kD + 3]), tol);
    s.free(3);
    EXPECT_EQ(s.bytes_used(), 0u);
  }
}
