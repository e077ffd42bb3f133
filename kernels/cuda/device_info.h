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

// The devices that answer, and when none does, why: the CUDA runtime's error (no device, no driver, a
// driver too old for this runtime, ...) or "this build has no CUDA". A device whose properties cannot be
// read is left out and its error noted.
struct CudaProbe {
  std::vector<CudaDeviceInfo> devices;
  std::string error;  // empty when every device answered
};
CudaProbe cuda_probe();

// cuda_probe().devices: empty when none answers or CUDA was not built.
std::vector<CudaDeviceInfo> cuda_devices();

}  // namespace fd
