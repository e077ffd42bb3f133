// libFuzzer target: raw bytes -> frames -> RWorkerService::handle (the decoder and every request
// handler). Build with scripts/fuzz.sh (clang -fsanitize=fuzzer,address,undefined).
#include <cstdlib>

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

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto frames = fd::fuzz::split_frames(data, size);
  auto reply = service().handle(frames.data(), frames.size());
  if (reply.empty() || reply[0].size() != fd::proto::kHeaderBytes) std::abort();
  return 0;
}
