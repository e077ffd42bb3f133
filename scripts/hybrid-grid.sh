#!/usr/bin/env bash
# Issue 17's grid on the GPU machine: gpu-only, FastDecode and hybrid interleaved in one sweep per model
# (experiments/hybrid/grid.sweep.json, Llama-2-7b: GPU memory cap x R-worker cores x context -> OUT/llama-2-7b;
# grid-gqa.sweep.json, Llama-3-8B at 12 cores -> OUT/llama-3-8b), then analysis/hybrid_grid.py sets each cell's
# three engines side by side (OUT/hybrid_grid.md, .json). Any further options go to both sweeps (--repeats N,
# --only AXIS=VALUES); --quick keeps the MHA grid's 12-core cells.
# Usage: scripts/hybrid-grid.sh OUT [--quick] [fd-bench sweep options]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: scripts/hybrid-grid.sh OUT [--quick] [fd-bench sweep options]}"
shift
bin=${BIN:-build/cuda/bin}
rest=()
for a in "$@"; do [[ "$a" == --quick ]] || rest+=("$a"); done
rc=0
"$bin/fd-bench" sweep experiments/hybrid/grid.sweep.json --out "$out/llama-2-7b" "$@" || rc=1
"$bin/fd-bench" sweep experiments/hybrid/grid-gqa.sweep.json --out "$out/llama-3-8b" "${rest[@]}" || rc=1
find "$out" -name trace.json -delete  # large; steps.jsonl keeps the per-step record
python3 analysis/pack_runs.py "$out/llama-2-7b" "$out/llama-3-8b" || rc=1
python3 analysis/hybrid_grid.py "$out/llama-2-7b" "$out/llama-3-8b" --out "$out" || rc=1
exit $rc
