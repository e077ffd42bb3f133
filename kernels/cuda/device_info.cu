#include <cuda_runtime.h>

#include "fd_fault_gpu_probe_fails.h"  // planted fault (scripts/fault-check.sh; fastdecode/core/fault.h)
#include "kernels/cuda/device_info.h"

namespace fd {

bool cuda_built() { return true; }

CudaProbe cuda_probe() {
  CudaProbe out;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
#ifdef FD_FAULT_GPU_PROBE_FAILS  // planted fault (scripts/fault-check.sh): the device query fails
  e = cudaErrorInsufficientDriver;
#endif
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    out.error = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
    return out;
  }
  if (n == 0) out.error = "cudaGetDeviceCount: 0 devices";
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if ((e = cudaGetDeviceProperties(&p, i)) != cudaSuccess) {
      cudaGetLastError();
      out.error += (out.error.empty() ? "" : "; ") + std::string("cudaGetDeviceProperties(") + std::to_string(i) +
                   "): " + cudaGetErrorName(e);
      continue;
    }
    out.devices.push_back({p.name, p.multiProcessorCount, p.major, p.minor, p.totalGlobalMem});
  }
  return out;
}

std::vector<CudaDeviceInfo> cuda_devices() { return cuda_probe().devices; }

}  // namespace fd
