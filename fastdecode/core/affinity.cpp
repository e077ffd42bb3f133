#include "fastdecode/core/affinity.h"

#include <dirent.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "fastdecode/core/error.h"

namespace fd {

std::vector<int> parse_cpu_list(const std::string& s, const std::string& what) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    const size_t dash = item.find('-');
    try {
      size_t used_a = 0, used_b = 0;
      const std::string sa = item.substr(0, dash), sb = dash == std::string::npos ? sa : item.substr(dash + 1);
      const int a = std::stoi(sa, &used_a), b = std::stoi(sb, &used_b);
      if (used_a != sa.size() || used_b != sb.size() || a < 0 || b < a || b >= CPU_SETSIZE)
        throw std::invalid_argument("range");
      for (int c = a; c <= b; ++c) out.push_back(c);
    } catch (const std::exception&) {
      throw ConfigError(what + ": '" + item + "' is not a CPU number or range (e.g. 0-7,16; CPUs 0-" +
                        std::to_string(CPU_SETSIZE - 1) + ")");
    }
  }
  if (out.empty()) throw ConfigError(what + ": no CPU in '" + s + "' (e.g. 0-7,16)");
  return out;
}

std::string cpu_list_string(std::vector<int> cpus) {
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) {
      out += '-';  // (one append each: GCC 12 warns falsely on "-" + std::string)
      out += std::to_string(cpus[j]);
    }
    i = j + 1;
  }
  return out;
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

void pin_all_threads(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  // A thread being started while the list is read may copy its starter's old mask: passes until one finds every
  // thread already moved.
  for (int pass = 0; pass < 100; ++pass) {
    DIR* dir = opendir("/proc/self/task");
    if (!dir) FD_THROW("pinning this process's threads to CPUs " << cpu_list_string(cpus) << ": /proc/self/task: "
                                                                 << std::strerror(errno));
    int moved = 0, failures = 0, err = 0;
    while (const dirent* e = readdir(dir)) {
      if (e->d_name[0] == '.') continue;
      const pid_t tid = pid_t(std::atoi(e->d_name));
      cpu_set_t now;
      CPU_ZERO(&now);
      if (sched_getaffinity(tid, sizeof now, &now) == 0 && CPU_EQUAL(&now, &set)) continue;
      // A thread that ended since the listing (ESRCH) needs no mask.
      if (sched_setaffinity(tid, sizeof set, &set) == 0) ++moved;
      else if (errno != ESRCH) ++failures, err = errno;
    }
    closedir(dir);
    if (failures)
      FD_THROW("could not pin " << failures << " thread(s) of this process to CPUs " << cpu_list_string(cpus) << ": "
                                << std::strerror(err));
    if (moved == 0) return;
  }
  FD_THROW("pinning this process's threads to CPUs " << cpu_list_string(cpus) << ": new threads kept appearing");
}

}  // namespace fd
