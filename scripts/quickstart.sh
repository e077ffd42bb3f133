#!/usr/bin/env bash
# Command one of the README: set-up, build, and the quick-start experiment end to end.
# Writes a run folder under results/quickstart/ and prints tokens/s and latency percentiles.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh default fd-bench fd-rworker  # only what the run needs (scripts/test.sh builds the rest)
build/default/bin/fd-bench run experiments/quickstart.json "$@"
