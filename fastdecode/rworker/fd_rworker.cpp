// fd-rworker: an R-worker process. Holds KV-caches in host memory and answers ATTEND requests with
// decode attention over them (docs/RWORKER.md).
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "fastdecode/wire/register.h"
#include "fastdecode/rworker/server.h"
#include "fastdecode/core/affinity.h"
#include "fastdecode/core/cli_main.h"
#include "fastdecode/wire/curve.h"

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

// The shutdown token from the environment (64 hex digits, as a spawning S-worker sets it); empty when unset.
std::string shutdown_token_from_env() {
  const char* e = std::getenv("FD_RWORKER_SHUTDOWN_TOKEN");
  if (!e || !*e) return "";
  const std::string hex = e;
  if (hex.size() != 2 * fd::proto::kShutdownTokenBytes || hex.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw fd::ConfigError("FD_RWORKER_SHUTDOWN_TOKEN: expected " + std::to_string(2 * fd::proto::kShutdownTokenBytes) +
                          " lowercase hex digits");
  std::string t;
  for (size_t i = 0; i < hex.size(); i += 2) t.push_back(char(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return t;
}

// Whether a bound tcp:// endpoint is reachable only from this host.
bool loopback_only(const std::string& ep) {
  if (ep.rfind("tcp://", 0) != 0) return true;  // ipc://, inproc://: local by construction
  const std::string host = ep.substr(6, ep.rfind(':') - 6);
  return host.rfind("127.", 0) == 0 || host == "[::1]" || host == "::1" || host == "localhost";
}

}  // namespace

int main(int argc, char** argv) {
  // The OpenMP wait policy is the worker's, not its launcher's: idle threads sleep (PASSIVE). Spinning ones starve the
  // S-worker and the other workers on shared cores (issue 43: with OMP_WAIT_POLICY=ACTIVE FastDecode's decode rate fell
  // from 4 866-5 035 to 1 926-2 278 tok/s; every committed measurement ran PASSIVE). libgomp reads the variable once,
  // when it loads, so an unset one is set and the program started again; one the user set is kept (and reported).
  if (!std::getenv("OMP_WAIT_POLICY")) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    setenv("FD_OMP_WAIT_POLICY_SET_BY", "fd-rworker", 1);
    // By its own path first: a program started as /proc/self/exe is named "exe" (ps, pkill, /proc/PID/comm).
    std::error_code ec;
    const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
    if (!ec && !self.empty()) execv(self.c_str(), argv);
    execv("/proc/self/exe", argv);  // on failure, go on with the runtime's default
    unsetenv("OMP_WAIT_POLICY");
  }
  const std::string wait_policy = std::string(std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : "default") +
                                  (std::getenv("FD_OMP_WAIT_POLICY_SET_BY") ? "" : " (from the environment)");
  CLI::App app{"fd-rworker: R-worker process (KV-cache holder and CPU decode attention)", "fd-rworker"};
  std::string listen = "tcp://127.0.0.1:5555", kv_dtype = "fp16", isa, cpus, name = "rworker", query = "auto";
  int threads = int(std::max(1u, std::thread::hardware_concurrency()));
  double memory_gb = 4.0, max_message_mb = 0, intake_mb = 0;
  int max_connections = 256;
  bool verbose = false, print_endpoint = false;
  long parent_pid = 0;
  app.add_option("--listen", listen, "ZeroMQ endpoint to bind: tcp://HOST:PORT (PORT * = any), ipc://PATH")->capture_default_str();
  app.add_option("--threads", threads, "Compute threads")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--cpus", cpus, "Pin compute threads to these CPUs, e.g. 0-7 or 0,2,4");
  app.add_option("--memory-gb", memory_gb, "KV-cache memory limit (GB = 1e9 bytes)")->check(CLI::Range(0.0, 1e6))->capture_default_str();
  app.add_option("--kv-dtype", kv_dtype, "KV storage")->check(CLI::IsMember({"fp16", "int8", "int4"}))->capture_default_str();
  app.add_option("--isa", isa, "Kernel ISA: scalar, avx2, avx512, avx512vnni (default: the best supported)");
  app.add_option("--query", query,
                 "How int8/int4 blocks take the query: fp32 (keys dequantized in registers: the exact math), int8 "
                 "(both dot products on integers: an int8 query and 7-bit value weights, VNNI where the CPU has "
                 "it: faster, adds their rounding error, docs/RWORKER.md), auto (int8 where the CPU has "
                 "AVX512-VNNI, else fp32)")
      ->check(CLI::IsMember({"auto", "fp32", "int8"}))
      ->capture_default_str();
  app.add_option("--max-message-mb", max_message_mb,
                 "Largest accepted request (MB = 1e6 bytes; default: --memory-gb / 32, within 16-1024 MB). A frame over "
                 "it makes libzmq drop the sender's connection; clients learn it from HELLO and split their appends")
      ->check(CLI::Range(1.0, 65536.0));
  app.add_option("--intake-mb", intake_mb,
                 "Most request bytes the worker holds at once for all its peers, received by ZeroMQ or being handled "
                 "(default: twice --max-message-mb); past it the connection holding the most is cut (docs/SECURITY.md)")
      ->check(CLI::Range(1.0, 1e6));
  app.add_option("--max-connections", max_connections, "Most connections at once; the newest past it are cut")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  app.add_option("--name", name, "Name in logs and STATS")->capture_default_str();
  app.add_flag("--print-endpoint", print_endpoint, "Print the bound endpoint on stdout once listening");
  int log_errors_per_s = 10;
  app.add_flag("--verbose", verbose, "Log every error reply (else --log-errors-per-s)");
  app.add_option("--log-errors-per-s", log_errors_per_s,
                 "At most this many error lines per second, then one 'suppressed K' line (a client decides how many "
                 "bad requests it sends)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--parent-pid", parent_pid,
                 "Exit when this process is no longer the parent (it died: no orphaned workers); the S-worker passes "
                 "its pid to the workers it spawns")
      ->check(CLI::PositiveNumber);
  int heartbeat_ms = 1000, heartbeat_timeout_ms = 10000, max_sessions = 64;
  double session_quota_gb = 0;
  std::string curve_secret, curve_clients, register_ep, advertise;
  bool serve_once = false;
  int register_timeout_ms = 60000;
  app.add_option("--heartbeat-ms", heartbeat_ms,
                 "ZeroMQ heartbeat interval: a client gone without closing its connection (killed, stopped, its host "
                 "down) is dropped after --heartbeat-timeout-ms of silence and its session ends (0: off)")
      ->check(CLI::Range(0, 3600000))->capture_default_str();
  app.add_option("--heartbeat-timeout-ms", heartbeat_timeout_ms, "See --heartbeat-ms")->check(CLI::Range(1, 3600000))->capture_default_str();
  app.add_option("--session-quota-gb", session_quota_gb,
                 "Most memory one client session may hold (KV and bookkeeping; 0: --memory-gb)")
      ->check(CLI::Range(0.0, 1e6))->capture_default_str();
  app.add_option("--max-sessions", max_sessions, "Most client sessions at once")->check(CLI::Range(1, 65536))->capture_default_str();
  app.add_option("--curve-secret", curve_secret,
                 "This worker's CURVE secret key file (fd-keys): encrypt and authenticate every connection; needs "
                 "--curve-clients");
  app.add_option("--curve-clients", curve_clients, "Directory of the client public keys admitted (*.public, fd-keys)");
  app.add_option("--register", register_ep,
                 "Once listening, announce this worker to an S-worker waiting at this endpoint (engine.rworkers.register; "
                 "for workers started by Slurm, mpirun, Kubernetes or by hand)");
  app.add_option("--advertise", advertise,
                 "The endpoint to announce with --register (default: the bound one, a wildcard host replaced by this "
                 "host's name)");
  app.add_option("--register-timeout-ms", register_timeout_ms, "How long --register keeps trying")
      ->check(CLI::Range(1, 86400000))->capture_default_str();
  app.add_flag("--serve-once", serve_once, "Exit once the first client's session has ended (CLOSE or disconnect)");
  double shm_max_mb = 4096;
  app.add_option("--shm-max-mb", shm_max_mb,
                 "Largest shared-memory region a client on this host may offer for its requests and replies (MB = 1e6 "
                 "bytes; docs/RWORKER.md); 0: refuse every offer, everything over ZeroMQ")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  int spin_us = 0;
  app.add_option("--spin-us", spin_us,
                 "Poll without sleeping this many microseconds after each reply before blocking: a request arriving then "
                 "skips the thread's wake-up, and a client with a shared-memory region puts it in the region's ring, "
                 "skipping ZeroMQ (docs/RWORKER.md, \"Rings\"); costs that much of a core per idle spell (0: block)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  return fd::guarded_main(app, argc, argv, [&]() {
    fd::RWorkerConfig cfg;
    cfg.kv_dtype = fd::kv_dtype_from_name(kv_dtype);
    cfg.memory_limit_bytes = size_t(memory_gb * 1e9);
    cfg.threads = threads;
    cfg.isa = isa.empty() ? fd::best_isa() : fd::isa_from_name(isa);
    if (!fd::isa_supported(cfg.isa)) throw fd::ConfigError("--isa " + isa + ": not supported by this CPU");
    cfg.query = fd::query_quant_from_name(query);
    cfg.limits.max_message_bytes = size_t(max_message_mb * 1e6);
    if (max_message_mb <= 0) cfg.limits.max_message_bytes = fd::default_max_message_bytes(cfg.memory_limit_bytes);
    cfg.name = name;
    cfg.session_quota_bytes = size_t(session_quota_gb * 1e9);
    cfg.max_sessions = size_t(max_sessions);
    cfg.shutdown_token = shutdown_token_from_env();
    fd::RWorkerServerOptions opt;
    opt.listen = listen;
    if (!cpus.empty()) opt.cpus = fd::parse_cpu_list(cpus, "--cpus");
    opt.verbose = verbose;
    opt.log_errors_per_s = log_errors_per_s;
    opt.heartbeat_ms = heartbeat_ms;
    opt.heartbeat_timeout_ms = heartbeat_timeout_ms;
    if (curve_secret.empty() != curve_clients.empty())
      throw fd::ConfigError("--curve-secret and --curve-clients go together (the worker's key, the clients it admits)");
    if (!curve_secret.empty()) {
      if (!fd::curve_available()) throw fd::ConfigError("--curve-secret: this libzmq has no CURVE support (libsodium)");
      opt.curve = fd::read_curve_secret(curve_secret);
      opt.curve_clients = fd::read_curve_public_dir(curve_clients);
    }
    opt.serve_once = serve_once;
    opt.shm_max_bytes = size_t(shm_max_mb * 1e6);
    opt.spin_us = spin_us;
    opt.intake_bytes = intake_mb > 0 ? size_t(intake_mb * 1e6) : 2 * cfg.limits.max_message_bytes;
    if (opt.intake_bytes < cfg.limits.max_message_bytes)
      throw fd::ConfigError("--intake-mb " + std::to_string(intake_mb) + ": under --max-message-mb (" +
                            std::to_string(double(cfg.limits.max_message_bytes) / 1e6) + "): the largest request could never be taken");
    opt.max_connections = size_t(max_connections);
    fd::pin_openmp_threads(opt.cpus, threads);
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    if (parent_pid > 0 && long(getppid()) != parent_pid)
      throw fd::Error("--parent-pid " + std::to_string(parent_pid) + ": not this process's parent (it has exited)");
    opt.parent_pid = parent_pid;  // the server stops once the parent is gone (even by SIGKILL)
    fd::RWorkerService service(cfg);
    fd::run_rworker_server(service, opt, &g_stop, [&](const std::string& ep) {
      std::fprintf(stderr,
                   "fd-rworker %s: listening on %s (kv %s, %d threads, OpenMP wait %s, %s, query %s, %.2f GB, messages up to "
                   "%.0f MB, intake %.0f MB%s)\n",
                   name.c_str(), ep.c_str(), kv_dtype.c_str(), threads, wait_policy.c_str(),
                   std::string(fd::isa_name(cfg.isa)).c_str(), query.c_str(),
                   memory_gb, double(cfg.limits.max_message_bytes) / 1e6,
                   double(opt.intake_bytes) / 1e6,
                   opt.curve.secret_z85.empty() ? "" : ", CURVE");
      if (opt.curve.secret_z85.empty() && !loopback_only(ep))
        std::fprintf(stderr,
                     "fd-rworker %s: WARNING: listening on %s WITHOUT CURVE: anyone who can reach this port can read, "
                     "change and free the KV-caches it holds, and the tensors cross the network in clear text "
                     "(--curve-secret / --curve-clients, docs/SECURITY.md)\n",
                     name.c_str(), ep.c_str());
      if (print_endpoint) {
        std::printf("%s\n", ep.c_str());
        std::fflush(stdout);
      }
      if (!register_ep.empty()) {
        const std::string mine = advertise.empty() ? fd::advertised_endpoint(ep) : advertise;
        fd::register_with(register_ep, mine, name, register_timeout_ms, opt.curve.secret_z85.empty() ? "" : opt.curve.public_z85);
        std::fprintf(stderr, "fd-rworker %s: registered %s with the S-worker at %s\n", name.c_str(), mine.c_str(),
                     register_ep.c_str());
      }
    });
    if (parent_pid > 0 && long(getppid()) != parent_pid)
      std::fprintf(stderr, "fd-rworker %s: parent %ld is gone; exiting\n", name.c_str(), parent_pid);
    const fd::json s = service.stats();
    std::fprintf(stderr, "fd-rworker %s: stopped after %llu requests (%llu errors)\n", name.c_str(),
                 (unsigned long long)s["requests"].get<uint64_t>(), (unsigned long long)s["errors"].get<uint64_t>());
    return 0;
  });
}
