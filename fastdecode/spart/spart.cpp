#include "fastdecode/spart/spart.h"

#include "fastdecode/core/error.h"

namespace fd {

std::vector<HostRowsOut> resolve_rows(const std::vector<HostRowsOut>& parts, int64_t T) {
  FD_CHECK(!parts.empty(), "attention_input: no destination for the slot's " << T << " rows");
  std::vector<HostRowsOut> out = parts;
  if (out.size() == 1 && out[0].rows == HostRowsOut::kAllRows) out[0].rows = T;
  const bool with_q = out[0].q != nullptr;
  int64_t rows = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const HostRowsOut& p = out[i];
    FD_CHECK(p.rows >= 0, "attention_input: part " << i << " of " << out.size() << " has " << p.rows
                                                   << " rows (all rows = kAllRows only as the single part)");
    FD_CHECK(p.rows == 0 || (p.k && p.v), "attention_input: part " << i << " has no place for k or v");
    FD_CHECK(p.rows == 0 || (p.q != nullptr) == with_q, "attention_input: q in some parts and not in others");
    rows += p.rows;
  }
  FD_CHECK(rows == T, "attention_input: " << rows << " rows in the parts for a slot of " << T);
  return out;
}

}  // namespace fd
