#include "fastdecode/sched/placement.h"

#include <algorithm>

#include "fastdecode/core/error.h"

namespace fd {

double placement_overlap(double a, double b, double m) {
  return m <= 0 ? 0.0 : m * a * b + (a + b) * m * (m - 1) / 2 + (m - 1) * m * (2 * m - 1) / 6;
}

size_t place_sequence(const std::vector<int64_t>& load, const std::vector<bool>& dead, const std::vector<PlacedLoad>& running,
                      double len, double new_tokens, int64_t need, int64_t longest, const std::vector<double>& speed) {
  const size_t n = load.size();
  FD_CHECK(dead.size() == n, "place_sequence: " << dead.size() << " dead flags for " << n << " workers");
  FD_CHECK(speed.empty() || speed.size() == n, "place_sequence: " << speed.size() << " speeds for " << n << " workers");
  // Memory: load[w] + need <= the mean after + the longest sequence, the bound capacity() reserves for (one longest
  // sequence a worker beyond the mean); the least-loaded live worker always qualifies (need <= the longest).
  int64_t total = need, live = 0;
  for (size_t w = 0; w < n; ++w)
    if (!dead[w]) total += load[w], ++live;
  FD_CHECK(live > 0, "placement: no R-worker left to place a sequence on");
  const double bound = double(total) / double(live) + double(std::max(longest, need));
  // Balance: the new sequence's KV over its future (len + t, t < new_tokens) against each worker's running sequences'
  // (their len + t while they have steps left): the greedy step of least squares over the future.
  std::vector<double> cost(n, 0.0);
  for (const PlacedLoad& r : running)
    if (r.worker < n && !dead[r.worker]) cost[r.worker] += placement_overlap(r.len, len, std::min(new_tokens, r.remaining));
  if (!speed.empty()) {  // sum_t (v (L(t) + x(t)))^2 - sum_t (v L(t))^2 = v^2 (2 overlap + sum_t x(t)^2)
    const double self = placement_overlap(len, len, new_tokens);
    for (size_t w = 0; w < n; ++w) cost[w] = speed[w] * speed[w] * (2 * cost[w] + self);
  }
  size_t best = n;
  for (size_t w = 0; w < n; ++w) {
    if (dead[w] || double(load[w] + need) > bound) continue;
    if (best == n || cost[w] < cost[best] || (cost[w] == cost[best] && load[w] < load[best])) best = w;
  }
  FD_CHECK(best < n, "placement: no R-worker within the placement bound");
  return best;
}

}  // namespace fd
