// The parts of comm.h every backend shares: element types, the busy timer, argument checks.
#include "fastdecode/parallel/comm.h"

#include "fastdecode/core/clock.h"
#include "fastdecode/core/error.h"

namespace fd {

size_t comm_type_size(CommType t) {
  switch (t) {
    case CommType::F32: return 4;
    case CommType::I32: return 4;
    case CommType::U8: return 1;
  }
  FD_THROW("unknown CommType " << static_cast<int>(t));
}

const char* comm_type_name(CommType t) {
  switch (t) {
    case CommType::F32: return "f32";
    case CommType::I32: return "i32";
    case CommType::U8: return "u8";
  }
  return "?";
}

double Communicator::busy_ms_and_reset() { return static_cast<double>(busy_ns_.exchange(0)) / 1e6; }

Communicator::BusyScope::BusyScope(Communicator& c) : c_(c), t0_(now_ns()) {}
Communicator::BusyScope::~BusyScope() { c_.busy_ns_.fetch_add(now_ns() - t0_); }

void Communicator::require_host(void* stream, const char* op) const {
  if (stream != nullptr)
    FD_THROW(describe() << " rank " << rank() << ": " << op
                        << " was given a CUDA stream, but this communicator moves host buffers only "
                           "(device buffers need the nccl backend)");
}

void Communicator::check_peer(int peer, const char* op) const {
  if (peer < 0 || peer >= size() || peer == rank())
    FD_THROW(describe() << " rank " << rank() << " of " << size() << ": " << op << " names peer " << peer
                        << " (a peer is another rank of the group, 0.." << size() - 1 << ")");
}

namespace detail {
void check_group_args(const char* backend, int size, int timeout_ms) {
  if (size < 1 || size > 64) FD_THROW_BAD_INPUT(backend << " communicator: group size " << size << " is not in 1..64");
  if (timeout_ms < 1) FD_THROW_BAD_INPUT(backend << " communicator: timeout_ms " << timeout_ms << " must be >= 1");
}
}  // namespace detail

}  // namespace fd
