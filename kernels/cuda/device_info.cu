#include <cuda_runtime.h>

#include "kernels/cuda/device_info.h"

namespace fd {

bool cuda_built() { return true; }

std::vector<CudaDeviceInfo> cuda_devices() {
  std::vector<CudaDeviceInfo> out;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return out;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out.push_back({p.name, p.multiProcessorCount, p.major, p.minor, p.totalGlobalMem});
  }
  return out;
}

}  // namespace fd
