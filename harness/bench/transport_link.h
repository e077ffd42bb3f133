// The S side of fd-transport-bench: one case (transport, I/O threads, links, request size), its echo
// R-workers (`fd-transport-bench serve`, separate processes started by fd::SpawnedRWorker) and the real
// S-side client (fd::RWorkerClient) sending them real ATTEND requests (proto::make_header), one step at
// a time the way the FastDecode engine does per layer and mini-batch.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fastdecode/sworker/rworker_spawn.h"
#include "fastdecode/wire/rworker_client.h"

namespace fd::bench {

// The model shape of the ATTEND requests.
struct WireShape {
  int heads = 32, kv_heads = 32, head_dim = 128;
  proto::WireDType dtype = proto::WireDType::F16;
  size_t elem() const { return proto::wire_dtype_size(dtype); }
};

// Per link per step: ATTEND [header][ids u64[n_seq]][q][k][v] -> ATTEND_REPLY [header][o], q and o
// [n_seq, heads, head_dim], k and v [n_seq, kv_heads, head_dim].
struct TransportCase {
  // tcp | ipc | shm (ipc plus the shared-memory lane: RWorkerClientOptions::shm_bytes; the client copies each request's
  // tensors into the region) | shm-inplace (the lane, each link's request written once into a block of its region,
  // RWorkerClient::shm_alloc, and sent from there as it lies: the FastDecode S-rank's way, its S-Part copying q/k/v
  // down into the block)
  std::string transport;
  int io_threads = 1;     // zmq I/O threads of the client and of each echo server
  int links = 1;          // echo R-workers, each sent its request at once
  uint64_t size = 0;      // nominal request bytes per link (S)
  WireShape shape;
  uint32_t n_seq = 0;  // sequences per request: the most that fit in S, at least one
  int spin_us = 0;     // the client's waits and the echo servers' loops poll without sleeping this long (0: block)

  static constexpr int kRequestFrames = 5, kReplyFrames = 2;  // header included
  size_t seq_request_bytes() const;                           // 8 + (heads + 2 kv_heads) head_dim elem
  size_t request_bytes() const;                               // per link, header included
  size_t reply_bytes() const;                                 // per link, header included
  size_t bytes_per_step() const { return size_t(links) * (request_bytes() + reply_bytes()); }
  std::string name() const;  // "tcp/io:1/links:2/size:1M" (+ "/spin:50" when spin_us > 0)
};

// A case of `size` bytes per link (sizes as parse_size takes them). ConfigError when S cannot hold a
// single sequence's request.
TransportCase make_case(const std::string& transport, int io_threads, int links, uint64_t size, const WireShape& shape);

// This program's path (/proc/self/exe), to start its own subcommands as peers; fd::Error when it cannot be read.
std::string self_binary();

// "64K" -> 65536 (K, M, G binary; an optional B/iB); ConfigError for anything else or 0.
uint64_t parse_size(const std::string& s);
// 65536 -> "64K" (the largest binary unit that divides it).
std::string size_label(uint64_t bytes);

struct LinkOptions {
  int timeout_ms = 10000;  // a step's deadline (RWorkerClient::wait)
  int fail_after = 0;      // testing: each echo server exits with status 3 after this many ATTENDs
  std::string ipc_dir;     // where ipc cases bind (make_ipc_dir)
  int index = 0;           // the case's number, in its ipc file names
};

// c.links echo servers and the client connected to them; step() sends one ATTEND to every link and
// waits for every reply.
class LinkSet {
 public:
  LinkSet(const TransportCase& c, const LinkOptions& o);
  ~LinkSet();  // kills the servers still running
  LinkSet(const LinkSet&) = delete;
  LinkSet& operator=(const LinkSet&) = delete;

  // One step; its round trip in seconds (first send to last reply). Throws fd::Error on a missed
  // deadline (naming each late link and, for a server process that is gone, how it ended), an ERROR
  // reply, or a reply that does not match the request.
  double step();
  // SHUTDOWN to every server, then waits for them to exit. Best effort: problems go to stderr.
  void close();
  // The shared-memory lanes' counts summed over the links (all zero off the lane): how many requests and replies went
  // through the region, and of those through its rings (with spin_us).
  ShmLaneStats lane_totals() const;

 private:
  std::string why_silent() const;      // " [echo R-worker w (pid) exited ...]", waiting briefly for a dying one
  std::string exited_workers() const;  // the workers that have ended, now

  TransportCase c_;
  LinkOptions o_;
  std::vector<std::unique_ptr<SpawnedRWorker>> servers_;
  std::vector<ShmBlock> blocks_;  // shm-inplace: each link's request in its region
  std::vector<std::string> ipc_paths_;
  std::unique_ptr<RWorkerClient> client_;
  proto::Header header_;
  std::vector<std::unique_ptr<uint8_t, void (*)(void*)>> staging_;  // per link: ids | q | k | v
  std::vector<std::vector<ConstBuffer>> frames_;                    // per link, into staging_
  std::vector<std::pair<size_t, uint64_t>> requests_;
};

// A fresh directory for ipc socket files (under $TMPDIR or /tmp, short enough for sun_path), removed,
// with any socket file left in it, by remove_ipc_dir() and by SIGINT/SIGTERM.
std::string make_ipc_dir();
void remove_ipc_dir();

}  // namespace fd::bench
