#include "fastdecode/engine/engine.h"


namespace fd {

void validate_request(const Request& r, const ModelConfig& m) {
  if (r.prompt.empty()) FD_THROW("request " << r.id << ": empty prompt");
  if (r.max_new_tokens < 1) FD_THROW("request " << r.id << ": max_new_tokens must be >= 1");
  for (int32_t t : r.prompt)
    if (t < 0 || t >= m.vocab_size)
      FD_THROW("request " << r.id << ": token id " << t << " outside the vocabulary [0, " << m.vocab_size << ")");
  // The last generated token is never fed back, so the cache holds at most prompt + max_new - 1.
  const int64_t need = int64_t(r.prompt.size()) + r.max_new_tokens - 1;
  if (need > m.max_position_embeddings)
    FD_THROW("request " << r.id << ": prompt " << r.prompt.size() << " + " << r.max_new_tokens
                        << " new tokens needs " << need << " positions; model " << m.name << " has "
                        << m.max_position_embeddings);
}

}  // namespace fd
