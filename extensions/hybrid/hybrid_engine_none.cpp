// Built instead of hybrid_engine.cpp when CUDA was not found at configure time.
#include "extensions/hybrid/hybrid_engine.h"

namespace fd {

std::unique_ptr<Engine> make_hybrid_engine(const HybridConfig&, const EngineContext&) {
  FD_THROW("this build has no CUDA (configure with the `cuda` preset on a machine with nvcc): engine \"hybrid\" is unavailable");
}

}  // namespace fd
