// attention_input split over parts (SPart::HostRowsOut, as the S-rank writes each R-worker's rows into its own
// shared-memory block) against the same call into one place per tensor: the same bytes, part by part, in `dt`.
// Used for the CPU S-Part (tests/unit/test_spart_parts.cpp) and the CUDA one (tests/gpu/test_cuda_spart.cpp).
#pragma once
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "fastdecode/core/dtype.h"
#include "fastdecode/spart/spart.h"

namespace fd::test {

// Slot 1 of `sp` gets a 6-token batch; its layer-0 q/k/v whole, then as parts of 2, 0 and 4 rows (each part in its
// own buffer, guarded by a canary byte past its end); with_q false: prefill's form (no q on the host).
inline void check_attention_input_parts(SPart& sp, DType dt, bool with_q) {
  const ModelConfig& c = sp.config();
  const size_t es = dtype_size(dt), T = 6, qb = size_t(c.q_dim()) * es, kvb = size_t(c.kv_dim()) * es;
  const std::vector<int32_t> tok = {3, 17, 42, 7, 99, 5};
  const std::vector<int64_t> pos = {0, 1, 2, 3, 4, 5};
  sp.embed(1, tok.data(), pos.data(), int64_t(T));
  std::vector<uint8_t> q(T * qb), k(T * kvb), v(T * kvb);
  sp.attention_input(1, 0, dt, with_q ? q.data() : nullptr, k.data(), v.data());
  const size_t rows[3] = {2, 0, 4};
  constexpr uint8_t kCanary = 0xa5;
  std::vector<std::vector<uint8_t>> pq(3), pk(3), pv(3);
  std::vector<HostRowsOut> parts;
  for (size_t i = 0; i < 3; ++i) {
    pq[i].assign(rows[i] * qb + 1, kCanary), pk[i].assign(rows[i] * kvb + 1, kCanary), pv[i].assign(rows[i] * kvb + 1, kCanary);
    parts.push_back({with_q ? pq[i].data() : nullptr, pk[i].data(), pv[i].data(), int64_t(rows[i])});
  }
  sp.attention_input(1, 0, dt, parts);
  size_t row = 0;
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE("part " + std::to_string(i));
    if (with_q) EXPECT_EQ(0, std::memcmp(pq[i].data(), q.data() + row * qb, rows[i] * qb)) << "q";
    EXPECT_EQ(0, std::memcmp(pk[i].data(), k.data() + row * kvb, rows[i] * kvb)) << "k";
    EXPECT_EQ(0, std::memcmp(pv[i].data(), v.data() + row * kvb, rows[i] * kvb)) << "v";
    EXPECT_EQ(pq[i].back(), kCanary) << "q written past its part";
    EXPECT_EQ(pk[i].back(), kCanary) << "k written past its part";
    EXPECT_EQ(pv[i].back(), kCanary) << "v written past its part";
    row += rows[i];
  }
}

}  // namespace fd::test
