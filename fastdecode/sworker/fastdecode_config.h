// The FastDecode engine's config: the experiment's "engine" section with type "fastdecode" (docs/EXPERIMENTS.md),
// FastDecodeConfig, and its R-workers, RWorkersConfig (the hybrid engine's CPU side takes the same section). Parsed
// and echoed in fastdecode_config.cpp; the engine itself is fastdecode_engine.h.
#pragma once
#include <string>
#include <vector>

#include "fastdecode/engine/engine.h"
#include "fastdecode/parallel/ranks.h"

namespace fd {

// R-workers of the FastDecode engine: spawned locally, or reached at endpoints started by the user.
struct RWorkersConfig {
  std::vector<std::string> endpoints;  // when set, use these and spawn nothing
  int64_t spawn = 2;                   // local fd-rworker processes otherwise
  int64_t threads = 1;                 // compute threads per spawned worker
  std::string kv_dtype = "fp16";       // fp16 | int8 | int4 (spawned workers)
  std::string query = "auto";          // auto | fp32 | int8: how their int8/int4 blocks take the query (fd-rworker --query)
  double memory_gb = 1.0;              // KV memory per spawned worker
  bool pin = false;                    // pin spawned worker i to CPUs [i*threads, (i+1)*threads)
  int64_t timeout_ms = 60000;          // per-step deadline of every R-worker reply
  std::string binary;                  // fd-rworker to spawn; default: next to the running program
  // A worker found gone (its connection dropped, heartbeats unanswered for heartbeat_timeout_ms, a reply past
  // timeout_ms): "recover" re-places its sequences on the survivors and rebuilds their KV by re-prefilling prompt +
  // tokens so far, then redoes the step (one S-rank only: with engine.parallel it fails as "fail" does); "fail"
  // ends the run naming it.
  std::string on_failure = "recover";
  int64_t heartbeat_ms = 500, heartbeat_timeout_ms = 3000;  // ZeroMQ heartbeats on every worker link (0: off)
  // Offer every worker a shared-memory region (kEngineShmBytes): those on this host take ATTEND and APPEND_KV through
  // it, the others (another host, fd-rworker --shm-max-mb 0) stay on ZeroMQ (docs/RWORKER.md).
  bool shm = true;
  // With shm: the S-Part writes each worker's q/k/v straight into its region (false: into staging memory, copied into
  // the region at each send; for A/B).
  bool shm_in_place = true;
  // > 0: every wait for replies polls this many microseconds before it blocks, and spawned workers get --spin-us of
  // the same (listed or registered ones: their own flag). With shm, a side that polls gets the other's messages through
  // the region's rings, skipping ZeroMQ (docs/RWORKER.md, "Rings"); each polling thread costs up to that much of a
  // core per idle spell. 0: block at once.
  int64_t spin_us = 0;
  // Prefill: a worker's K/V of a layer goes in APPEND_KVs of at most this many KiB (whole sequences; a longer prompt
  // alone), so the worker stores one while the next is on its way.
  int64_t append_chunk_kb = 8192;
  // CURVE (docs/SECURITY.md): the workers' public key file and this S-worker's secret key file (fd-keys).
  std::string curve_server_public, curve_client_secret;
  // Workers started by any launcher register here (fd-rworker --register ENDPOINT) and the engine waits for
  // `expect` of them (within register_timeout_ms) instead of spawning or listing.
  std::string register_endpoint;
  int64_t expect = 0;
  int64_t register_timeout_ms = 120000;
  // With engine.parallel: per R-worker group g (rank g's), overrides of the keys above (empty: every group as
  // above). A group either lists endpoints (workers started by the user) or spawns `spawn` workers; every group
  // has the same number of workers, since a sequence sits at the same worker index in every group.
  struct Group {
    std::vector<std::string> endpoints;
    int64_t threads = -1;      // -1: rworkers.threads
    std::string kv_dtype;      // "": rworkers.kv_dtype
    double memory_gb = -1;     // < 0: rworkers.memory_gb
    int pin = -1;              // -1: rworkers.pin; 0 | 1
    int64_t first_cpu = -1;    // pinned: the group's first core (-1: after the groups before it)
  };
  std::vector<Group> groups;
  // Group g's settings: these, overridden by groups[g] when there are groups (the result has none).
  RWorkersConfig group(size_t g) const;
  // The fd-rworker flags of a worker these settings spawn, named `name` (pinned: `threads` CPUs from first_cpu).
  // Every launcher of spawned workers uses this (the fastdecode and hybrid engines), so none drops a key.
  std::vector<std::string> spawn_args(const std::string& name, int64_t first_cpu) const;
  // The "rworkers" object of an engine section (ranks: the engine's S-ranks, for `groups`), and its echo.
  static RWorkersConfig parse(StrictObject& r, int64_t ranks);
  json to_json() const;
};

struct FastDecodeConfig {
  // S-Part backend: cpu | cuda | auto (cuda when a GPU answers, decided when the engine is made).
  std::string backend = "cpu";
  int64_t mini_batches = 2;   // 2 = the two mini-batch pipeline; 1 = no overlap
  std::string wire_dtype;     // q/k/v and attention output on the wire: fp32 | fp16; "" = fp16 with cuda, fp32 with cpu
  // cuda backend: 16-bit weights and activations (fp16 | bf16) and decode stages of at most 128 rows
  // replayed from CUDA graphs (one per stage between R-Part round trips and padded batch size)
  std::string dtype = "fp16";
  bool cuda_graphs = true;
  // Prompt tokens prefilled per step at most (whole prompts, at least one); the rest start later.
  int64_t prefill_tokens = 16384;
  RWorkersConfig rworkers;
  // The S-worker's own cores, set on every thread of the process once its R-workers are spawned (threads started
  // later inherit them): "" leaves the process as started; "rest" takes the CPUs this process may run on that the
  // pinned spawned workers (rworkers.pin) leave free; or a CPU list ("12-15").
  std::string sworker_cpus;
  // Tensor and pipeline parallelism (fastdecode/parallel/ranks.h, docs/PARALLEL.md): T x P S-ranks, threads of
  // the engine's process; rank (t, p) holds tensor part t of stage p's layers (fastdecode/model/shard.h) and has
  // its own group of R-workers (rworkers, overridden per group by rworkers.groups), which hold the KV of that
  // rank's heads and layers only. On the cuda backend rank g = p*T + t runs on GPU rank_devices(...)[g].
  ParallelConfig parallel;
  static FastDecodeConfig parse(StrictObject& o);  // the section's own keys (not type / threads)
  json to_json() const;
};

// Why `ep` cannot be an R-worker endpoint, or "" (tcp://HOST:PORT with a port 1..65535, ipc://PATH).
std::string endpoint_problem(const std::string& ep);

}  // namespace fd
