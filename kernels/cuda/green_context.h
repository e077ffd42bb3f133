// SM-limited streams: emulate a smaller GPU (fewer SMs, same memory system) on a big one by running an
// engine's GPU work on streams of a CUDA green context that owns at most N SMs of device 0.
// Kernels, cuBLAS calls, memsets and copies issued to these streams need no change; memory from plain
// cudaMalloc works on them (see the notes at the top of green_context.cu for what the driver documents).
// This header needs no CUDA headers, so code built without CUDA can include it.
#pragma once
#include <vector>

// The CUDA runtime's stream handle, declared as <driver_types.h> declares it (an identical typedef may
// be repeated in C++), so that this header compiles where no CUDA headers are installed.
struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

namespace fd::cuda {

// A set of CUDA streams whose work runs on at most `sm_count` SMs of device 0, through a CUDA green
// context (driver API cuDeviceGetDevResource / cuDevSmResourceSplitByCount / cuDevResourceGenerateDesc /
// cuGreenCtxCreate / cuGreenCtxStreamCreate, loaded at run time: no link against libcuda).
//
// sm_count <= 0 means "no limit": plain cudaStreamCreateWithFlags(cudaStreamNonBlocking) streams on the
// primary context of device 0. Otherwise the driver rounds the request up to its SM-group granularity
// (on sm_90: at least 8 SMs, a multiple of 8); sm_count() reports what was granted, read back from the
// green context itself. Throws fd::Error with a clear message when the build has no CUDA, no device
// answers, the driver lacks green contexts, or the request cannot be met (e.g. more SMs than the device
// has).
//
// Streams are non-blocking (no implicit synchronisation with the legacy default stream, which green
// context streams require); order them against other streams with events, as for any stream. In
// particular, work on the legacy default stream (stream 0, synchronous cudaMemcpy / cudaMemset) is not
// ordered before work on these streams: a synchronous cudaMemcpy from pageable memory may return before
// its DMA lands, so issue uploads on one of these streams (cudaMemcpyAsync) or cudaDeviceSynchronize()
// after them. And anything still launched on stream 0 runs on the whole device, unlimited.
// cuBLAS: cublasSetStream(handle, stream(i)) works; also call cublasSetSmCountTarget(handle, sm_count())
// when limited() so that cuBLAS sizes its grids (split-K and the like) for the SMs it really has.
// Destroy every object that still has work queued on these streams (cuBLAS handles, graphs) first: the
// destructor synchronises and destroys the streams, then the green context.
class SmLimitedStreams {
 public:
  SmLimitedStreams(int sm_count, int n_streams, int device = 0);
  ~SmLimitedStreams();
  SmLimitedStreams(const SmLimitedStreams&) = delete;
  SmLimitedStreams& operator=(const SmLimitedStreams&) = delete;

  cudaStream_t stream(int i) const;  // 0 <= i < n_streams()
  int n_streams() const { return n_streams_; }
  int sm_count() const { return sm_count_; }                // SMs granted (device total when unlimited)
  int device_sm_count() const { return device_sm_count_; }  // SMs of device 0
  int requested_sm_count() const { return requested_; }     // the constructor's argument
  // What the driver requires of an SM group on this device (cuDeviceGetDevResource, CU_DEV_RESOURCE_TYPE_SM):
  // group sizes are multiples of granularity() and at least min_partition(). 0 when unlimited.
  int granularity() const { return granularity_; }
  int min_partition() const { return min_partition_; }
  bool limited() const { return green_ctx_ != nullptr; }

 private:
  void release() noexcept;

  int requested_ = 0, n_streams_ = 0;
  int sm_count_ = 0, device_sm_count_ = 0, granularity_ = 0, min_partition_ = 0;
  void* green_ctx_ = nullptr;  // CUgreenCtx when limited
  std::vector<cudaStream_t> streams_;
};

// Diagnostic for tests and the harness: launches `blocks` blocks of 32 threads on `s`, each recording the
// SM it ran on (%smid) after spinning ~5 us so that the blocks spread over every SM the stream may use,
// and returns the number of distinct SMs used. Synchronises `s`. Throws fd::Error on any CUDA error.
int count_sms_used(cudaStream_t s, int blocks = 4096);

}  // namespace fd::cuda
