// Token sampling: greedy, temperature, top-k, top-p; seeded so a run is reproducible.
#pragma once
#include <cstdint>

namespace fd {

struct SamplingParams {
  double temperature = 0.0;  // 0 = greedy (argmax, lowest index on ties)
  int64_t top_k = 0;         // 0 = no limit
  double top_p = 1.0;        // 1 = no nucleus cut
  uint64_t seed = 0;
  bool greedy() const { return temperature == 0.0 || top_k == 1; }
};

// Picks the next token from one row of logits. The random draw is a pure function of
// (params.seed, request_id, step), so tokens do not depend on batch composition or engine.
int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& params, uint64_t request_id,
                     uint64_t step);

// Index of the largest logit (first one on ties).
int32_t argmax(const float* logits, int64_t vocab);

}  // namespace fd
