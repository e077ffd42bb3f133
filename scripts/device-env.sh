# Source on a machine that uses .deps/ (see scripts/device-deps.sh): points CMake and the loader at it.
_fd_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export FD_DEPS_PREFIX="$_fd_root/.deps/root"
export LD_LIBRARY_PATH="$FD_DEPS_PREFIX/usr/lib/x86_64-linux-gnu:$FD_DEPS_PREFIX/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
