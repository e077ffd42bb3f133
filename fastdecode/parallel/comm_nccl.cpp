// The NCCL communicator (comm.h): ranks are threads of this process, one CUDA device each; buffers are device
// memory and every call is enqueued on the caller's stream (cudaStream_t as void*), so a collective sits in
// the stream's order between the GEMMs that make and consume its data, and can be captured into a CUDA
// graph. The group is made by ncclCommInitAll from one thread; each rank's handle is then used only by its
// own thread (comm.h).
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <mutex>
#include <set>
#include <sstream>

#include "fastdecode/core/error.h"
#include "fastdecode/parallel/comm.h"

namespace fd {
namespace {

#define FD_NCCL_CHECK(expr, what)                                                              \
  do {                                                                                         \
    const ncclResult_t r_ = (expr);                                                            \
    if (r_ != ncclSuccess) FD_THROW(what << ": " << ncclGetErrorString(r_) << " (" << #expr << ")"); \
  } while (0)

ncclDataType_t nccl_type(CommType t) {
  switch (t) {
    case CommType::F32: return ncclFloat32;
    case CommType::I32: return ncclInt32;
    case CommType::U8: return ncclUint8;
  }
  FD_THROW("unknown CommType " << static_cast<int>(t));
}

std::string version_string() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "?";
  // NCCL >= 2.9 encodes MAJOR * 10000 + MINOR * 100 + PATCH.
  std::ostringstream o;
  o << v / 10000 << '.' << (v / 100) % 100 << '.' << v % 100;
  return o.str();
}

// Restores the calling thread's current device on scope exit.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cudaGetDevice(&saved_);
    if (saved_ != device) cudaSetDevice(device);
  }
  ~DeviceScope() { cudaSetDevice(saved_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int saved_ = 0;
};

class NcclComm final : public Communicator {
 public:
  NcclComm(ncclComm_t comm, int rank, int size, int device) : comm_(comm), rank_(rank), size_(size), device_(device) {}
  ~NcclComm() override {
    if (comm_) ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool device_buffers() const override { return true; }
  std::string describe() const override { return "nccl " + version_string() + " (GPU " + std::to_string(device_) + ")"; }

  void all_reduce_sum(void* buf, size_t count, CommType t, void* stream) override {
    BusyScope busy(*this);
    if (t != CommType::F32 && t != CommType::I32) FD_THROW(who() << ": all_reduce_sum: only f32 and i32 can be summed");
    check_usable("all_reduce_sum");
    if (count == 0) return;
    DeviceScope d(device_);
    guard(ncclAllReduce(buf, buf, count, nccl_type(t), ncclSum, comm_, cuda(stream)), "all_reduce_sum");
  }

  void all_gather(const void* in, void* out, size_t count, CommType t, void* stream) override {
    BusyScope busy(*this);
    check_usable("all_gather");
    if (count == 0) return;
    DeviceScope d(device_);
    guard(ncclAllGather(in, out, count, nccl_type(t), comm_, cuda(stream)), "all_gather");
  }

  void send(const void* buf, size_t bytes, int peer, void* stream) override {
    BusyScope busy(*this);
    check_peer(peer, "send");
    check_usable("send");
    DeviceScope d(device_);
    guard(ncclSend(buf, bytes, ncclUint8, peer, comm_, cuda(stream)), "send");
    last_send_stream_ = cuda(stream);
  }

  void recv(void* buf, size_t bytes, int peer, void* stream) override {
    BusyScope busy(*this);
    check_peer(peer, "recv");
    check_usable("recv");
    DeviceScope d(device_);
    guard(ncclRecv(buf, bytes, ncclUint8, peer, comm_, cuda(stream)), "recv");
  }

  void flush_sends() override {
    BusyScope busy(*this);
    check_usable("flush_sends");
    DeviceScope d(device_);
    const cudaError_t e = cudaStreamSynchronize(last_send_stream_);
    if (e != cudaSuccess) fail("flush_sends", cudaGetErrorString(e));
  }

  void abort() override {
    std::lock_guard<std::mutex> lock(m_);
    if (aborted_ || !comm_) return;
    aborted_ = true;
    ncclCommAbort(comm_);  // wakes kernels waiting on peers; the handle is gone afterwards
    comm_ = nullptr;
  }

 private:
  static cudaStream_t cuda(void* s) { return static_cast<cudaStream_t>(s); }
  std::string who() const { return "nccl rank " + std::to_string(rank_) + " of " + std::to_string(size_); }
  void check_usable(const char* op) {
    std::lock_guard<std::mutex> lock(m_);
    if (aborted_) FD_THROW(who() << ": " << op << ": the group was aborted");
    if (!broken_.empty()) FD_THROW(who() << ": " << op << ": the handle is broken by an earlier error: " << broken_);
  }
  void guard(ncclResult_t r, const char* op) {
    if (r == ncclSuccess) return;
    fail(op, ncclGetErrorString(r));
  }
  [[noreturn]] void fail(const char* op, const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(m_);
      if (broken_.empty()) broken_ = std::string(op) + ": " + why;
    }
    FD_THROW(who() << ": " << op << ": " << why);
  }

  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1, device_ = 0;
  cudaStream_t last_send_stream_ = nullptr;
  std::mutex m_;
  bool aborted_ = false;
  std::string broken_;
};

}  // namespace

CommGroup make_nccl_group(const std::vector<int>& devices) {
  const int n = static_cast<int>(devices.size());
  detail::check_group_args("nccl", n, 1);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  std::set<int> seen;
  for (int d : devices) {
    if (d < 0 || d >= count)
      FD_THROW_BAD_INPUT("nccl communicator: GPU " << d << " does not answer (" << count << " CUDA device(s) here)");
    if (!seen.insert(d).second)
      FD_THROW_BAD_INPUT("nccl communicator: GPU " << d << " is named twice; NCCL holds one rank per GPU in a group "
                                                      "(ranks sharing a GPU need the gloo backend)");
  }
  // NVLink multicast stays off (a program using it can take the host's shared GPUs out of service).
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  std::vector<ncclComm_t> comms(static_cast<size_t>(n), nullptr);
  int saved = 0;
  cudaGetDevice(&saved);
  const ncclResult_t r = ncclCommInitAll(comms.data(), n, devices.data());
  cudaSetDevice(saved);
  if (r != ncclSuccess) FD_THROW("nccl communicator over " << n << " GPU(s): ncclCommInitAll: " << ncclGetErrorString(r));
  CommGroup g;
  for (int i = 0; i < n; ++i) g.push_back(std::make_unique<NcclComm>(comms[size_t(i)], i, n, devices[size_t(i)]));
  return g;
}

bool have_nccl() { return true; }
std::string nccl_version() { return version_string(); }

}  // namespace fd
