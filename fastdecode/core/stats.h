// The project's one definition of order statistics, used by every result file (summary.json
// percentiles, profiles, benchmarks).
#pragma once
#include <vector>

namespace fd {

// The q-th percentile (q in [0, 100]) by linear interpolation between order statistics (NumPy's default:
// position q/100 * (n - 1)); 0 for an empty sample.
double percentile(std::vector<double> v, double q);
// percentile(v, 50): the middle value, or the mean of the two middle values.
double median(std::vector<double> v);

}  // namespace fd
