// The CPU-ISA gate of the kernel tests. Every case that runs one ISA's code is its own GoogleTest case (the ISA is
// a parameter of the grid, "<isa>_<shape>" or ".../<isa>"), and one whose ISA this CPU lacks skips with the reason
// (GTEST_SKIP; ctest: "Skipped", one skip per case that did not run), never dropping out inside a passing case.
// FD_REQUIRE_ISA (a comma-separated list, e.g. "avx2,avx512", set by the GPU-machine scripts for its Xeon) makes a
// listed ISA's skip a failure, so a dispatch that stopped seeing AVX-512 there cannot pass unnoticed.
// FD_TEST_HIDE_ISA (the same form) makes the gate treat the listed ISAs as missing: it shows the skip path on a CPU
// that has them all (docs/CORRECTNESS.md, "Skips are visible").
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "kernels/cpu/decode_attention.h"

namespace fd::test {

inline bool isa_listed(const char* var, Isa isa) {
  const char* e = std::getenv(var);
  if (!e) return false;
  const std::string list = std::string(",") + e + ",";
  return list.find("," + std::string(isa_name(isa)) + ",") != std::string::npos;
}

inline bool isa_required(Isa isa) { return isa_listed("FD_REQUIRE_ISA", isa); }

// Empty when the kernels of `isa` run here, else why not.
inline std::string isa_missing(Isa isa) {
  const std::string name(isa_name(isa));
  if (isa_listed("FD_TEST_HIDE_ISA", isa)) return "ISA " + name + " hidden by FD_TEST_HIDE_ISA";
  if (fd::isa_supported(isa)) return "";
#if defined(FD_SCALAR_KERNELS_ONLY)
  return "ISA " + name + " not built (FD_CPU_SIMD_KERNELS=OFF: the scalar kernels only)";
#else
  return "ISA " + name + " not supported by this CPU";
#endif
}

}  // namespace fd::test

#define FD_SKIP_UNLESS_ISA(isa)                                                                              \
  do {                                                                                                       \
    const std::string fd_isa_missing_ = fd::test::isa_missing(isa);                                          \
    if (!fd_isa_missing_.empty()) {                                                                          \
      if (fd::test::isa_required(isa)) FAIL() << fd_isa_missing_ << ", but FD_REQUIRE_ISA lists it";        \
      GTEST_SKIP() << fd_isa_missing_;                                                                       \
    }                                                                                                        \
  } while (0)
