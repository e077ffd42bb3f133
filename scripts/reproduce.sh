#!/usr/bin/env bash
# Reproduce the paper's evaluation figures on this machine (docs/REPRODUCING.md): one step per figure,
# each a sweep of experiments/paper/*.sweep.json (fd-bench sweep) or a benchmark, then the figures and the
# claims table from what was measured.
#
#   usage: scripts/reproduce.sh [--quick|--full] [--out DIR] [--bin-dir DIR] [--dry-run] [--no-figures] [FIG...]
#
#   FIG      fig1 fig3 fig8 fig9 fig10 fig11 fig12 fig13 fig14 fig15 balance (default: all of them; balance = the
#            balance map's grid: R-worker cores x SM count x GPU memory cap, FastDecode and GPU-only)
#   --quick  the specs' "quick" variants (a subset of their points) and the 7b model only; about
#            20 minutes of GPU-machine time for all figures (docs/REPRODUCING.md has the time table)
#   --full   every point of every spec (the default)
#   --out    results root (default results/paper): OUT/<sweep name>/<point>/rep<k>/, OUT/fig3/, OUT/baselines/,
#            OUT/figures/ (PNG + PDF), OUT/CLAIMS.md
#   --bin-dir  where fd-bench and the benchmarks are (default build/cuda/bin, else build/default/bin)
#   --dry-run  print what would run (the sweeps' points too), run nothing
#   --no-figures  measure only (draw later, e.g. on another machine: analysis/figures.py --paper DIR)
#
# Resumable: a sweep skips points whose run folder has a summary.json, so rerunning after an interruption
# continues where it stopped. Environment: RUN_TIMEOUT (s per sweep, default 3600), TIME_BUDGET (s: no sweep
# or benchmark starts after that many seconds of this script, so a caller with a hard limit keeps time to
# pack DIR; 0 = none).
set -uo pipefail
cd "$(dirname "$0")/.."
mode=full out=results/paper bin="" dry=0 draw=1 figs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) mode=quick ;;
    --full) mode=full ;;
    --out) out="$2"; shift ;;
    --bin-dir) bin="$2"; shift ;;
    --dry-run) dry=1 ;;
    --no-figures) draw=0 ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    fig1|fig3|fig8|fig9|fig10|fig11|fig12|fig13|fig14|fig15|balance) figs+=("$1") ;;
    *) echo "reproduce.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ ${#figs[@]} -eq 0 ] && figs=(fig1 fig3 fig8 fig9 fig10 fig11 fig12 fig13 fig14 fig15 balance)
if [ -z "$bin" ]; then
  bin=build/cuda/bin
  [ -x "$bin/fd-bench" ] || bin=build/default/bin
fi
if [ ! -x "$bin/fd-bench" ] && [ $dry -eq 0 ]; then
  echo "reproduce.sh: no fd-bench in $bin (build first: scripts/build.sh, or cmake --preset cuda && cmake --build --preset cuda)" >&2
  exit 2
fi
[ -f scripts/device-env.sh ] && [ -d .deps ] && source scripts/device-env.sh
export OMP_WAIT_POLICY=PASSIVE
run_timeout="${RUN_TIMEOUT:-3600}"
time_budget="${TIME_BUDGET:-0}"
rc=0 t_start=$SECONDS
mkdir -p "$out"
has() { [[ " ${figs[*]} " == *" $1 "* ]]; }
step() { echo "== $* ($((SECONDS - t_start)) s)"; }
over_budget() {
  if [ "$time_budget" -gt 0 ] && [ $((SECONDS - t_start)) -ge "$time_budget" ]; then
    echo "  not started (TIME_BUDGET $time_budget s spent): $*"
    return 0
  fi
  return 1
}
run() {  # a command, or its echo with --dry-run
  if [ $dry -eq 1 ]; then echo "  would run: $*"; return 0; fi
  over_budget "$@" && return 0
  "$@" || { echo "reproduce.sh: failed (rc $?): $*" >&2; rc=1; }
}
sweep() {  # one spec: experiments/paper/<name>.sweep.json -> OUT/<name>/
  local name=$1
  local flags=()
  # a spec without a "quick" variant runs whole in --quick too
  [ $mode = quick ] && grep -q '"quick"' "experiments/paper/$name.sweep.json" && flags+=(--quick)
  [ $mode = quick ] && flags+=(--repeats 1)  # one repeat of each point (Figs. 11/12's specs ask for 3)
  [ $dry -eq 1 ] && flags+=(--dry-run)
  step "sweep $name ($mode)"
  [ $dry -eq 0 ] && over_budget "sweep $name" && return 0
  if [ $dry -eq 1 ]; then
    "$bin/fd-bench" sweep "experiments/paper/$name.sweep.json" --out "$out/$name" "${flags[@]}" 2>&1 | sed 's/^/  /' || true
    return 0
  fi
  timeout "$run_timeout" "$bin/fd-bench" sweep "experiments/paper/$name.sweep.json" --out "$out/$name" "${flags[@]}" \
    || { echo "reproduce.sh: sweep $name failed (rc $?); its index.json says which points" >&2; rc=1; }
}
models="llama-2-7b llama-2-13b"
[ $mode = quick ] && models="llama-2-7b"

if has fig1; then step "fig1: computed from experiments/models/ (no runs)"; fi
if has fig3; then
  step "fig3: S-Part vs B (fd-spart-bench), decode attention vs B on the GPU (fd-kernel-bench) and the CPU (fd-attn-bench)"
  mkdir -p "$out/fig3"
  for m in $models; do
    run "$bin/fd-spart-bench" --model "experiments/models/$m.json" --out "$out/fig3/spart_$m.json"
  done
  if [ -x "$bin/fd-kernel-bench" ] || [ $dry -eq 1 ]; then
    run "$bin/fd-kernel-bench" --only decode-batch --json "$out/fig3/gpu_attention_vs_b.json"
  else
    echo "  fd-kernel-bench not built (no CUDA): the GPU attention curve is not measured" >&2
  fi
  bs="1 4 16 64 256"
  [ $mode = quick ] && bs="1 16 64 256"
  run "$bin/fd-attn-bench" --batch $bs --context 1024 --heads 32 --kv-heads 32 --head-dim 128 --kv-dtype fp16 \
    --json "$out/fig3/cpu_attention_vs_b.json"
fi
if has fig8; then
  for m in $models; do for e in fastdecode gpu-only; do sweep "fig8-$m-$e"; done; done
  sweep fig8-opt-175b-fastdecode   # the paper's Fig. 8 model (FastDecode only: GPU-only cannot hold it)
  sweep fig8-intercept-llama-2-7b  # the performance model's fixed per-step term (validation below)
  sweep fig8-llama-2-7b-hybrid     # beyond the paper: the hybrid engine (docs/HYBRID.md) beside GPU-only
fi
if has fig9 || has fig10; then
  step "fig9/fig10: every baseline engine (scripts/baselines-bench.sh)"
  if [ $dry -eq 1 ]; then
    echo "  would run: scripts/baselines-bench.sh $out/baselines balance steady life"
  elif [ $mode = quick ]; then
    MODELS_FULL=llama-2-7b MODELS_A10=llama-2-7b STEADY_BATCHES="64 1024" LIFE_BATCHES=32 LIFE_BALANCES=a10 \
      scripts/baselines-bench.sh "$out/baselines" steady life || rc=1
  else
    MODELS_FULL="llama-2-7b llama-2-13b" MODELS_A10=llama-2-7b LIFE_BALANCES="a10 full" \
      scripts/baselines-bench.sh "$out/baselines" balance steady life || rc=1
  fi
fi
has fig11 && sweep fig11-sls-s1024
has fig12 && sweep fig11-sls-s768
if has fig11 || has fig12; then
  # fd-sim's prediction beside each SLS run: a profile of this machine (T(B) of the CUDA S-Part; the runs' 4 R-workers
  # x 3 threads in service over their batches and contexts), then fd-sim on each point's experiment (analysis/sls_predict.py)
  step "fig11/fig12: profile and fd-sim predictions"
  prof="$out/profile_fig11_svc4x3.json"
  [ -f "$prof" ] || run "$bin/fd-bench" profile --backend cuda --model experiments/models/llama-2-7b.json --kv-dtypes fp16 \
    --r-threads 12 --batches 1 8 16 32 64 128 --service --rworkers 4 --rworker-threads 3 --first-cpu 0 \
    --service-batches 8 16 32 64 --contexts 128 512 1024 --reps 5 --out "$prof"
  run python3 analysis/sls_predict.py --paper "$out" --profile "$prof" --bin-dir "$bin"
fi
if has fig13; then
  sweep fig13-scaling-s1024
  [ $mode = full ] && sweep fig13-scaling-s128
fi
if has fig14; then
  # One GPU per rank: the T = 2 point is refused on one GPU, so the sweep runs only where two answer (issue 15).
  gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
  if [ "${gpus:-0}" -ge 2 ]; then
    sweep fig14-parallel
  else
    step "fig14: needs 2 GPUs (${gpus:-0} answer); experiments/paper/fig14-parallel.sweep.json is the spec (scripts/parallel-bench.sh on the two-GPU machine); nothing runs"
  fi
fi
if has fig15; then
  sweep fig15-breakdown
  # The same run behind emulated links (network namespaces + tc): only where this machine can make them.
  if ip netns add "fdprobe$$" 2>/dev/null; then
    ip netns del "fdprobe$$"
    sweep fig15-network
  else
    step "fig15-network: this machine cannot make network namespaces (root and iproute2 needed); nothing runs"
  fi
fi
if has balance; then
  sweep balance-map-fastdecode
  sweep balance-map-gpu-only
fi

step "figures and claims"
if [ $draw -eq 0 ]; then
  echo "  not drawn (--no-figures): python3 analysis/figures.py --paper $out --out $out/figures; python3 analysis/claims.py --paper $out --out $out/CLAIMS.md"
elif [ $dry -eq 1 ]; then
  echo "  would run: python3 analysis/figures.py --paper $out --out $out/figures; python3 analysis/claims.py --paper $out --out $out/CLAIMS.md;"
  echo "             python3 analysis/balance_map.py --paper $out --out $out/figures"
else
  base_args=()
  [ -d "$out/baselines" ] && base_args=(--baselines "$out/baselines")
  python3 analysis/figures.py --paper "$out" "${base_args[@]}" --out "$out/figures" || rc=1
  python3 analysis/claims.py --paper "$out" "${base_args[@]}" --out "$out/CLAIMS.md" || rc=1
  python3 analysis/balance_map.py --paper "$out" "${base_args[@]}" --out "$out/figures" || rc=1
  if [ -f "$out/profile_r12_ctx528.json" ]; then  # the performance model against every FastDecode run here
    fixed=()
    [ -d "$out/fig8-intercept-llama-2-7b" ] && fixed=(--fixed-from "$out/fig8-intercept-llama-2-7b")
    python3 analysis/perf_model_validation.py --r-from-run "${fixed[@]}" --profile "$out/profile_r12_ctx528.json" \
      --out "$out/validation" --runs-under "$out" || rc=1
  fi
fi
step "done (rc $rc)"
exit $rc
