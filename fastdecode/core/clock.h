// Monotonic time in nanoseconds; the one clock engines and the harness share.
#pragma once
#include <chrono>
#include <cstdint>

namespace fd {

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace fd
