// Built instead of spart_cuda.cpp when CUDA was not found at configure time.
#include "fastdecode/core/error.h"
#include "fastdecode/spart/spart.h"

namespace fd {

std::unique_ptr<SPart> make_cuda_spart(ModelWeights, const CudaSPartOptions&) {
  FD_THROW("this build has no CUDA (configure with the `cuda` preset on a machine with nvcc) : backend \"cuda\" is unavailable");
}

}  // namespace fd
