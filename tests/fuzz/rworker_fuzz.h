// Message mutation for fuzzing the R-worker (shared by the GoogleTest fuzz test and the libFuzzer
// target): a corpus of valid requests, and mutations that break them in every way a peer could.
#pragma once
#include <random>
#include <vector>

#include "tests/unit/rworker_test_util.h"

namespace fd::fuzz {

using Corpus = std::vector<fd::test::RawMessage>;

// Valid requests over sequence ids 1..6 for the given shape (fp16 wire).
inline Corpus seed_corpus(int n_layers, int H, int K, int D) {
  using namespace fd::proto;
  using fd::test::bytes_of;
  using fd::test::make_message;
  const auto dims = [&](MsgType t, uint32_t n) { return make_header(t, H, K, D, WireDType::F16, n); };
  std::mt19937 rng(3);
  Corpus c;
  Header hello = dims(MsgType::Hello, 0);
  hello.layer = uint32_t(n_layers);
  c.push_back(make_message(hello, {}));
  for (uint64_t a = 1; a <= 6; a += 2) {
    const std::vector<uint64_t> ids = {a, a + 1};
    c.push_back(make_message(dims(MsgType::AddSeq, 2), {bytes_of(ids)}));
    c.push_back(make_message(dims(MsgType::FreeSeq, 2), {bytes_of(ids)}));
    for (int layer = 0; layer < n_layers; ++layer) {
      Header at = dims(MsgType::Attend, 2);
      at.layer = uint32_t(layer);
      c.push_back(make_message(at, {bytes_of(ids), bytes_of(fd::test::random_f16(size_t(2) * H * D, rng)),
                                    bytes_of(fd::test::random_f16(size_t(2) * K * D, rng)),
                                    bytes_of(fd::test::random_f16(size_t(2) * K * D, rng))}));
      Header ap = dims(MsgType::AppendKV, 2);
      ap.layer = uint32_t(layer);
      ap.n_tokens = 35;
      c.push_back(make_message(ap, {bytes_of(ids), bytes_of(std::vector<uint32_t>{3, 32}),
                                    bytes_of(fd::test::random_f16(size_t(35) * K * D, rng)),
                                    bytes_of(fd::test::random_f16(size_t(35) * K * D, rng))}));
    }
  }
  c.push_back(make_message(dims(MsgType::Stats, 0), {}));
  // Sessions (issue 16): cut back, end, try to stop the worker (a token it does not hold).
  c.push_back(make_message(dims(MsgType::Truncate, 2), {bytes_of(std::vector<uint64_t>{1, 2}), bytes_of(std::vector<uint32_t>{1, 3})}));
  c.push_back(make_message(dims(MsgType::Close, 0), {}));
  c.push_back(make_message(dims(MsgType::Shutdown, 0), {std::vector<uint8_t>(kShutdownTokenBytes, 7)}));
  return c;
}

// One mutated message: a corpus entry with 0-3 random mutations (about 1 in 8 left valid).
inline fd::test::RawMessage mutate(const Corpus& corpus, std::mt19937_64& rng) {
  fd::test::RawMessage m = corpus[rng() % corpus.size()];
  const int n_mut = int(rng() % 4) == 0 ? 0 : 1 + int(rng() % 3);
  for (int i = 0; i < n_mut; ++i) {
    auto& parts = m.parts;
    const auto pick_part = [&]() -> std::vector<uint8_t>& {
      if (parts.empty()) parts.emplace_back();
      return parts[rng() % parts.size()];
    };
    switch (rng() % 10) {
      case 0:  // flip a random bit anywhere
        if (auto& p = pick_part(); !p.empty()) p[rng() % p.size()] ^= uint8_t(1u << (rng() % 8));
        break;
      case 1:  // random byte in the header (the most sensitive part)
        if (!parts.empty() && !parts[0].empty()) parts[0][rng() % parts[0].size()] = uint8_t(rng());
        break;
      case 2:  // a header field set to an extreme value: n_seq/layer/n_tokens/heads/dims
        if (!parts.empty() && parts[0].size() >= 36) {
          static const size_t offsets[] = {16, 20, 24, 28, 30, 32};
          const size_t off = offsets[rng() % 6];
          const uint32_t vals[] = {0u, 1u, 7u, 0xffffu, 0x7fffffffu, 0xffffffffu, uint32_t(rng())};
          const uint32_t v = vals[rng() % 7];
          const size_t w = off >= 28 ? 2 : 4;
          std::memcpy(parts[0].data() + off, &v, w);
        }
        break;
      case 3:  // truncate a part
        if (auto& p = pick_part(); !p.empty()) p.resize(rng() % p.size());
        break;
      case 4: {  // extend a part
        auto& p = pick_part();
        p.resize(p.size() + 1 + rng() % 64, uint8_t(rng()));
        break;
      }
      case 5:  // drop a part
        if (!parts.empty()) parts.erase(parts.begin() + long(rng() % parts.size()));
        break;
      case 6:  // duplicate a part
        if (!parts.empty()) {
          const auto copy = parts[rng() % parts.size()];
          parts.insert(parts.begin() + long(rng() % parts.size()), copy);
        }
        break;
      case 7:  // swap two parts
        if (parts.size() >= 2) std::swap(parts[rng() % parts.size()], parts[rng() % parts.size()]);
        break;
      case 8:  // sequence ids replaced by random / repeated ones
        if (parts.size() >= 2 && parts[1].size() >= 16) {
          const uint64_t id = rng() % 3 == 0 ? rng() : 1 + rng() % 8;
          std::memcpy(parts[1].data() + 8 * (rng() % (parts[1].size() / 8)), &id, 8);
        }
        break;
      case 9:  // replace the whole message by random bytes in random frames
        parts.assign(1 + rng() % 5, {});
        for (auto& p : parts) {
          p.resize(rng() % 128);
          for (auto& b : p) b = uint8_t(rng());
        }
        break;
    }
  }
  return m;
}

// For libFuzzer: a message as raw input (each frame prefixed by its 16-bit length; frames longer than
// 65535 bytes are cut there), the inverse of split_frames.
inline std::vector<uint8_t> join_frames(const fd::test::RawMessage& m) {
  std::vector<uint8_t> out;
  for (const auto& p : m.parts) {
    const size_t len = std::min<size_t>(p.size(), 0xffff);
    out.push_back(uint8_t(len & 0xff));
    out.push_back(uint8_t(len >> 8));
    out.insert(out.end(), p.begin(), p.begin() + long(len));
  }
  return out;
}

// For libFuzzer: splits raw input into frames, each prefixed by a 16-bit length.
inline std::vector<proto::Frame> split_frames(const uint8_t* data, size_t n) {
  std::vector<proto::Frame> frames;
  size_t i = 0;
  while (i + 2 <= n && frames.size() < 16) {
    const size_t len = std::min<size_t>(size_t(data[i]) | size_t(data[i + 1]) << 8, n - i - 2);
    frames.push_back({data + i + 2, len});
    i += 2 + len;
  }
  return frames;
}

}  // namespace fd::fuzz
