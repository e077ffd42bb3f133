// fd-transport-bench: the S-worker <-> R-worker ZeroMQ link, used the way the FastDecode engine uses it,
// on Google Benchmark (bench_main.h), with the real protocol and client.
//
// One step = per layer per mini-batch: the S side sends each of N links ONE real ATTEND request
// (proto::make_header; [64-byte header][ids][q][k][v], ~S bytes, the most sequences of the model shape
// that fit) with the real S-side client (fd::RWorkerClient::send, zero-copy from staging buffers reused
// every step) and waits for all N ATTEND_REPLYs ([header][o], o the size of q) with
// RWorkerClient::wait. Each link's R-worker is an echo R-worker (`fd-transport-bench serve`,
// transport_echo.h): a process of its own, started by fd::SpawnedRWorker, that validates every request
// with proto::decode and answers without computing attention, so the step is the link alone (before
// timing, each must reject a malformed ATTEND with the decoder's message: transport_link.cpp).
//
// Benchmarks, for each (transport, I/O threads, links, size), registered and run one after the other:
//   memcpy_ceiling/T/io:I/links:N/size:S   single-thread memcpy of bytes_per_step (the copy ceiling
//                                          of one core; TCP/IPC loopback copy each byte at least twice)
//   round_trip/T/io:I/links:N/size:S       one step per iteration (manual time: first send -> last reply)
// Counters (round_trip), from the median (fd::percentile) of the reported run's steps:
//   bytes_per_step = links * (request_bytes + reply_bytes)   (headers included)
//   bytes_per_second = bytes_per_step / rtt median;  GBps_per_link = bytes_per_second / links / 1e9
//   ratio_to_ceiling = memcpy_ceiling seconds_median / rtt median (= bytes_per_second / memcpy's)
//   rtt_{median,p90,min,mean,max}_us; meets_target = GBps_per_link >= 4 (the per-link target)
//   floor/zmq-ipc, floor/futex-shm (--floors)  two processes handing 64 bytes back and forth, by a ZeroMQ
//                                          DEALER/ROUTER echo over ipc and by a futex doorbell in a shared page: the
//                                          floors under a tiny ATTEND's round trip on the lane (transport_floor.h);
//                                          counters rtt_{median,p90,min}_us
// Google Benchmark picks the iteration count (--time is each benchmark's MinTime); its real_time is the
// mean step time. The echo servers of a case live across Google Benchmark's calls of its round_trip
// (warmed up once) and are shut down when the next case starts.
#include <zmq.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fastdecode/core/clock.h"
#include "fastdecode/core/json_util.h"
#include "fastdecode/core/stats.h"
#include "harness/bench/bench_main.h"
#include "harness/bench/transport_echo.h"
#include "harness/bench/transport_floor.h"
#include "harness/bench/transport_link.h"

namespace {

using fd::bench::LinkSet;
using fd::bench::TransportCase;

constexpr double kTargetPerLinkGBs = 4.0;  // the S-worker transfer target, per R-worker link, loopback

struct Options {
  std::vector<std::string> sizes{"64K", "256K", "1M", "4M", "16M", "32M"};
  std::vector<std::string> transports{"tcp", "ipc"};
  std::vector<int> io_threads{1, 4};
  std::vector<int> spin_us{0};
  std::vector<int> links{1, 2, 4};
  fd::bench::WireShape shape;
  std::string wire_dtype = "fp16";
  double time_s = 0.3, warmup_s = 0.05;
  int warmup_reps = 3;
  int timeout_ms = 10000;
  int fail_server_after = 0;
  bool quick = false;
  bool floors = false;
};

// The case whose servers are up, kept across Google Benchmark's calls of its round_trip.
struct Current {
  std::string name;
  std::unique_ptr<LinkSet> links;
  int warmup_steps = 0;
  void close() {
    if (links) links->close();
    links.reset();
    name.clear();
  }
};

// The floor link whose peer is up (--floors), kept across Google Benchmark's calls of its benchmark.
struct CurrentFloor {
  std::unique_ptr<fd::bench::FloorLink> link;
  int mode = -1;
  void close() {
    link.reset();
    mode = -1;
  }
};
Options g_opt;
CurrentFloor g_floor;
std::string g_ipc_dir;
Current g_cur;
fd::bench::Ceilings g_ceilings;

// Page-aligned, touched copy buffers, kept at the largest size asked for so far.
struct CopyBuffers {
  std::vector<uint8_t> a, b;
  void ensure(size_t n) {
    if (a.size() < n) a.assign(n, 1), b.assign(n, 2);
  }
} g_copy;

void memcpy_ceiling(benchmark::State& st, const TransportCase& c) {
  if (g_cur.name != c.name()) g_cur.close();  // the previous case's servers are not running beside it
  g_floor.close();
  const size_t bytes = c.bytes_per_step();
  g_copy.ensure(bytes);
  uint8_t *src = g_copy.a.data(), *dst = g_copy.b.data();
  std::vector<double> ts;
  for (auto _ : st) {
    const int64_t t0 = fd::now_ns();
    std::memcpy(dst, src, bytes);
    benchmark::ClobberMemory();
    ts.push_back(double(fd::now_ns() - t0) * 1e-9);
    st.SetIterationTime(ts.back());
    std::swap(src, dst);
  }
  const double t = fd::median(ts);
  g_ceilings.set(c.name(), t);
  st.counters["bytes_per_step"] = double(bytes);
  st.counters["seconds_median"] = t;
  st.counters["bytes_per_second"] = double(bytes) / t;
}

void round_trip(benchmark::State& st, const TransportCase& c, int index) {
  if (g_cur.name != c.name()) {
    g_cur.close();
    fd::bench::LinkOptions lo;
    lo.timeout_ms = g_opt.timeout_ms, lo.fail_after = g_opt.fail_server_after, lo.ipc_dir = g_ipc_dir, lo.index = index;
    g_cur.name = c.name();
    g_cur.links = std::make_unique<LinkSet>(c, lo);
    g_cur.warmup_steps = 0;
    const int64_t w0 = fd::now_ns();
    while (g_cur.warmup_steps < g_opt.warmup_reps || double(fd::now_ns() - w0) * 1e-9 < g_opt.warmup_s) {
      g_cur.links->step();
      ++g_cur.warmup_steps;
    }
  }
  std::vector<double> ts;
  for (auto _ : st) {
    ts.push_back(g_cur.links->step());
    st.SetIterationTime(ts.back());
  }
  const double med = fd::percentile(ts, 50), bytes = double(c.bytes_per_step()), bps = bytes / med;
  double sum = 0;
  for (double t : ts) sum += t;
  auto& k = st.counters;
  k["links"] = c.links;
  k["io_threads"] = c.io_threads;
  k["spin_us"] = c.spin_us;
  k["size_bytes"] = double(c.size);
  k["n_seq"] = c.n_seq;
  k["request_bytes"] = double(c.request_bytes());
  k["reply_bytes"] = double(c.reply_bytes());
  k["request_frames"] = TransportCase::kRequestFrames;
  k["reply_frames"] = TransportCase::kReplyFrames;
  k["bytes_per_step"] = bytes;
  k["warmup_steps"] = g_cur.warmup_steps;
  k["rtt_median_us"] = med * 1e6;
  k["rtt_p90_us"] = fd::percentile(ts, 90) * 1e6;
  k["rtt_min_us"] = *std::min_element(ts.begin(), ts.end()) * 1e6;
  k["rtt_mean_us"] = sum / double(ts.size()) * 1e6;
  k["rtt_max_us"] = *std::max_element(ts.begin(), ts.end()) * 1e6;
  // Through the region's rings (the worker, then the client, polling: spin_us), of all through the region, warm-up
  // included: what the spin bought, next to its round trips.
  if (const fd::ShmLaneStats lt = g_cur.links->lane_totals(); lt.requests_shm > 0) {
    k["ring_request_share"] = double(lt.requests_ring) / double(lt.requests_shm);
    k["ring_reply_share"] = lt.replies_shm ? double(lt.replies_ring) / double(lt.replies_shm) : 0.0;
  }
  k["bytes_per_second"] = bps;
  k["GBps_per_link"] = bps / c.links / 1e9;
  k["meets_target"] = bps / c.links / 1e9 >= kTargetPerLinkGBs ? 1 : 0;
  if (const double tc = g_ceilings.get(c.name()); tc > 0) {
    k["ratio_to_ceiling"] = tc / med;
    k["ceiling_bytes_per_second"] = bytes / tc;
  }
}

// One round trip of a floor link per iteration; the peer lives for this benchmark's calls (warmed up once).
void floor_round_trip(benchmark::State& st, fd::bench::FloorMode m, int index) {
  std::unique_ptr<fd::bench::FloorLink>& link = g_floor.link;
  if (g_floor.mode != int(m)) {
    g_cur.close();
    g_floor.close();
    link = std::make_unique<fd::bench::FloorLink>(m, g_ipc_dir, index, g_opt.timeout_ms, g_opt.fail_server_after);
    g_floor.mode = int(m);
    const int64_t w0 = fd::now_ns();
    for (int i = 0; i < g_opt.warmup_reps || double(fd::now_ns() - w0) * 1e-9 < g_opt.warmup_s; ++i) link->round_trip();
  }
  std::vector<double> ts;
  try {
    for (auto _ : st) {
      ts.push_back(link->round_trip());
      st.SetIterationTime(ts.back());
    }
  } catch (...) {
    g_floor.close();
    throw;
  }
  st.counters["message_bytes"] = 64;
  st.counters["rtt_median_us"] = fd::percentile(ts, 50) * 1e6;
  st.counters["rtt_p90_us"] = fd::percentile(ts, 90) * 1e6;
  st.counters["rtt_min_us"] = *std::min_element(ts.begin(), ts.end()) * 1e6;
}

void register_all(CLI::App& app) {
  Options& o = g_opt;
  if (o.quick) {  // a smaller grid and shorter timings unless given explicitly
    if (app.count("--sizes") == 0) o.sizes = {"64K", "1M", "4M", "32M"};
    if (app.count("--io-threads") == 0) o.io_threads = {1};
    if (app.count("--links") == 0) o.links = {1, 2};
    if (app.count("--time") == 0) o.time_s = 0.05;
    if (app.count("--warmup-time") == 0) o.warmup_s = 0.01;
    if (app.count("--warmup-reps") == 0) o.warmup_reps = 2;
  }
  o.shape.dtype = o.wire_dtype == "fp32" ? fd::proto::WireDType::F32 : fd::proto::WireDType::F16;
  if (o.shape.heads < 1 || o.shape.kv_heads < 1 || o.shape.heads % o.shape.kv_heads || o.shape.heads > 1024)
    throw fd::ConfigError("--heads must be a multiple of --kv-heads, at most 1024");
  if (o.shape.head_dim < 1 || o.shape.head_dim > 256) throw fd::ConfigError("--head-dim must be in 1..256");
  std::vector<TransportCase> cases;
  for (const auto& tr : o.transports)
    for (int io : o.io_threads)
      for (int nl : o.links)
        for (const auto& s : o.sizes)
          for (int spin : o.spin_us) {
            cases.push_back(fd::bench::make_case(tr, io, nl, fd::bench::parse_size(s), o.shape));
            cases.back().spin_us = spin;
          }
  if (o.floors || std::any_of(o.transports.begin(), o.transports.end(), [](const std::string& t) { return t != "tcp"; }))
    g_ipc_dir = fd::bench::make_ipc_dir();
  if (o.floors)
    for (const fd::bench::FloorMode m : {fd::bench::FloorMode::ZmqIpc, fd::bench::FloorMode::FutexShm}) {
      const int index = int(cases.size()) + int(m);
      benchmark::RegisterBenchmark((std::string("floor/") + fd::bench::floor_name(m)).c_str(),
                                   [=](benchmark::State& st) {
                                     fd::bench::run_guarded(st, std::string("floor/") + fd::bench::floor_name(m),
                                                            [&] { floor_round_trip(st, m, index); });
                                   })
          ->UseManualTime()
          ->MinTime(o.time_s)
          ->Unit(benchmark::kMicrosecond);
    }

  int major = 0, minor = 0, patch = 0;
  zmq_version(&major, &minor, &patch);
  const std::string zmqv = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
  std::printf(
      "fd-transport-bench: libzmq %s; step = per link one real ATTEND (header, ids, q, k, v: ~S bytes; heads "
      "%d/%d, head_dim %d, %s) by RWorkerClient to an echo R-worker process, reply ATTEND_REPLY (o, ~S/3)\n"
      "target: >= %.1f GB/s per link on loopback; GB/s = links * (request + reply bytes) / median RTT; "
      "memcpy_ceiling = 1-thread copy of the same bytes\n",
      zmqv.c_str(), o.shape.heads, o.shape.kv_heads, o.shape.head_dim, o.wire_dtype.c_str(), kTargetPerLinkGBs);
  for (size_t i = 0; i < cases.size(); ++i) {
    const TransportCase c = cases[i];
    const int index = int(i);
    for (const bool ceiling : {true, false}) {
      const std::string name = (ceiling ? "memcpy_ceiling/" : "round_trip/") + c.name();
      benchmark::RegisterBenchmark(name.c_str(),
                                   [=](benchmark::State& st) {
                                     fd::bench::run_guarded(st, name, [&] {
                                       if (ceiling) return memcpy_ceiling(st, c);
                                       try {
                                         round_trip(st, c, index);
                                       } catch (...) {
                                         g_cur.links.reset();  // no SHUTDOWN to a failed case: kill its servers
                                         g_cur.name.clear();
                                         throw;
                                       }
                                     });
                                   })
          ->UseManualTime()
          ->MinTime(o.time_s)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  benchmark::AddCustomContext("fd_tool", "fd-transport-bench");
  benchmark::AddCustomContext("fd_zmq_version", zmqv);
  benchmark::AddCustomContext("fd_target_gbps_per_link", fd::json(kTargetPerLinkGBs).dump());
  benchmark::AddCustomContext("fd_wire_shape", fd::json{{"heads", o.shape.heads},
                                                        {"kv_heads", o.shape.kv_heads},
                                                        {"head_dim", o.shape.head_dim},
                                                        {"dtype", o.wire_dtype}}
                                                   .dump());
  benchmark::AddCustomContext("fd_params", fd::json{{"sizes", o.sizes},
                                                    {"transports", o.transports},
                                                    {"io_threads", o.io_threads},
                                                    {"spin_us", o.spin_us},
                                                    {"links", o.links},
                                                    {"time_s", o.time_s},
                                                    {"warmup_s", o.warmup_s},
                                                    {"warmup_reps", o.warmup_reps},
                                                    {"timeout_ms", o.timeout_ms},
                                                    {"quick", o.quick},
                                                    {"floors", o.floors}}
                                               .dump());
  benchmark::AddCustomContext(
      "fd_method",
      fd::json{{"step",
                "per link one ATTEND [64 B header][ids][q][k][v] sent by fd::RWorkerClient (zero-copy from a "
                "reused staging buffer; shm: copied into the region; shm-inplace: from a block of the region it was "
                "written into once) to an echo R-worker process (fd-transport-bench serve: proto::decode, "
                "then ATTEND_REPLY [64 B header][o], |o| = |q|); the step ends when all links replied"},
               {"bytes_per_second",
                "bytes_per_step / (rtt_median_us * 1e-6); bytes_per_step = links * (request_bytes "
                "+ reply_bytes)"},
               {"GBps_per_link", "bytes_per_second / links / 1e9"},
               {"ratio_to_ceiling", "memcpy_ceiling seconds_median / round trip median (same bytes_per_step)"},
               {"size_units", "K = 1024, M = 1048576"}}
          .dump());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "serve") == 0) return fd::bench::transport_echo_main(argc - 1, argv + 1);
  if (argc > 1 && std::strcmp(argv[1], "floor-peer") == 0) return fd::bench::floor_peer_main(argc - 1, argv + 1);
  CLI::App app{
      "fd-transport-bench: the S-worker <-> R-worker ZeroMQ link with the real protocol and client "
      "(fd::RWorkerClient -> echo R-worker processes; per link one ATTEND of ~S bytes, reply ATTEND_REPLY "
      "of ~S/3), next to a same-run memcpy ceiling (Google Benchmark). `fd-transport-bench serve --help`: "
      "the echo R-worker.",
      "fd-transport-bench"};
  Options& o = g_opt;
  app.add_option("--sizes", o.sizes, "request sizes S per link per step (K/M = 1024/1048576)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--transports", o.transports,
                 "tcp (127.0.0.1, ephemeral port), ipc (temp dir), shm (ipc for the headers, tensors through the "
                 "shared-memory lane: copied into the region by the client), shm-inplace (the lane, each request "
                 "written into its region once and sent from there, as FastDecode's S-Part writes q/k/v)")
      ->delimiter(',')
      ->check(CLI::IsMember({"tcp", "ipc", "shm", "shm-inplace"}))
      ->capture_default_str();
  app.add_option("--io-threads", o.io_threads, "zmq I/O threads of the client and of each echo R-worker")
      ->delimiter(',')
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--spin-us", o.spin_us,
                 "microseconds the client's waits and each echo R-worker's loop poll without sleeping before they block "
                 "(RWorkerClientOptions::spin_us, RouterLoop::spin_us; 0: block at once); a list compares them")
      ->delimiter(',')
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_option("--links", o.links, "concurrent links (echo R-worker processes), all in flight at once")
      ->delimiter(',')
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--heads", o.shape.heads, "query heads of the ATTEND shape")->capture_default_str();
  app.add_option("--kv-heads", o.shape.kv_heads, "KV heads of the ATTEND shape")->capture_default_str();
  app.add_option("--head-dim", o.shape.head_dim, "head dim of the ATTEND shape")->capture_default_str();
  app.add_option("--wire-dtype", o.wire_dtype, "tensor dtype on the wire")
      ->check(CLI::IsMember({"fp16", "fp32"}))
      ->capture_default_str();
  app.add_option("--time", o.time_s,
                 "each benchmark's minimum measured seconds (its MinTime: wins over --benchmark_min_time)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--warmup-time", o.warmup_s, "warm-up seconds per case")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--warmup-reps", o.warmup_reps, "at least this many warm-up steps per case")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--timeout-ms", o.timeout_ms, "a step that takes longer fails, naming the silent link(s)")
      ->check(CLI::Range(10, 3600000))
      ->capture_default_str();
  app.add_option("--fail-server-after", o.fail_server_after,
                 "testing: each echo R-worker (and each floor peer) exits with status 3 instead of answering its "
                 "(N+1)-th ATTEND (message)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--floors", o.floors,
               "also measure the floors under a tiny ATTEND on the lane, before the cases: 64 bytes back and forth "
               "between two processes by a ZeroMQ DEALER/ROUTER echo over ipc (floor/zmq-ipc) and by a futex doorbell "
               "in a shared page (floor/futex-shm)");
  app.add_flag("--quick", o.quick,
               "short run for small machines: sizes 64K,1M,4M,32M, io-threads 1, links 1,2, 0.05 s per benchmark "
               "(options given explicitly win)");
  const int rc = fd::bench::bench_main(
      argc, argv, app, [&] { register_all(app); }, [] {
        g_floor.close();
        g_cur.close();
      });
  g_cur.links.reset();  // an error that ended the run early: kill what is left
  g_floor.close();
  fd::bench::remove_ipc_dir();
  return rc;
}
