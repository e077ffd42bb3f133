#!/usr/bin/env bash
# Issue 17's grid on the GPU machine: gpu-only, FastDecode and hybrid interleaved in one sweep per model
# (experiments/hybrid/grid.sweep.json, Llama-2-7b: GPU memory cap x R-worker cores x context -> OUT/llama-2-7b;
# grid-gqa.sweep.json, Llama-3-8B at 12 cores -> OUT/llama-3-8b), then analysis/hybrid_grid.py sets each cell's
# three engines side by side (OUT/hybrid_grid.md, .json); then the online run (online.sweep.json: the three
# engines on the same Poisson arrivals -> OUT/online, OUT/hybrid_online.md) unless --no-online. Any further options
# go to both grid sweeps (--repeats N, --only AXIS=VALUES); --quick keeps the MHA grid's 12-core cells.
# Usage: scripts/hybrid-grid.sh OUT [--quick] [--no-online] [--no-grid] [fd-bench sweep options]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: scripts/hybrid-grid.sh OUT [--quick] [fd-bench sweep options]}"
shift
bin=${BIN:-build/cuda/bin}
all=() rest=() online=1 grid=1
for a in "$@"; do
  case "$a" in
    --no-online) online=0 ;;
    --no-grid) grid=0 ;;
    --quick) all+=("$a") ;;
    *) all+=("$a") rest+=("$a") ;;
  esac
done
rc=0
if ((grid)); then
  "$bin/fd-bench" sweep experiments/hybrid/grid.sweep.json --out "$out/llama-2-7b" "${all[@]}" || rc=1
  "$bin/fd-bench" sweep experiments/hybrid/grid-gqa.sweep.json --out "$out/llama-3-8b" "${rest[@]}" || rc=1
fi
if ((online)); then
  "$bin/fd-bench" sweep experiments/hybrid/online.sweep.json --out "$out/online" || rc=1
fi
find "$out" -name trace.json -delete  # large; steps.jsonl keeps the per-step record
dirs=()
for d in llama-2-7b llama-3-8b online; do [[ -d "$out/$d" ]] && dirs+=("$out/$d"); done
python3 analysis/pack_runs.py "${dirs[@]}" || rc=1
if ((grid)); then python3 analysis/hybrid_grid.py "$out/llama-2-7b" "$out/llama-3-8b" --out "$out" || rc=1; fi
if ((online)); then python3 analysis/hybrid_grid.py "$out/online" --online --out "$out" || rc=1; fi
exit $rc
