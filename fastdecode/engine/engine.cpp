#include "fastdecode/engine/engine.h"


namespace fd {

void validate_request(const Request& r, const ModelConfig& m) {
  if (r.prompt.empty()) FD_THROW("request " << r.id << ": empty prompt");
  if (r.max_new_tokens < 1) FD_THROW("request " << r.id << ": max_new_tokens must be >= 1");
  for (int32_t t : r.prompt)
    if (t < 0 || t >= m.vocab_size)
      FD_THROW("request " << r.id << ": token id " << t << " outside the vocabulary [0, " << m.vocab_size << ")");
  if (!r.forced.empty()) {
    if (int64_t(r.forced.size()) != r.max_new_tokens)
      FD_THROW("request " << r.id << ": " << r.forced.size() << " forced tokens but max_new_tokens " << r.max_new_tokens
                          << " (teacher forcing scores exactly the forced continuation)");
    if (r.stop_at_eos) FD_THROW("request " << r.id << ": a forced (scored) request cannot stop at EOS");
    for (int32_t t : r.forced)
      if (t < 0 || t >= m.vocab_size)
        FD_THROW("request " << r.id << ": forced token id " << t << " outside the vocabulary [0, " << m.vocab_size
                            << ")");
  }
  if (r.sampling && (r.sampling->temperature < 0 || r.sampling->top_k < 0 || !(r.sampling->top_p > 0) ||
                     r.sampling->top_p > 1))
    FD_THROW("request " << r.id << ": sampling needs temperature >= 0, top_k >= 0, 0 < top_p <= 1");
  // The last generated token is never fed back, so the cache holds at most prompt + max_new - 1.
  const int64_t need = int64_t(r.prompt.size()) + r.max_new_tokens - 1;
  if (need > m.position_limit())
    FD_THROW("request " << r.id << ": prompt " << r.prompt.size() << " + " << r.max_new_tokens
                        << " new tokens needs " << need << " positions; model " << m.name << " has "
                        << m.position_limit() << " ("
                        << (m.position_limit_why.empty() ? "max_position_embeddings" : m.position_limit_why) << ")");
}

}  // namespace fd
