// The splitmix64 finaliser: the project's portable PRNG primitive (weights, arrivals, sampling draws). Inline
// and host-device so the GPU sampler draws exactly the host sampler's numbers.
#pragma once
#include <cstdint>

#include "fastdecode/core/host_device.h"

namespace fd {

FD_HOST_DEVICE constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace fd
