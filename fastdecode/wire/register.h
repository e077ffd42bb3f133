// R-workers started by any launcher (Slurm's srun, mpirun, Kubernetes, by hand) join a waiting S-worker: each
// `fd-rworker --register tcp://SWORKER:PORT` announces the endpoint it listens on, and the S-worker
// (engine.rworkers.register, .expect N) waits for N of them before it starts (docs/RWORKER.md, examples/).
//
// The exchange is one ZeroMQ request: the worker's REQ sends one JSON frame {"fd_register": 1, "endpoint": E,
// "name": N}; the S-worker's ROUTER answers "ok" (or an error text). The S-worker then connects to E like to any
// listed worker: with CURVE (engine.rworkers.curve) a registrant that does not hold the workers' secret key cannot
// complete the handshake, so a false registration costs a failed start, not the data.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace fd {

struct Registration {
  std::string endpoint, name;
};

// The endpoint a worker bound to `bound` announces: `bound` itself, with a wildcard host (0.0.0.0, *, [::]) replaced
// by this host's name.
std::string advertised_endpoint(const std::string& bound);

// Worker side: announces `endpoint` to the S-worker at `register_ep`, retrying until it answers "ok" or timeout_ms
// passes (fd::Error naming the endpoint; a refusal names the S-worker's reason).
void register_with(const std::string& register_ep, const std::string& endpoint, const std::string& name, int timeout_ms,
                   const std::string& curve_public = "");

// S-worker side: binds `endpoint` (tcp://HOST:PORT) and collects registrations.
class Registrar {
 public:
  explicit Registrar(const std::string& endpoint);
  ~Registrar();
  Registrar(const Registrar&) = delete;
  Registrar& operator=(const Registrar&) = delete;
  const std::string& endpoint() const;  // as bound (a port * resolved)
  // Waits for n distinct endpoints (a repeated one is answered ok and counted once), up to timeout_ms: fd::Error
  // naming how many came and the endpoint waited on. `progress(k, n)` is called as each arrives (may be null).
  std::vector<Registration> wait(size_t n, int timeout_ms, const std::function<void(size_t, size_t)>& progress = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fd
