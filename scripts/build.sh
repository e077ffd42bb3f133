#!/usr/bin/env bash
# Configures and builds with a CMake preset (default: "default": CPU execution, CUDA sources compiled
# when nvcc is found). Usage: scripts/build.sh [PRESET]
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-default}"
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)"
