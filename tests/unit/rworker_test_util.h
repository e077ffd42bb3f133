// Helpers for R-worker tests: building requests and a double-precision reference attention.
#pragma once
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "fastdecode/core/dtype.h"
#include "fastdecode/wire/wire.h"

namespace fd::test {

// A request as owned byte buffers (header + frames), easy to mutate.
struct RawMessage {
  std::vector<std::vector<uint8_t>> parts;
  std::vector<proto::Frame> frames() const {
    std::vector<proto::Frame> f;
    for (const auto& p : parts) f.push_back({p.data(), p.size()});
    return f;
  }
};

inline RawMessage make_message(proto::Header h, std::vector<std::vector<uint8_t>> frames) {
  h.n_frames = uint8_t(frames.size());
  const auto head = proto::encode_header(h);
  RawMessage m;
  m.parts.emplace_back(head.begin(), head.end());
  for (auto& f : frames) m.parts.push_back(std::move(f));
  return m;
}

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Random fp16 values in [-a, a] (as bits).
inline std::vector<uint16_t> random_f16(size_t n, std::mt19937& rng, float a = 1.0f) {
  std::uniform_real_distribution<float> d(-a, a);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = fp32_to_fp16(d(rng));
  return v;
}

// o[h][:] = softmax(q[h]·K[:, kvh]·scale)·V[:, kvh] in double. k, v: [n_tok][n_kv][D] fp32 values.
inline std::vector<double> reference_attention(const std::vector<float>& q, const std::vector<float>& k,
                                               const std::vector<float>& v, int n_tok, int n_heads, int n_kv, int D) {
  std::vector<double> o(size_t(n_heads) * D, 0.0);
  const int g = n_heads / n_kv;
  for (int h = 0; h < n_heads; ++h) {
    const int kvh = h / g;
    std::vector<double> s(static_cast<size_t>(n_tok));
    double mx = -1e300;
    for (int t = 0; t < n_tok; ++t) {
      double dot = 0;
      for (int d = 0; d < D; ++d) dot += double(q[size_t(h) * D + d]) * k[(size_t(t) * n_kv + kvh) * D + d];
      s[size_t(t)] = dot / std::sqrt(double(D));
      mx = std::max(mx, s[size_t(t)]);
    }
    double sum = 0;
    for (auto& x : s) sum += (x = std::exp(x - mx));
    for (int t = 0; t < n_tok; ++t)
      for (int d = 0; d < D; ++d) o[size_t(h) * D + d] += s[size_t(t)] / sum * v[(size_t(t) * n_kv + kvh) * D + d];
  }
  return o;
}

}  // namespace fd::test
