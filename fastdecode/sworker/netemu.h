// Multi-host emulation on one machine (hardware.network; docs/RELIABILITY.md): each spawned R-worker runs in a
// network namespace of its own ("another host"), reached from the S-worker's namespace over a veth pair whose two
// ends are shaped with tc: a token bucket (tbf) at the link's rate in each direction, or netem with the rate and a
// one-way delay when a delay is asked for. The workers then listen on their namespace's address and every byte
// between S-worker and R-worker crosses the shaped link, so a step's wire time is that of the named link.
//
// It needs root (CAP_NET_ADMIN), the `ip` and `tc` tools (Debian's iproute2) and the kernel's veth and tbf (netem for
// a delay). What is missing is named by unavailable_reason() and refused as a config error before any worker starts.
// The namespaces and links are removed when the EmulatedHosts goes.
#pragma once
#include <string>
#include <vector>

#include "fastdecode/engine/engine.h"

namespace fd {

class EmulatedHosts {
 public:
  // n hosts behind `link`. fd::ConfigError naming what this machine lacks.
  EmulatedHosts(size_t n, const NetworkLink& link);
  ~EmulatedHosts();
  EmulatedHosts(const EmulatedHosts&) = delete;
  EmulatedHosts& operator=(const EmulatedHosts&) = delete;

  size_t size() const { return names_.size(); }
  // The command prefix that runs a program on host i ({"ip", "netns", "exec", NAME}) and its address there.
  std::vector<std::string> exec_prefix(size_t i) const;
  std::string address(size_t i) const;
  std::string describe() const;  // "4 hosts behind 25gbe (25 Gbit/s each way, tbf)"

  // Why `link` cannot be emulated here ("" when it can): probed by making and removing one namespace and link.
  static std::string unavailable_reason(const NetworkLink& link);

 private:
  NetworkLink link_;
  std::vector<std::string> names_, host_ifs_;
  int base_ = 0;  // the hosts' addresses: 10.(64 + base_/256).(base_%256).(4i+1 | 4i+2)
};

}  // namespace fd
