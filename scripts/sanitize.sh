#!/usr/bin/env bash
# The unit, service and fault tests under AddressSanitizer + UndefinedBehaviorSanitizer (the `debug` preset: CPU only,
# -fsanitize=address,undefined), a build of its own beside build/default: too long for CI's 2 cores with the rest of
# the suite, so it runs here and its result is committed (artifacts/sanitizers/). The libFuzzer target runs under the
# same sanitizers in CI already (ctest fuzz_rworker_bounded).
# Usage: scripts/sanitize.sh [OUT]   (default results/sanitizers; a log per test binary and summary.txt)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/sanitizers}"
mkdir -p "$out"
scripts/setup.sh >/dev/null
cmake --preset debug >/dev/null
targets=(fd_unit_tests fd_integration_tests fd_fault_tests fd-rworker)
{ cmake --build --preset debug -j "$(nproc)" --target "${targets[@]}" >"$out/build.log" 2>&1; } || { tail -30 "$out/build.log"; exit 1; }
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export OMP_WAIT_POLICY=PASSIVE
rc=0
summary="$out/summary.txt"
{
  echo "scripts/sanitize.sh at $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (uncommitted changes)'), $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "build: cmake --preset debug (-fsanitize=address,undefined, Debug); ASAN_OPTIONS=$ASAN_OPTIONS"
} >"$summary"
# The attention grids are the same code as in the Release build and take hours under ASan at -O0: filtered out (their
# kernels run under ASan in the other DecodeAttention tests and the service tests).
declare -A filter=([fd_unit_tests]='-DecodeAttention/DecodeAttentionGrid.*:DecodeAttention/DecodeAttentionQ8Grid.*:DecodeAttention.QuantizedQueryAddedError'
                   [fd_integration_tests]='*' [fd_fault_tests]='*')
for t in fd_unit_tests fd_integration_tests fd_fault_tests; do
  start=$(date +%s)
  build/debug/tests/$t --gtest_filter="${filter[$t]}" >"$out/$t.log" 2>&1
  r=$?
  [ $r -ne 0 ] && rc=1
  passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\?\..*/\1/p' "$out/$t.log")
  failed=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) tests\?, listed below.*/\1/p' "$out/$t.log")
  reports=$(grep -c -E "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" "$out/$t.log" || true)
  echo "$t (filter ${filter[$t]}): exit $r, ${passed:-0} passed, ${failed:-0} failed, $reports sanitizer reports, $(( $(date +%s) - start )) s" | tee -a "$summary"
done
exit $rc
