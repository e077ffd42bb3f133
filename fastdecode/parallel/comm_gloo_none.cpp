// Built instead of comm_gloo.cpp when CMake did not find Gloo (or FD_ENABLE_GLOO is OFF): the Gloo
// communicator refuses, plainly, and have_gloo() says so.
#include "fastdecode/core/error.h"
#include "fastdecode/parallel/comm.h"

namespace fd {

CommGroup make_gloo_group(int size, int timeout_ms) {
  FD_THROW_BAD_INPUT("this build has no Gloo communicator (asked for a group of "
                     << size << " ranks): Gloo was not found when CMake configured it, or FD_ENABLE_GLOO is OFF "
                        "(scripts/setup.sh installs libgloo-dev; the cuda preset turns it off)");
}
bool have_gloo() { return false; }
std::string gloo_version() { return ""; }

}  // namespace fd
