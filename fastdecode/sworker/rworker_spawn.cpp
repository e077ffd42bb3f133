#include "fastdecode/sworker/rworker_spawn.h"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "fastdecode/core/clock.h"
#include "fastdecode/core/error.h"
#include "fastdecode/wire/wire.h"

extern char** environ;

namespace fd {

std::string default_rworker_binary() {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("fd-rworker") : (self.parent_path() / "fd-rworker").string();
}

namespace {

// kShutdownTokenBytes from the kernel's random source.
std::string random_token() {
  std::string t(proto::kShutdownTokenBytes, '\0');
  std::ifstream r("/dev/urandom", std::ios::binary);
  if (!r.read(t.data(), std::streamsize(t.size()))) FD_THROW("cannot read /dev/urandom for an R-worker's shutdown token");
  return t;
}

}  // namespace

SpawnedRWorker::SpawnedRWorker(const std::string& binary, const std::vector<std::string>& args, int timeout_ms,
                               const SpawnPlace& where)
    : token_(random_token()) {
  if (access(binary.c_str(), X_OK) != 0)
    throw ConfigError("R-worker program not found or not executable: " + binary +
                      " (build fd-rworker, or set engine.rworkers.binary)");
  int out[2];
  if (pipe(out) != 0) FD_THROW("pipe() failed");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  std::vector<std::string> all = where.prefix;
  all.push_back(binary);
  all.insert(all.end(), args.begin(), args.end());
  all.insert(all.end(), {"--listen", "tcp://" + where.listen_host + ":*", "--print-endpoint"});
  all.insert(all.end(), {"--parent-pid", std::to_string(long(getpid()))});  // it exits when we die (no orphans)
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The environment, with the shutdown token (hex) in place of any inherited one.
  static const char hex[] = "0123456789abcdef";
  std::string tok = "FD_RWORKER_SHUTDOWN_TOKEN=";
  for (unsigned char c : token_) tok += hex[c >> 4], tok += hex[c & 15];
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e)
    if (std::string(*e).rfind("FD_RWORKER_SHUTDOWN_TOKEN=", 0) != 0) envp.push_back(*e);
  envp.push_back(tok.data());
  envp.push_back(nullptr);
  // With a prefix the first word is a tool found in PATH (ip); it execs the worker in place (the same pid).
  const int rc = where.prefix.empty() ? posix_spawn(&pid_, binary.c_str(), &fa, nullptr, argv.data(), envp.data())
                                      : posix_spawnp(&pid_, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  close(out[1]);
  if (rc != 0) {
    close(out[0]);
    FD_THROW("cannot start " << binary << ": error " << rc);
  }
  // Read the endpoint line with a deadline; the child may also die first (bad arguments).
  std::string line;
  const int64_t deadline = now_ns() + int64_t(timeout_ms) * 1'000'000;
  while (line.find('\n') == std::string::npos) {
    const int64_t left = (deadline - now_ns()) / 1'000'000;
    pollfd p{out[0], POLLIN, 0};
    if (left <= 0 || poll(&p, 1, int(std::min<int64_t>(left, 200))) < 0) break;
    if (p.revents & (POLLIN | POLLHUP)) {
      char buf[256];
      const ssize_t n = read(out[0], buf, sizeof buf);
      if (n <= 0) break;
      line.append(buf, size_t(n));
    }
  }
  close(out[0]);
  if (line.find('\n') == std::string::npos) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    std::string cmd = binary;
    for (const auto& a : args) cmd += " " + a;
    const std::string how = WIFEXITED(status)     ? "exited with status " + std::to_string(WEXITSTATUS(status))
                            : WIFSIGNALED(status) ? "was stopped by signal " + std::to_string(WTERMSIG(status))
                                                  : "did not exit";
    FD_THROW("R-worker `" << cmd << "` " << how << " without reporting an endpoint (waited up to " << timeout_ms
                          << " ms); see its messages above");
  }
  endpoint_ = line.substr(0, line.find('\n'));
}

int SpawnedRWorker::wait_exit(int timeout_ms) {
  if (pid_ <= 0) return -1;
  int status = 0;
  const int64_t deadline = now_ns() + int64_t(timeout_ms) * 1'000'000;
  while (now_ns() < deadline) {
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return -1;
}

SpawnedRWorker::~SpawnedRWorker() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

}  // namespace fd
