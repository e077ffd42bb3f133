// Which rows of a decode step in flight continue into the step launched after it, before the host has read the
// step's tokens (gpu-only's asynchronous stepping, engine.async_steps). Pure host logic, in every build, so CI
// tests the rules (tests/unit/test_engine.cpp); the engine (gpu_only_engine.cpp) gathers the rows' state and
// launches what this returns.
#pragma once
#include <cstdint>
#include <vector>

namespace fd {

// One row of the step in flight, as its sequence stands before that step's token is read.
struct ChainRow {
  bool running = false;   // false: the sequence ended before the step in flight (its row there is dropped)
  bool eligible = false;  // greedy, no forced tokens, no recorded logits
  int64_t generated = 0;  // tokens it emitted before the step in flight
  int64_t max_new_tokens = 1;
};

// The rows (indices into `rows`, in order) whose sequences continue into the next step: running and not ending at
// the step in flight by max_new_tokens (an eos there is not known yet: its row is computed and dropped later).
// Empty, so no step is launched ahead, when a continuing row is not eligible, when none continues, or when `queued`
// requests wait and a row ends at the step in flight: its slot frees there, and the queued must start at the next
// step, as the synchronous engine starts them.
std::vector<int32_t> chain_rows(const std::vector<ChainRow>& rows, bool queued);

}  // namespace fd
