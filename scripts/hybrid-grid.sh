#!/usr/bin/env bash
# Issue 17's grid on the GPU machine: gpu-only, FastDecode and hybrid interleaved in one sweep
# (experiments/hybrid/grid.sweep.json: GPU memory cap x R-worker cores x context), then analysis/hybrid_grid.py sets
# them side by side (OUT/hybrid_grid.md, .json). Usage: scripts/hybrid-grid.sh OUT [--quick]   (--quick: 12 cores only)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: scripts/hybrid-grid.sh OUT [--quick]}"
shift
bin=${BIN:-build/cuda/bin}
rc=0
"$bin/fd-bench" sweep experiments/hybrid/grid.sweep.json --out "$out" "$@" || rc=1
find "$out" -name trace.json -delete  # large; steps.jsonl keeps the per-step record
python3 analysis/hybrid_grid.py "$out" --out "$out" || rc=1
exit $rc
