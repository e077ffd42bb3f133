// Where a new (or rebuilt, or moved) sequence goes among the R-workers (docs/SCHEDULING.md, "Placement"): the one rule of
// the FastDecode engine, its recovery, the hybrid engine's CPU side and fd-sim.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace fd {

// A running sequence as placement sees it: its worker, its KV length now and the decode steps it has left (by its
// max_new_tokens).
struct PlacedLoad {
  size_t worker = 0;
  double len = 0, remaining = 0;
};

// sum over t in [0, m) of (a + t)(b + t): the overlap of two sequences' KV lengths over m common steps (0 for m <= 0).
double placement_overlap(double a, double b, double m);

// The live worker (dead[w] false) for a sequence of KV length `len` now and `new_tokens` steps to go that minimises
// the sum of placement_overlap(its sequences' len, len, min(new_tokens, their remaining)), among the workers whose
// projected load load[w] + need stays within the mean projected load after the placement plus max(longest, need);
// ties to the smaller load[w], then the lower index. Throws when no worker is live.
// `speed` (empty: equal workers): worker w's seconds per KV token, when the workers differ; the rule then minimises
// speed[w]^2 x (2 x the overlap + the sequence's overlap with itself), the same greedy step of least squares on the
// workers' future times rather than their tokens.
size_t place_sequence(const std::vector<int64_t>& load, const std::vector<bool>& dead, const std::vector<PlacedLoad>& running,
                      double len, double new_tokens, int64_t need, int64_t longest, const std::vector<double>& speed = {});

}  // namespace fd
