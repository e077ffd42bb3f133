#!/usr/bin/env bash
# Configures and builds with a CMake preset (default: "default": CPU execution, CUDA sources compiled
# when nvcc is found). Usage: scripts/build.sh [PRESET [TARGET...]]   (no target: everything, including
# the tests and the libFuzzer target)
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-default}"
shift || true
cmake --preset "$preset" >/dev/null
targets=()
[ $# -gt 0 ] && targets=(--target "$@")
cmake --build --preset "$preset" -j "$(nproc)" "${targets[@]}"
