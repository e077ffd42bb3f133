#include "fastdecode/sworker/netemu.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>

#include "fastdecode/core/error.h"

extern char** environ;

namespace fd {

namespace {

// Runs a command (searched in PATH), its stderr captured; returns its exit status (-1: could not start) and the text.
int run_cmd(const std::vector<std::string>& argv, std::string* err) {
  int pipefd[2];
  if (pipe(pipefd) != 0) return -1;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pipefd[1], 2);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", 01, 0);
  posix_spawn_file_actions_addclose(&fa, pipefd[0]);
  std::vector<std::string> a = argv;
  std::vector<char*> args;
  for (auto& s : a) args.push_back(s.data());
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(pipefd[1]);
  std::string text;
  if (rc == 0) {
    char buf[512];
    for (ssize_t n; (n = read(pipefd[0], buf, sizeof buf)) > 0;) text.append(buf, size_t(n));
  }
  close(pipefd[0]);
  if (rc != 0) {
    if (err) *err = "cannot run " + argv[0] + ": " + std::strerror(rc);
    return -1;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (err) *err = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

// The qdisc of one direction: tbf at the rate, or netem with the delay (and the rate, when given).
std::vector<std::string> qdisc(const NetworkLink& l) {
  char rate[32], burst[32], delay[32];
  std::snprintf(rate, sizeof rate, "%.6gmbit", l.rate_gbit * 1000);
  // A burst of 1 ms at the rate (at least 64 KiB): tbf needs rate / HZ at least.
  std::snprintf(burst, sizeof burst, "%lldb", (long long)std::max(65536.0, l.rate_gbit * 1e9 / 8 / 1000));
  std::snprintf(delay, sizeof delay, "%.6gms", l.delay_ms);
  if (l.delay_ms > 0) {
    std::vector<std::string> q = {"netem", "delay", delay, "limit", "100000"};
    if (l.rate_gbit > 0) q.insert(q.end(), {"rate", rate});
    return q;
  }
  return {"tbf", "rate", rate, "burst", burst, "latency", "100ms"};
}

}  // namespace

std::string EmulatedHosts::unavailable_reason(const NetworkLink& link) {
  if (geteuid() != 0) return "hardware.network needs root (CAP_NET_ADMIN) to make network namespaces and veth links";
  std::string err;
  if (run_cmd({"ip", "-V"}, &err) != 0) return "hardware.network needs the `ip` tool (Debian's iproute2): " + err;
  if (run_cmd({"tc", "-V"}, &err) != 0) return "hardware.network needs the `tc` tool (Debian's iproute2): " + err;
  try {
    EmulatedHosts probe(1, link);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

EmulatedHosts::EmulatedHosts(size_t n, const NetworkLink& link) : link_(link) {
  base_ = int(getpid() % 16384);
  const auto must = [&](const std::vector<std::string>& cmd, const std::string& what) {
    std::string err;
    if (run_cmd(cmd, &err) != 0) {
      for (const auto& ns : names_) run_cmd({"ip", "netns", "del", ns}, nullptr);
      names_.clear();
      throw ConfigError("hardware.network: " + what + " failed (`" + joined(cmd) + "`: " + (err.empty() ? "no message" : err) +
                        "); this machine cannot emulate R-worker hosts (root, iproute2, the kernel's veth and " +
                        (link_.delay_ms > 0 ? "netem" : "tbf") + " are needed)");
    }
  };
  if (n > 63) throw ConfigError("hardware.network: at most 63 emulated R-worker hosts, " + std::to_string(n) + " asked for");
  for (size_t i = 0; i < n; ++i) {
    const std::string id = std::to_string(getpid()) + "h" + std::to_string(i);
    const std::string ns = "fd" + id, vh = "fdv" + std::to_string(base_) + "a" + std::to_string(i),
                      vn = "fdv" + std::to_string(base_) + "b" + std::to_string(i);
    must({"ip", "netns", "add", ns}, "making network namespace " + ns);
    names_.push_back(ns);
    must({"ip", "link", "add", vh, "type", "veth", "peer", "name", vn}, "making a veth link");
    host_ifs_.push_back(vh);
    must({"ip", "link", "set", vn, "netns", ns}, "moving the link into " + ns);
    const std::string host_ip = "10." + std::to_string(64 + base_ / 256) + "." + std::to_string(base_ % 256) + "." +
                                std::to_string(4 * i + 1);
    must({"ip", "addr", "add", host_ip + "/30", "dev", vh}, "addressing the S-worker's end");
    must({"ip", "link", "set", vh, "up"}, "bringing the S-worker's end up");
    must({"ip", "netns", "exec", ns, "ip", "addr", "add", address(i) + "/30", "dev", vn}, "addressing the worker's end");
    must({"ip", "netns", "exec", ns, "ip", "link", "set", vn, "up"}, "bringing the worker's end up");
    must({"ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"}, "bringing the host's loopback up");
    if (link_.emulated()) {
      std::vector<std::string> out = {"tc", "qdisc", "add", "dev", vh, "root"}, in = {"ip", "netns", "exec", ns, "tc",
                                                                                   "qdisc", "add", "dev", vn, "root"};
      for (const auto& q : qdisc(link_)) out.push_back(q), in.push_back(q);
      must(out, "shaping the S-worker -> R-worker direction");
      must(in, "shaping the R-worker -> S-worker direction");
    }
  }
}

EmulatedHosts::~EmulatedHosts() {
  for (const auto& ns : names_) run_cmd({"ip", "netns", "del", ns}, nullptr);  // takes its end of the veth, and so both
}

std::vector<std::string> EmulatedHosts::exec_prefix(size_t i) const { return {"ip", "netns", "exec", names_.at(i)}; }

std::string EmulatedHosts::address(size_t i) const {
  return "10." + std::to_string(64 + base_ / 256) + "." + std::to_string(base_ % 256) + "." + std::to_string(4 * i + 2);
}

std::string EmulatedHosts::describe() const {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%zu R-worker host(s) in network namespaces behind %s (%.6g Gbit/s each way%s, %s)",
                names_.size(), link_.name.c_str(), link_.rate_gbit, link_.delay_ms > 0 ? (", " + std::to_string(link_.delay_ms) + " ms one way").c_str() : "",
                link_.delay_ms > 0 ? "tc netem" : "tc tbf");
  return buf;
}

}  // namespace fd
