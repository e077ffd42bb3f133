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
    // Configure it and add sequences 1..4 so mutated requests reach the deep paths.
    for (const auto& m : fd::fuzz::seed_corpus(2, 4, 2, 32)) {
      const auto f = m.frames();
      s->handle(f.data(), f.size());
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
      const auto bytes = fd::fuzz::join_frames(m);
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

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto frames = fd::fuzz::split_frames(data, size);
  auto reply = service().handle(frames.data(), frames.size());
  if (reply.empty() || reply[0].size() != fd::proto::kHeaderBytes) std::abort();
  return 0;
}
