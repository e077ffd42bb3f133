#include "fastdecode/spart/spart.h"

#include "fastdecode/core/error.h"

namespace fd {

std::vector<HostRowsOut> resolve_rows(const std::vector<HostRowsOut>& parts, int64_t T) {
  FD_CHECK(!parts.empty(), "attention_input: no destination for the slot's " << T << " rows");
  std::vector<HostRowsOut> out;
  if (parts.size() == 1 && parts[0].rows == HostRowsOut::kAllRows) {
    out = {parts[0]};
    out[0].rows = T;
  } else {
    for (const HostRowsOut& p : parts)
      if (p.rows != 0) out.push_back(p);  // empty parts dropped (their pointers may be anything)
  }
  int64_t rows = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const HostRowsOut& p = out[i];
    FD_CHECK(p.rows > 0 || (out.size() == 1 && T == 0),
             "attention_input: a part of " << p.rows << " rows (all rows = kAllRows only as the single part)");
    FD_CHECK(p.rows == 0 || (p.k && p.v), "attention_input: part " << i << " has no place for k or v");
    FD_CHECK((p.q != nullptr) == (out[0].q != nullptr), "attention_input: q in some parts and not in others");
    rows += p.rows;
  }
  FD_CHECK(rows == T, "attention_input: " << rows << " rows in the parts for a slot of " << T);
  if (out.empty()) out.push_back({parts[0].q, parts[0].k, parts[0].v, 0});  // T = 0: one empty part
  return out;
}

}  // namespace fd
