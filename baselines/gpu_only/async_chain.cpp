// The rows of an asynchronous chain (see async_chain.h).
#include "baselines/gpu_only/async_chain.h"

#include <cstddef>

namespace fd {

std::vector<int32_t> chain_rows(const std::vector<ChainRow>& rows, bool queued) {
  std::vector<int32_t> next;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const ChainRow& r = rows[i];
    if (!r.running) continue;
    if (r.generated + 1 >= r.max_new_tokens) {  // ends at the step in flight
      if (queued) return {};
      continue;
    }
    if (!r.eligible) return {};
    next.push_back(int32_t(i));
  }
  return next;
}

}  // namespace fd
