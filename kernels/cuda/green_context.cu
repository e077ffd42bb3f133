// SM-limited streams through CUDA green contexts (see green_context.h).
//
// What the CUDA documentation says, and what this file does about it (sources: CUDA 13.0 cuda.h /
// cudaTypedefs.h / cuda_runtime_api.h in /usr/local/cuda/include; CUDA Driver API reference, section
// "Green Contexts", docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__GREEN__CONTEXTS.html; CUDA
// Programming Guide 4.6 "Green Contexts", docs.nvidia.com/cuda/cuda-programming-guide/04-special-topics/
// green-contexts.html):
//
// 1. Memory. A green context is not a separate address space: cuGreenCtxCreate "will retain the primary
//    context on device dev"; cuCtxFromGreenCtx returns "a normal primary context but with the resources
//    of the specified green context"; cuStreamGetCtx_v2 on a green-context stream returns "the green
//    context in pGreenCtx and the primary context of the associated device in pCtx". So a green-context
//    stream belongs to the primary context, the one the runtime API (cudaMalloc, cudaMemcpy, module
//    loading for <<<>>> launches) uses: buffers from cudaMalloc on the primary context, made before or
//    after the green context, are valid in kernels on these streams, with no cuCtxSetCurrent dance.
//    We never make the green context current; every allocation stays an ordinary primary-context one.
//    (Green contexts partition SMs and work queues only; memory bandwidth, L2 and copy engines stay
//    shared with everything else on the device.)
// 2. cuBLAS. A cuBLAS handle is created on the current (primary) context and takes any stream of that
//    context through cublasSetStream; a green-context stream is such a stream (point 1). That is how
//    others use it: FlashInfer's tests/utils/test_green_ctx.py runs torch matmuls (cuBLAS, on tensors
//    from PyTorch's cudaMalloc-based allocator) under torch.cuda.stream(green-context stream), and
//    torch.cuda.green_contexts.GreenContext.Stream() is documented for "torch operations" on the green
//    context. Nothing in the cuBLAS documentation mentions green contexts either way. Caveat: cuBLAS picks
//    kernels and grid shapes (split-K, stream-K) from the device's SM count, which is the full device;
//    cublasSetSmCountTarget(handle, sm_count()) tells it how many SMs it really has. Workspaces that
//    cuBLAS allocates itself come from the primary context, so they are fine too.
// 3. Granularity. cuDevSmResourceSplitByCount rounds minCount up to the device's minimum partition size
//    (sm.minSmPartitionSize) and alignment (sm.smCoscheduledAlignment), both read with
//    cuDeviceGetDevResource; the guideline for compute capability 9.0+ is "minimum 8 SMs, a multiple of
//    8". We request one group, read the granted count back from the green context
//    (cuGreenCtxGetDevResource), and report it. The documentation also warns that work "may run on more
//    SMs than was provisioned (but never less)": under MPS with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, and on
//    9.x when a module using dynamic parallelism is loaded (2 extra shared SMs). count_sms_used() measures
//    what really happens.
// 4. Streams. cuGreenCtxCreate requires CU_GREEN_CTX_DEFAULT_STREAM in CUDA 13.0 (later drivers accept 0
//    too); cuGreenCtxStreamCreate requires CU_STREAM_NON_BLOCKING. Streams must be destroyed before the
//    green context ("Failure to do so will result in a memory leak"), which the destructor does.
//    Being non-blocking, they are not ordered after legacy-default-stream work, and a synchronous
//    cudaMemcpy from pageable memory "will return once the pageable buffer has been copied to the staging
//    memory ... but the DMA to final destination may not have completed" (CUDA Runtime API, "API
//    synchronization behavior"): uploads belong on these streams, or are followed by a device sync.
// 5. Linking. The stub libcuda.so that CUDA::cuda_driver links has SONAME libcuda.so.1, so linking it
//    would put libcuda.so.1 in DT_NEEDED and every binary would fail to start on a machine without the
//    NVIDIA driver (this development machine has no libcuda.so.1). Instead the driver entry points are
//    looked up at run time with cudaGetDriverEntryPointByVersion (runtime API, CUDA 12.5+), each at the
//    ABI version of the typedef we call it through (PFN_..._v12040 etc. from cudaTypedefs.h). The
//    runtime itself dlopen()s the driver, so binaries start everywhere and only this class needs it.
//    Symbol versions: cuDeviceGetDevResource, cuDevSmResourceSplitByCount, cuDevResourceGenerateDesc,
//    cuGreenCtxCreate/Destroy, cuGreenCtxGetDevResource: 12.4; cuGreenCtxStreamCreate: 12.5.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/green_context.h"

#define FD_DRV_CHECK(d, stmt)                                                                \
  do {                                                                                       \
    const CUresult fd_drv_e_ = (stmt);                                                       \
    if (fd_drv_e_ != CUDA_SUCCESS) FD_THROW("SM-limited streams: " #stmt ": " << (d).describe(fd_drv_e_)); \
  } while (0)

namespace fd::cuda {

namespace {

// The driver entry points we use, loaded once per process.
struct Driver {
  PFN_cuGetErrorName_v6000 cuGetErrorName = nullptr;
  PFN_cuGetErrorString_v6000 cuGetErrorString = nullptr;
  PFN_cuDeviceGet_v2000 cuDeviceGet = nullptr;
  PFN_cuDeviceGetDevResource_v12040 cuDeviceGetDevResource = nullptr;
  PFN_cuDevSmResourceSplitByCount_v12040 cuDevSmResourceSplitByCount = nullptr;
  PFN_cuDevResourceGenerateDesc_v12040 cuDevResourceGenerateDesc = nullptr;
  PFN_cuGreenCtxCreate_v12040 cuGreenCtxCreate = nullptr;
  PFN_cuGreenCtxDestroy_v12040 cuGreenCtxDestroy = nullptr;
  PFN_cuGreenCtxGetDevResource_v12040 cuGreenCtxGetDevResource = nullptr;
  PFN_cuGreenCtxStreamCreate_v12050 cuGreenCtxStreamCreate = nullptr;
  PFN_cuStreamDestroy_v4000 cuStreamDestroy = nullptr;
  std::string missing;  // why loading failed; empty when every entry point was found

  std::string describe(CUresult e) const {
    const char *name = nullptr, *text = nullptr;
    if (cuGetErrorName) cuGetErrorName(e, &name);
    if (cuGetErrorString) cuGetErrorString(e, &text);
    std::string s = name ? name : "CUresult " + std::to_string(int(e));
    if (text) s += std::string(" (") + text + ")";
    return s;
  }
};

template <typename F>
void load(const char* symbol, unsigned version, F& fn, std::string& missing) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &p, version, cudaEnableDefault, &q);
  if (e == cudaSuccess && q == cudaDriverEntryPointSuccess && p) {
    fn = reinterpret_cast<F>(p);
    return;
  }
  cudaGetLastError();
  missing += std::string(missing.empty() ? "" : ", ") + symbol + " (CUDA " + std::to_string(version / 1000) + "." +
             std::to_string(version % 1000 / 10) + ": " +
             (e != cudaSuccess                                  ? cudaGetErrorString(e)
              : q == cudaDriverEntryPointVersionNotSufficent ? "driver too old"
                                                             : "not found") +
             ")";
}

const Driver& driver() {
  static const Driver d = [] {
    Driver r;
    load("cuGetErrorName", 6000, r.cuGetErrorName, r.missing);
    load("cuGetErrorString", 6000, r.cuGetErrorString, r.missing);
    load("cuDeviceGet", 2000, r.cuDeviceGet, r.missing);
    load("cuDeviceGetDevResource", 12040, r.cuDeviceGetDevResource, r.missing);
    load("cuDevSmResourceSplitByCount", 12040, r.cuDevSmResourceSplitByCount, r.missing);
    load("cuDevResourceGenerateDesc", 12040, r.cuDevResourceGenerateDesc, r.missing);
    load("cuGreenCtxCreate", 12040, r.cuGreenCtxCreate, r.missing);
    load("cuGreenCtxDestroy", 12040, r.cuGreenCtxDestroy, r.missing);
    load("cuGreenCtxGetDevResource", 12040, r.cuGreenCtxGetDevResource, r.missing);
    load("cuGreenCtxStreamCreate", 12050, r.cuGreenCtxStreamCreate, r.missing);
    load("cuStreamDestroy", 4000, r.cuStreamDestroy, r.missing);
    return r;
  }();
  return d;
}

std::string driver_version() {
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess) {
    cudaGetLastError();
    return "unknown";
  }
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

}  // namespace

SmLimitedStreams::SmLimitedStreams(int sm_count, int n_streams, int device)
    : requested_(sm_count), n_streams_(n_streams) {
  if (n_streams < 1) FD_THROW("SM-limited streams: n_streams must be >= 1, got " << n_streams);
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    cudaGetLastError();
    FD_THROW("SM-limited streams: no CUDA device answers");
  }
  if (device < 0 || device >= ndev) FD_THROW("SM-limited streams: device " << device << " of " << ndev << " does not answer");
  CUDA_CHECK(cudaSetDevice(device));
  // Make the primary context active first: cuGreenCtxCreate retains it, and the driver documentation
  // advises it be active to avoid initialising and tearing it down around the green context.
  CUDA_CHECK(cudaFree(nullptr));
  CUDA_CHECK(cudaDeviceGetAttribute(&device_sm_count_, cudaDevAttrMultiProcessorCount, device));
  streams_.reserve(size_t(n_streams));
  try {
    if (sm_count <= 0) {
      sm_count_ = device_sm_count_;
      for (int i = 0; i < n_streams; ++i) {
        cudaStream_t s = nullptr;
        CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        streams_.push_back(s);
      }
      return;
    }
    const Driver& d = driver();
    if (!d.missing.empty())
      FD_THROW("SM-limited streams: this CUDA driver (" << driver_version() << ") lacks green contexts (needs a driver "
               "for CUDA 12.5 or later); missing entry points: " << d.missing);
    CUdevice dev = 0;
    FD_DRV_CHECK(d, d.cuDeviceGet(&dev, device));
    CUdevResource all{};
    FD_DRV_CHECK(d, d.cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
    granularity_ = int(all.sm.smCoscheduledAlignment);
    min_partition_ = int(all.sm.minSmPartitionSize);
    if (sm_count > int(all.sm.smCount))
      FD_THROW("SM-limited streams: " << sm_count << " SMs requested but device " << device << " has " << all.sm.smCount
                                      << " (use 0 for no limit)");
    CUdevResource group{};
    unsigned n_groups = 1;
    const CUresult split = d.cuDevSmResourceSplitByCount(&group, &n_groups, &all, nullptr, 0, unsigned(sm_count));
    if (split != CUDA_SUCCESS || n_groups != 1)
      FD_THROW("SM-limited streams: the driver cannot make a group of at least "
               << sm_count << " SMs on device " << device << " (" << all.sm.smCount << " SMs; groups of at least " << min_partition_
               << ", in multiples of " << granularity_ << "; use 0 for no limit)"
               << (split != CUDA_SUCCESS ? ": " + d.describe(split) : std::string()));
    CUdevResourceDesc desc = nullptr;
    FD_DRV_CHECK(d, d.cuDevResourceGenerateDesc(&desc, &group, 1));
    CUgreenCtx g = nullptr;
    FD_DRV_CHECK(d, d.cuGreenCtxCreate(&g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
    green_ctx_ = g;
    CUdevResource granted{};
    FD_DRV_CHECK(d, d.cuGreenCtxGetDevResource(g, &granted, CU_DEV_RESOURCE_TYPE_SM));
    sm_count_ = int(granted.sm.smCount);
    for (int i = 0; i < n_streams; ++i) {
      CUstream s = nullptr;
      FD_DRV_CHECK(d, d.cuGreenCtxStreamCreate(&s, g, CU_STREAM_NON_BLOCKING, 0));
      streams_.push_back(s);
    }
  } catch (...) {
    release();
    throw;
  }
}

SmLimitedStreams::~SmLimitedStreams() { release(); }

void SmLimitedStreams::release() noexcept {
  for (cudaStream_t s : streams_) {
    cudaStreamSynchronize(s);
    if (green_ctx_) driver().cuStreamDestroy(s);
    else cudaStreamDestroy(s);
  }
  streams_.clear();
  if (green_ctx_) driver().cuGreenCtxDestroy(static_cast<CUgreenCtx>(green_ctx_));
  green_ctx_ = nullptr;
  cudaGetLastError();  // leave no sticky error from teardown behind
}

cudaStream_t SmLimitedStreams::stream(int i) const {
  if (i < 0 || i >= int(streams_.size()))
    FD_THROW("SM-limited streams: stream " << i << " out of range (have " << streams_.size() << ")");
  return streams_[size_t(i)];
}

namespace {

constexpr unsigned kSmSlots = 4096;  // > any %smid; slot kSmSlots flags an id out of range

__global__ void record_smid_kernel(unsigned* seen, unsigned long long spin_ns) {
  if (threadIdx.x != 0) return;
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < spin_ns);
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));  // read last: %smid may change if the block is migrated
  seen[id < kSmSlots ? id : kSmSlots] = 1;
}

}  // namespace

int count_sms_used(cudaStream_t s, int blocks) {
  if (blocks < 1) FD_THROW("count_sms_used: blocks must be >= 1, got " << blocks);
  unsigned* seen = nullptr;
  CUDA_CHECK(cudaMalloc(&seen, (kSmSlots + 1) * sizeof(unsigned)));
  std::vector<unsigned> host(kSmSlots + 1, 0);
  cudaError_t e = cudaMemsetAsync(seen, 0, (kSmSlots + 1) * sizeof(unsigned), s);
  if (e == cudaSuccess) {
    record_smid_kernel<<<blocks, 32, 0, s>>>(seen, 5000);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpyAsync(host.data(), seen, host.size() * sizeof(unsigned), cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  cudaFree(seen);
  if (e != cudaSuccess) {
    cudaGetLastError();
    FD_THROW("count_sms_used: " << cudaGetErrorString(e));
  }
  if (host[kSmSlots]) FD_THROW("count_sms_used: an SM id >= " << kSmSlots);
  int n = 0;
  for (unsigned i = 0; i < kSmSlots; ++i) n += host[i] ? 1 : 0;
  return n;
}

}  // namespace fd::cuda
