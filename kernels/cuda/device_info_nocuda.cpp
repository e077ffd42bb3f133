// Built instead of device_info.cu when no CUDA compiler is available: this build has no GPU support.
#include "kernels/cuda/device_info.h"

namespace fd {

bool cuda_built() { return false; }
CudaProbe cuda_probe() { return {{}, "this build has no CUDA (no CUDA compiler was found when it was configured)"}; }
std::vector<CudaDeviceInfo> cuda_devices() { return {}; }

}  // namespace fd
