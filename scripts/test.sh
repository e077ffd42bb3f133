#!/usr/bin/env bash
# Command two of the README: set-up, build, and the whole test suite (GoogleTest + pytest via ctest).
# GPU tests skip when no GPU answers. Extra arguments go to ctest (e.g. -R Safetensors).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh default
ctest --test-dir build/default --output-on-failure -j "$(nproc)" "$@"
