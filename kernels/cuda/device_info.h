// Which CUDA devices answer: used for provenance and to pick the GPU or CPU S-Part.
#pragma once
#include <string>
#include <vector>

namespace fd {

struct CudaDeviceInfo {
  std::string name;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  size_t memory_bytes = 0;
};

// True when this build contains CUDA code.
bool cuda_built();
// Devices that answer; empty when none does or CUDA was not built (any CUDA error means none).
std::vector<CudaDeviceInfo> cuda_devices();

}  // namespace fd
