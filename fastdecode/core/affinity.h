// CPU affinity: CPU lists as Linux writes them ("0-3,8,10-11"), the CPUs this process may run on, and pinning every
// thread of the process at once (the S-worker's cores, engine.sworker_cpus; fd-rworker --cpus parses its list here).
#pragma once
#include <string>
#include <vector>

namespace fd {

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}, in the order written. A bad item is a ConfigError naming `what` and the item.
std::vector<int> parse_cpu_list(const std::string& s, const std::string& what);
// The list back in the short form ({0,1,2,3,8} -> "0-3,8"; sorted, duplicates dropped).
std::string cpu_list_string(std::vector<int> cpus);
// The CPUs the calling thread may run on (sched_getaffinity), ascending; empty when it cannot be read.
std::vector<int> allowed_cpus();
// Every thread of this process (each entry of /proc/self/task) is allowed exactly `cpus`; threads started later
// inherit the mask of the thread that starts them. Throws fd::Error naming the CPUs when a thread cannot be moved.
void pin_all_threads(const std::vector<int>& cpus);

}  // namespace fd
