#!/usr/bin/env bash
# Issue 17's grid on the GPU machine: gpu-only, FastDecode and hybrid over GPU memory cap x context x R-worker cores
# (experiments/hybrid/grid-*.sweep.json), one sweep per engine, then analysis/hybrid_grid.py sets them side by side
# (OUT/hybrid_grid.md, .json). Usage: scripts/hybrid-grid.sh OUT [--quick]   (--quick: 12 cores only)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: scripts/hybrid-grid.sh OUT [--quick]}"
shift
quick="${1:-}"
bin=${BIN:-build/cuda/bin}
rc=0
for e in gpu-only hybrid fastdecode; do
  "$bin/fd-bench" sweep "experiments/hybrid/grid-$e.sweep.json" --out "$out/$e" $quick || rc=1
  find "$out/$e" -name trace.json -delete  # large; steps.jsonl keeps the per-step record
done
python3 analysis/hybrid_grid.py "$out" --out "$out" || rc=1
exit $rc
