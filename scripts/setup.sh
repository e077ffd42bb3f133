#!/usr/bin/env bash
# Installs every Debian package FastDecode needs (Debian 12, as root or with sudo). Idempotent:
# does nothing when all are present; otherwise runs `apt-get update` once and installs the missing.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build git pkg-config       # toolchain (g++, CMake >= 3.25, Ninja)
  nlohmann-json3-dev libcli11-dev                         # JSON configs, command lines
  libgtest-dev libgmock-dev libbenchmark-dev              # tests and micro-benchmarks
  libzmq3-dev cppzmq-dev libopenblas-dev                  # R-worker transport, CPU S-Part backend
  python3 python3-numpy python3-pytest python3-matplotlib # NumPy reference, pytest, figures
  clang libclang-rt-14-dev                                # the libFuzzer target (ASan/UBSan) in ctest
  libtorch-dev                                            # the vanilla baseline (LibTorch 1.13, CPU)
  libgloo-dev                                             # the CPU communicator between S-ranks (issue 14)
  iproute2                                                # ip, tc: multi-host emulation (hardware.network)
  slurmctld slurmd slurm-client munge                     # a real Slurm on this host for the launcher tests (docs/CLUSTER.md)
  openmpi-bin                                             # mpirun for the launcher tests (docs/CLUSTER.md)
  python3-yaml                                            # the Kubernetes manifest parsed by the launcher tests
  groff-base bsdextrautils xz-utils                       # man pages to text, the corpus archive (scripts/make-corpus.sh)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} Debian packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "setup: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
