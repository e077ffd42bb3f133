// libFuzzer target: raw bytes -> frames -> RWorkerService::handle (the decoder and every request
// handler). Built with clang -fsanitize=fuzzer,address,undefined by the main build when clang is found
// (ctest runs it for a bounded time: test fuzz_rworker_bounded) and by scripts/fuzz.sh.
// With FD_FUZZ_SEED_CORPUS=DIR set, it first writes the valid requests of seed_corpus() into DIR (one
// file each, in split_frames' format), so a run given DIR as its corpus starts from real requests.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fastdecode/rworker/service.h"
#include "tests/fuzz/rworker_fuzz.h"

namespace {

fd::RWorkerService& service() {
  static fd::RWorkerService* svc = [] {
    fd::RWorkerConfig cfg;
    cfg.memory_limit_bytes = size_t(64) << 20;
    cfg.threads = 1;
    cfg.isa = fd::best_isa();
    auto* s = new fd::RWorkerService(cfg);
    // Configure two clients' sessions and add sequences 1..4 so mutated requests reach the deep paths (a seed
    // CLOSE ends each again: the corpus' HELLO reopens them).
    for (const char* peer : {"", "a"})
      for (const auto& m : fd::fuzz::seed_corpus(2, 4, 2, 32)) {
        if (m.parts.size() > 0 && m.parts[0].size() >= 8 && m.parts[0][6] == uint8_t(fd::proto::MsgType::Close)) continue;
        const auto f = m.frames();
        s->handle(peer, f.data(), f.size());
      }
    return s;
  }();
  return *svc;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("FD_FUZZ_SEED_CORPUS")) {
    int i = 0;
    for (const auto& m : fd::fuzz::seed_corpus(2, 4, 2, 32)) {
      auto bytes = fd::fuzz::join_frames(m);
      bytes.insert(bytes.begin(), uint8_t(i % 3));  // the client byte (LLVMFuzzerTestOneInput)
      const std::string path = std::string(dir) + "/seed-" + std::to_string(i++);
      if (FILE* f = std::fopen(path.c_str(), "wb")) {
        std::fwrite(bytes.data(), 1, bytes.size(), f);
        std::fclose(f);
      } else {
        std::fprintf(stderr, "fuzz_rworker: cannot write %s\n", path.c_str());
        std::abort();
      }
    }
  }
  return 0;
}

// The first byte picks the client (session) the message comes from, and with its high bit set ends that
// client's session after the message (its connection gone); the rest is the message.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const std::string peers[4] = {"", "a", "b", "c"};
  const std::string& peer = peers[data[0] & 3];
  const auto frames = fd::fuzz::split_frames(data + 1, size - 1);
  auto reply = service().handle(peer, frames.data(), frames.size());
  if (reply.empty() || reply[0].size() != fd::proto::kHeaderBytes) std::abort();
  if (data[0] & 0x80) service().end_session(peer);
  return 0;
}
