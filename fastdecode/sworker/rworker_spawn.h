// Local R-worker processes started by the engine (or tests): fd-rworker with --print-endpoint on an
// ephemeral loopback port; killed on destruction if still running. Each gets a random shutdown token through its
// environment (FD_RWORKER_SHUTDOWN_TOKEN): only a client holding token() can stop it with SHUTDOWN.
#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

namespace fd {

// Where a spawned worker runs: `prefix` before its command line (e.g. {"ip", "netns", "exec", NS}: another emulated
// host, fastdecode/sworker/netemu.h) and the address it listens on.
struct SpawnPlace {
  std::vector<std::string> prefix;
  std::string listen_host = "127.0.0.1";
};

class SpawnedRWorker {
 public:
  // Starts `binary` with `args` plus `--listen tcp://HOST:* --print-endpoint` and waits (up to
  // timeout_ms) for the endpoint it prints. Throws fd::Error if it cannot start or exits first.
  SpawnedRWorker(const std::string& binary, const std::vector<std::string>& args, int timeout_ms = 20000,
                 const SpawnPlace& where = {});
  ~SpawnedRWorker();
  SpawnedRWorker(const SpawnedRWorker&) = delete;
  SpawnedRWorker& operator=(const SpawnedRWorker&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& endpoint() const { return endpoint_; }
  const std::string& token() const { return token_; }  // kShutdownTokenBytes random bytes
  // Waits for the process to exit (after a SHUTDOWN) up to timeout_ms; returns its exit status, or -1
  // if it had to be killed.
  int wait_exit(int timeout_ms = 10000);

 private:
  pid_t pid_ = -1;
  std::string endpoint_, token_;
};

// The fd-rworker next to the running program (same bin/ folder).
std::string default_rworker_binary();

}  // namespace fd
