// How a GPU test behaves when no CUDA device answers: it skips (visibly: ctest counts it "Skipped"),
// unless FD_REQUIRE_GPU is set to a non-empty value other than 0 — every GPU-machine script sets it —
// and then it fails, naming the CUDA error, so a broken driver on the GPU machine cannot give a green
// run. Use FD_SKIP_WITHOUT_GPU() at the top of a test body or a fixture's SetUp().
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "kernels/cuda/device_info.h"

namespace fd::test {

inline bool gpu_required() {
  const char* e = std::getenv("FD_REQUIRE_GPU");
  return e && *e && std::string(e) != "0";
}

}  // namespace fd::test

#define FD_SKIP_WITHOUT_GPU()                                                                          \
  do {                                                                                                 \
    const ::fd::CudaProbe fd_probe_ = ::fd::cuda_probe();                                              \
    if (fd_probe_.devices.empty()) {                                                                   \
      if (::fd::test::gpu_required())                                                                  \
        FAIL() << "no CUDA device answers (" << fd_probe_.error << ") and FD_REQUIRE_GPU is set";      \
      GTEST_SKIP() << "no CUDA device answers (" << fd_probe_.error << ")";                            \
    }                                                                                                  \
  } while (0)
