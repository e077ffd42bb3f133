// Small helpers shared by the unit tests.
#pragma once
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>

#include "fastdecode/core/error.h"

namespace fd::test {

inline std::string repo_path(const std::string& rel) { return std::string(FD_SOURCE_DIR) + "/" + rel; }

// A fresh folder under the test temp dir, removed at scope exit.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    path = std::filesystem::path(::testing::TempDir()) /
           ("fd_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
  static int& counter() {
    static int c = 0;
    return c;
  }
};

// Runs f, expects an exception of type E, and returns its message.
template <typename E = fd::Error>
std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no exception thrown";
  return "";
}

// FD_REQUIRE_BINARIES set (scripts/test.sh sets it): a test whose tools scripts/setup.sh installs fails when
// they are missing instead of skipping.
inline bool binaries_required() {
  const char* e = std::getenv("FD_REQUIRE_BINARIES");
  return e != nullptr && *e != '\0' && std::string(e) != "0";
}

}  // namespace fd::test

// Skips the test with the reason when this build has no Gloo communicator (the caller includes
// fastdecode/parallel/comm.h), or fails it under FD_REQUIRE_BINARIES, so CI cannot pass without Gloo.
#define FD_REQUIRE_GLOO()                                                                                      \
  do {                                                                                                         \
    if (!fd::have_gloo()) {                                                                                    \
      if (fd::test::binaries_required())                                                                       \
        FAIL() << "this build has no Gloo communicator and FD_REQUIRE_BINARIES is set";                        \
      GTEST_SKIP() << "this build has no Gloo communicator (libgloo-dev not found at configure time)";        \
    }                                                                                                          \
  } while (0)
