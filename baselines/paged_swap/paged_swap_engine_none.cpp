// Built instead of paged_swap_engine.cpp when CUDA was not found at configure time.
#include "baselines/paged_swap/paged_swap_engine.h"

namespace fd {

std::unique_ptr<Engine> make_paged_swap_engine(const PagedSwapConfig&, const EngineContext&) {
  FD_THROW("this build has no CUDA (configure with the `cuda` preset on a machine with nvcc): engine \"paged-swap\" is "
           "unavailable (built without CUDA)");
}

}  // namespace fd
