// Built instead of comm_nccl.cpp when CMake did not find CUDA and NCCL (or FD_ENABLE_NCCL is OFF): the NCCL
// communicator refuses, plainly, and have_nccl() says so.
#include "fastdecode/core/error.h"
#include "fastdecode/parallel/comm.h"

namespace fd {

CommGroup make_nccl_group(const std::vector<int>& devices) {
  FD_THROW_BAD_INPUT("this build has no NCCL communicator (asked for a group of "
                     << devices.size() << " GPUs): CMake found no CUDA, or no nccl.h / libnccl.so.2 (set FD_NCCL_ROOT "
                        "or install PyTorch's nvidia-nccl wheel; docs/PARALLEL.md), or FD_ENABLE_NCCL is OFF");
}
bool have_nccl() { return false; }
std::string nccl_version() { return ""; }

}  // namespace fd
