// What the parallel engine tests share (tests/integration/test_fastdecode_parallel.cpp on the CPU,
// tests/gpu/test_parallel_gpu.cpp on the GPU): the request set, one engine run, and the bit-equality of
// recorded logits.
#pragma once
#include <cstring>
#include <vector>

#include "fastdecode/sworker/fastdecode_engine.h"
#include "tests/unit/token_compare.h"

namespace fd::test::parallel {

// Five requests of unequal prompts and lengths (they finish at different steps); request 11 records logits.
inline std::vector<Request> requests(const ModelConfig& c) {
  std::vector<Request> r;
  for (uint64_t i = 0; i < 5; ++i) {
    Request q;
    q.id = 10 + i;
    for (uint64_t t = 0; t < 3 + 4 * i; ++t) q.prompt.push_back(int32_t(3 + (i * 37 + t * 11) % uint64_t(c.vocab_size - 3)));
    q.max_new_tokens = 24 + int64_t(i) * 3;
    q.record_logits = i == 1;
    r.push_back(q);
  }
  return r;
}

// The requests through the fastdecode engine `ec` on seeded random fp16 weights; no errors expected.
inline EngineRun run(const ModelConfig& c, const FastDecodeConfig& ec) {
  auto w = make_random_source(3, DType::F16);
  auto e = make_fastdecode_engine(ec, {c, *w, SamplingParams{}});
  const auto r = run_engine(*e, requests(c));
  EXPECT_TRUE(r.errors.empty()) << r.describe_errors();
  return r;
}

// Every recorded logits row of a equals b's, bit for bit (and there is at least one).
inline bool same_rows(const EngineRun& a, const EngineRun& b) {
  if (a.logits.size() != b.logits.size()) return false;
  for (const auto& [id, rows] : a.logits) {
    const auto& o = b.logits.at(id);
    if (rows.size() != o.size()) return false;
    for (size_t i = 0; i < rows.size(); ++i)
      if (rows[i].size() != o[i].size() || std::memcmp(rows[i].data(), o[i].data(), rows[i].size() * 4) != 0) return false;
  }
  return !a.logits.empty();
}

}  // namespace fd::test::parallel
