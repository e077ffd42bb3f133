#!/usr/bin/env bash
# Command two of the README: set-up, build, and the whole test suite (GoogleTest + pytest via ctest).
# GPU tests skip when no GPU answers. Extra arguments go to ctest (e.g. -R Safetensors).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh default
# A test that could not be built or run here is "Skipped" in ctest's list; FD_REQUIRE_BINARIES makes the
# ones whose tools setup.sh installs (pytest, the fuzz target) fail instead of skipping.
export FD_REQUIRE_BINARIES=1
junit="$PWD/build/default/ctest-junit.xml"
rm -f "$junit"
set +e
ctest --test-dir build/default --output-on-failure --output-junit "$junit" -j "$(nproc)" "$@" 2>&1 | tee build/default/ctest.log
rc=${PIPESTATUS[0]}
set -e
# Every skip with its reason (ctest names them under 'did not run' but prints no reason): GPU tests without a device,
# kernel cases of an ISA this CPU lacks, pytest cases (docs/CORRECTNESS.md, "Skips are visible").
skipped=$(grep -c '(Skipped)' build/default/ctest.log || true)
if [ -f "$junit" ]; then /usr/bin/python3 scripts/ctest_skips.py "$junit" || true; fi
echo "test.sh: ctest exit $rc; $skipped tests skipped (each listed above with its reason)"
exit "$rc"
