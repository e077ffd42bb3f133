// The CPU-ISA gate of the kernel tests: an ISA this CPU lacks skips its cases visibly (ctest: "Skipped");
// FD_REQUIRE_ISA (a comma-separated list, e.g. "avx2,avx512", set by the GPU-machine scripts for its Xeon) makes a
// listed ISA's skip a failure, so a dispatch that stopped seeing AVX-512 there cannot pass unnoticed.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "kernels/cpu/decode_attention.h"

namespace fd::test {

inline bool isa_required(Isa isa) {
  const char* e = std::getenv("FD_REQUIRE_ISA");
  if (!e) return false;
  const std::string list = std::string(",") + e + ",";
  return list.find("," + std::string(isa_name(isa)) + ",") != std::string::npos;
}

}  // namespace fd::test

#define FD_SKIP_UNLESS_ISA(isa)                                                                              \
  do {                                                                                                       \
    if (!fd::isa_supported(isa)) {                                                                           \
      if (fd::test::isa_required(isa)) FAIL() << "ISA " << fd::isa_name(isa) << " not supported here, but FD_REQUIRE_ISA lists it"; \
      GTEST_SKIP() << "ISA " << fd::isa_name(isa) << " not supported by this CPU";                           \
    }                                                                                                        \
  } while (0)
