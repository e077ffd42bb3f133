#!/usr/bin/env bash
# Prepares .deps/: Debian packages unpacked (dpkg -x) for a machine that has a compiler but no package
# manager access, such as the GPU machine. Run here (Debian 12), then carry .deps to that machine and
# `source scripts/device-env.sh` there before building.
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian
      libzmq5 libzmq3-dev cppzmq-dev libsodium23 libpgm-5.3-0 libnorm1
      libopenblas0-pthread libopenblas-pthread-dev libgfortran5
      libgloo-dev libgloo0 libhiredis0.14 libibverbs1 libnl-3-200 libnl-route-3-200)
mkdir -p .deps/debs
(cd .deps/debs && apt-get download "${PKGS[@]}" >/dev/null)
for deb in .deps/debs/*.deb; do dpkg -x "$deb" .deps/root; done
rm -rf .deps/debs
# Static OpenBLAS archives are large and unused (the build links the shared library): keep the carry small.
find .deps/root -path "*openblas*" \( -name "*.a" -o -name "liblapack*" \) -delete
echo "device-deps: unpacked ${#PKGS[@]} packages into .deps/root"
