// Built instead of host_offload_engine.cpp when CUDA was not found at configure time.
#include "baselines/host_offload/host_offload_engine.h"

namespace fd {

std::unique_ptr<Engine> make_host_offload_engine(const HostOffloadConfig&, const EngineContext&) {
  FD_THROW("this build has no CUDA (configure with the `cuda` preset on a machine with nvcc): engine \"host-offload\" is unavailable (built without CUDA)");
}

}  // namespace fd
