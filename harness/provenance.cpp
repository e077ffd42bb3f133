#include "harness/provenance.h"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <thread>

#include "kernels/cuda/device_info.h"

#ifndef FD_SOURCE_DIR
#define FD_SOURCE_DIR "."
#endif

namespace fd {

static std::string run_capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  std::array<char, 256> buf{};
  while (fgets(buf.data(), int(buf.size()), p)) out += buf.data();
  pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

std::string utc_timestamp(const char* fmt) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, fmt, &tm);
  return buf;
}

json collect_provenance(const std::string& command_line) {
  json p;
  const std::string git = "git -C '" + std::string(FD_SOURCE_DIR) + "' ";
  // FD_GIT_COMMIT names the commit of a tree copied to another machine; when set it wins over the
  // copy's own .git (which may be stale: the GPU machine's copy reported an older HEAD).
  const char* env_commit = std::getenv("FD_GIT_COMMIT");
  const bool from_env = env_commit && *env_commit;
  std::string commit = from_env ? std::string(env_commit) : run_capture(git + "rev-parse --verify -q HEAD 2>/dev/null");
  const bool from_git = !from_env && !commit.empty();
  p["git_commit_source"] = from_env ? "FD_GIT_COMMIT" : (from_git ? "git" : "none");
  p["git_commit"] = commit.empty() ? "unknown" : commit;
  if (from_git) p["git_dirty"] = !run_capture(git + "status --porcelain --untracked-files=no 2>/dev/null").empty();
  else p["git_dirty"] = nullptr;  // unknown without a repository
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  p["host"] = host;
  std::string cpu = "unknown";
  std::ifstream ci("/proc/cpuinfo");
  for (std::string line; std::getline(ci, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  p["cpu_model"] = cpu;
  p["cpu_cores"] = std::thread::hardware_concurrency();
  p["cuda_built"] = cuda_built();
  json gpus = json::array();
  for (const auto& d : cuda_devices())
    gpus.push_back({{"name", d.name}, {"sm_count", d.sm_count}, {"memory_gb", double(d.memory_bytes) / 1e9}});
  p["gpus"] = gpus;
  p["date_utc"] = utc_timestamp();
  p["command"] = command_line;
  return p;
}

}  // namespace fd
