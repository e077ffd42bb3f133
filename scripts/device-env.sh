# Source on a machine that uses .deps/ (see scripts/device-deps.sh): points CMake and the loader at it.
_fd_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export FD_DEPS_PREFIX="$_fd_root/.deps/root"
export LD_LIBRARY_PATH="$FD_DEPS_PREFIX/usr/lib:$FD_DEPS_PREFIX/usr/lib/x86_64-linux-gnu:$FD_DEPS_PREFIX/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# On the GPU machine a GPU test that finds no device fails instead of skipping (tests/gpu/require_gpu.h),
# and the CPU kernels' AVX2 and AVX-512 cases must run, not skip (its Xeon has both).
export FD_REQUIRE_GPU=1 FD_REQUIRE_ISA=avx2,avx512,avx512vnni
