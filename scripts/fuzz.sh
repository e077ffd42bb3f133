#!/usr/bin/env bash
# Builds the libFuzzer target for the R-worker's message handling with clang and runs it (the test
# suite runs the same target for 20 s: ctest -R fuzz_rworker_bounded).
# Usage: scripts/fuzz.sh [SECONDS]   (default 60). Installs clang and its runtime if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
if ! command -v clang++ >/dev/null || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang libclang-rt-14-dev >/dev/null
fi
cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
  -DFD_ENABLE_CUDA=OFF -DFD_BUILD_FUZZERS=ON -DFD_BUILD_TESTS=OFF >/dev/null
cmake --build build/fuzz --target fuzz_rworker
mkdir -p build/fuzz/corpus
# The valid requests of seed_corpus() start the corpus (the first time; the corpus grows between runs).
[ -n "$(ls -A build/fuzz/corpus)" ] || FD_FUZZ_SEED_CORPUS=build/fuzz/corpus build/fuzz/fuzz_rworker -runs=0 build/fuzz/corpus
build/fuzz/fuzz_rworker -max_total_time="$secs" -max_len=8192 build/fuzz/corpus
