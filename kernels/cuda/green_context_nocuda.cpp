// Built instead of green_context.cu when no CUDA compiler is available: there are no GPU streams.
#include "fastdecode/core/error.h"
#include "kernels/cuda/green_context.h"

namespace fd::cuda {

SmLimitedStreams::SmLimitedStreams(int sm_count, int n_streams, int) : requested_(sm_count), n_streams_(n_streams) {
  FD_THROW("SM-limited streams: this build has no CUDA support (built without CUDA)");
}
SmLimitedStreams::~SmLimitedStreams() = default;
void SmLimitedStreams::release() noexcept {}
cudaStream_t SmLimitedStreams::stream(int) const { FD_THROW("SM-limited streams: built without CUDA"); }
int count_sms_used(cudaStream_t, int) { FD_THROW("count_sms_used: built without CUDA"); }

}  // namespace fd::cuda
