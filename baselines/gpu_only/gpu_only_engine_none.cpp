// Built instead of gpu_only_engine.cpp when CUDA was not found at configure time.
#include "baselines/gpu_only/gpu_only_engine.h"

namespace fd {

std::unique_ptr<Engine> make_gpu_only_engine(const GpuOnlyConfig&, const EngineContext&) {
  FD_THROW("this build has no CUDA (configure with the `cuda` preset on a machine with nvcc): engine \"gpu-only\" is unavailable");
}

}  // namespace fd
