// The FastDecode engine's launch step (its constructor's second, fastdecode_engine.cpp): every R-worker group's
// workers, after everything was checked and before any S-rank, thread or communicator. Group g belongs to rank g and
// is registered (workers a launcher started announce themselves), listed (engine.rworkers.groups[g].endpoints, or
// engine.rworkers.endpoints with one rank) or spawned here, on emulated hosts with hardware.network.
#include <algorithm>
#include <cstdio>

#include "fastdecode/sworker/fastdecode_engine.h"
#include "fastdecode/wire/register.h"

namespace fd {

namespace {

// The workers per group the config asks for (spawned, listed or registered), to tell whether all are spawned.
size_t load_size_hint(const FastDecodeConfig& ec, const std::vector<std::vector<std::string>>& registered) {
  if (!registered.empty() && !registered[0].empty()) return registered[0].size();
  const RWorkersConfig r = ec.rworkers.group(0);
  return r.endpoints.empty() ? size_t(r.spawn) : r.endpoints.size();
}

}  // namespace

std::vector<std::vector<std::string>> FastDecodeEngine::launch_rworkers(Setup& s, const NetworkLink& link) {
  const size_t G = size_t(s.layout.G);
  std::vector<std::vector<std::string>> endpoints = registered_rworkers(G);
  spawned_of_.assign(G, {});
  emulate_hosts(link, endpoints, s.client);
  const std::string bin = ec_.rworkers.binary.empty() ? default_rworker_binary() : ec_.rworkers.binary;
  size_t next_host = 0;
  for (size_t g = 0; g < G; ++g) {
    const RWorkersConfig r = ec_.rworkers.group(g);
    if (!endpoints[g].empty()) {  // registered
      group_spawned_.push_back(false);
      spawned_of_[g].assign(endpoints[g].size(), nullptr);
      continue;
    }
    group_spawned_.push_back(r.endpoints.empty());
    if (!r.endpoints.empty()) {
      endpoints[g] = r.endpoints;
      spawned_of_[g].assign(r.endpoints.size(), nullptr);
      continue;
    }
    spawn_group(g, r, bin, s.first_cpus[g], next_host, endpoints[g]);
  }
  return endpoints;
}

std::vector<std::vector<std::string>> FastDecodeEngine::registered_rworkers(size_t G) const {
  std::vector<std::vector<std::string>> endpoints(G);
  const RWorkersConfig& rw = ec_.rworkers;
  if (rw.register_endpoint.empty()) return endpoints;
  Registrar reg(rw.register_endpoint);
  std::fprintf(stderr, "fastdecode engine: waiting for %lld R-worker(s) to register at %s\n", (long long)rw.expect,
               reg.endpoint().c_str());
  for (const Registration& r : reg.wait(size_t(rw.expect), int(rw.register_timeout_ms),
                                        [](size_t k, size_t n) { std::fprintf(stderr, "fastdecode engine: %zu of %zu R-workers registered\n", k, n); }))
    endpoints[0].push_back(r.endpoint);
  return endpoints;
}

// Multi-host emulation: every spawned worker on an emulated host of its own behind the named link.
void FastDecodeEngine::emulate_hosts(const NetworkLink& link, const std::vector<std::vector<std::string>>& registered,
                                     RWorkerClientOptions& client) {
  const size_t G = registered.size();
  size_t n_spawn = 0;
  for (size_t g = 0; g < G; ++g)
    if (registered[g].empty() && ec_.rworkers.group(g).endpoints.empty()) n_spawn += size_t(ec_.rworkers.group(g).spawn);
  if (link.emulated() && n_spawn > 0) {
    hosts_ = std::make_unique<EmulatedHosts>(n_spawn, link);
    notes_.push_back("hardware.network: " + hosts_->describe());
    // Workers on other hosts map no S-worker memory: the lane (the namespaces share /dev/shm) is off, so every tensor
    // crosses the shaped link.
    if (client.shm_bytes > 0)
      client.shm_bytes = 0, notes_.push_back("hardware.network: engine.rworkers.shm off: every tensor crosses the link");
  }
  if (link.emulated() && n_spawn < G * load_size_hint(ec_, registered))
    notes_.push_back("hardware.network applies to spawned R-workers only: listed or registered ones are reached as they are");
}

// Group g's r.spawn workers; pinned ones take r.threads cores each from first_cpu (disjoint: the emulated CPU count is
// exact). Each goes on the next emulated host, if any.
void FastDecodeEngine::spawn_group(size_t g, const RWorkersConfig& r, const std::string& bin, int64_t first_cpu,
                                   size_t& next_host, std::vector<std::string>& endpoints) {
  const size_t G = spawned_of_.size();
  spawned_of_[g].assign(size_t(r.spawn), nullptr);
  for (int64_t i = 0; i < r.spawn; ++i) {
    char name[48];  // rworker<i>, or g<g>w<i> with several groups (snprintf: GCC 12 warns falsely on "g" + to_string)
    if (G == 1) std::snprintf(name, sizeof name, "rworker%lld", (long long)i);
    else std::snprintf(name, sizeof name, "g%zuw%lld", g, (long long)i);
    const std::vector<std::string> args = r.spawn_args(name, first_cpu + i * r.threads);
    SpawnPlace where;
    if (hosts_) where.prefix = hosts_->exec_prefix(next_host), where.listen_host = hosts_->address(next_host), ++next_host;
    spawned_.push_back(std::make_unique<SpawnedRWorker>(bin, args, 20000, where));
    spawned_of_[g][size_t(i)] = spawned_.back().get();
    endpoints.push_back(spawned_.back()->endpoint());
  }
}

}  // namespace fd
