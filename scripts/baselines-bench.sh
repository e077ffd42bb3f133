#!/usr/bin/env bash
# On the GPU machine: every engine of issue 12 on the same workloads (docs/BASELINES.md), the runs that
# analysis/fig_baselines.py draws as Fig. 9 and Fig. 10. Stages (default: all but build and tests):
#   build    cmake --preset cuda + build (LibTorch found through the Python on PATH, see baselines/vanilla)
#   tests    the baselines' gpu-labelled tests (FD_REQUIRE_GPU=1: no device is a failure) and the GPU-only /
#            FastDecode-CUDA engine tests
#   balance  fd-kernel-bench --only balance: HBM read rate and fp16 GEMM rate per SM count (which SM count
#            matches the A10's 125 TFLOP/s, which its 600 GB/s)
#   steady   throughput: steady-state decode windows (prompt 512, 32 new tokens: contexts 512-544, the mean
#            context of SLS at S = 1024), B swept (STEADY_BATCHES), every engine
#   life     latency over a sequence's life: prompts 16-64, 960 new tokens (sequences reach 976-1024
#            positions), B in LIFE_BATCHES, every engine
# Each run goes to OUT/<balance>/<model>/<window>/<engine>-b<B>/ (summary.json, steps.jsonl, requests.jsonl;
# trace.json is dropped); balance is "full" (the whole H200) or "a10" (24 GB, A10_SMS SMs: green context).
# Environment: MODELS_FULL / MODELS_A10 (which models at which balance; set empty for none), ENGINES, STEADY_BATCHES,
# LIFE_BATCHES, LIFE_BALANCES, RUN_TIMEOUT (s per run), TIME_BUDGET (s: no run starts after that many
# seconds of this script, so a caller with a hard limit keeps time to pack OUT; 0 = none). Runs whose
# folder has a summary.json are skipped (resumable). A tree copied without git history records its commit
# from FD_GIT_COMMIT.
#   usage: scripts/baselines-bench.sh OUT [stage...]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/baselines}"
shift || true
stages="${*:-balance steady life}"
mkdir -p "$out"
[ -f scripts/device-env.sh ] && [ -d .deps ] && source scripts/device-env.sh
export CUDACXX="${CUDACXX:-/usr/local/cuda/bin/nvcc}" OMP_WAIT_POLICY=PASSIVE
bin=build/cuda/bin
models_full="${MODELS_FULL-llama-2-7b}"  # set but empty: no model at that balance
models_a10="${MODELS_A10-llama-2-7b llama-2-13b}"
engines="${ENGINES:-fastdecode gpu-only paged-swap vanilla host-offload hf}"
steady_batches="${STEADY_BATCHES:-16 64 256 1024}"
life_batches="${LIFE_BATCHES:-32 128}"
life_balances="${LIFE_BALANCES:-a10}"
a10_sms="${A10_SMS:-16}"
run_timeout="${RUN_TIMEOUT:-150}"
time_budget="${TIME_BUDGET:-0}"
rc=0
has() { [[ " $stages " == *" $1 "* ]]; }

if has build; then
  { cmake --preset cuda && cmake --build --preset cuda -j "$(nproc)"; } >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
  grep -E "FastDecode: (vanilla|CUDA)" "$out/build.log" | head -3
  echo "build ok"
fi
if has tests; then
  for t in fd_gpu_paged_swap_tests fd_gpu_host_offload_tests fd_gpu_vanilla_tests fd_gpu_tests; do
    filter='*'
    [ "$t" = fd_gpu_tests ] && filter='*GpuEngines*:*GpuOnly*'
    [ -x build/cuda/tests/$t ] || { echo "$t: not built"; rc=1; continue; }
    build/cuda/tests/$t --gtest_filter="$filter" >"$out/$t.log" 2>&1 || rc=1
    echo "$t: $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]|^\[  SKIPPED \] [0-9]' "$out/$t.log" | tr '\n' ' ')"
    grep -E "^\[  FAILED  \] [A-Za-z]" "$out/$t.log" | head -10
  done
fi
if has balance; then
  $bin/fd-kernel-bench --only balance --json "$out/balance_bench.json" --benchmark_counters_tabular=true \
    >"$out/balance_bench.log" 2>&1 || rc=1
  grep -E "^balance" "$out/balance_bench.log"
fi

# The overrides that make B the batch of each engine: all engines get B requests; the engines with their own
# batch bound get it set to B (vLLM's max_num_seqs, vanilla's static batch).
batch_sets() {
  case "$1" in
    paged-swap) echo "--set engine.max_num_seqs=$2" ;;
    vanilla) echo "--set engine.batch_size=$2" ;;
    *) echo "" ;;
  esac
}
balance_sets() {
  [ "$1" = a10 ] && echo "--set hardware.gpu.memory_gb=24 --set hardware.gpu.sm_count=$a10_sms"
}
# One run: engine model balance window B.
one_run() {
  local engine=$1 model=$2 bal=$3 window=$4 B=$5
  local cfg="experiments/baselines/$model-$engine.json" dir="$out/$bal/$model/$window/$engine-b$B"
  local win_sets=""
  [ "$window" = life ] && win_sets="--set workload.prompt_len={\"min\":16,\"max\":64} --set workload.gen_len=960"
  [ -f "$dir/summary.json" ] && return 0  # resumable
  if [ "$time_budget" -gt 0 ] && [ "$SECONDS" -ge "$time_budget" ]; then
    echo "$bal $model $window $engine B=$B: not started (TIME_BUDGET $time_budget s spent)"
    return 0
  fi
  if [ "$engine" = hf ] && [ "$bal" != full ]; then
    echo "$bal $model $window hf B=$B: skipped (transformers cannot be held to the emulated balance; it runs at full only)"
    return 0
  fi
  mkdir -p "$(dirname "$dir")"
  local log="$dir.log" t0=$SECONDS
  if [ "$engine" = hf ]; then
    cfg="experiments/baselines/$model-gpu-only.json"  # the same model, weights and workload
    timeout "$run_timeout" python3 baselines/hf/run_hf.py "$cfg" --set workload.requests=$B $win_sets \
      $(balance_sets "$bal") --batch-size "$B" --bin-dir "$bin" --out "$dir" >"$log" 2>&1
  else
    timeout "$run_timeout" $bin/fd-bench run "$cfg" --set workload.requests=$B $win_sets $(batch_sets "$engine" "$B") \
      $(balance_sets "$bal") --out "$dir" --quiet >"$log" 2>&1
  fi
  local r=$?
  rm -f "$dir/trace.json"
  if [ $r -ne 0 ]; then
    echo "$bal $model $window $engine B=$B: FAILED (rc $r, $((SECONDS - t0)) s): $(tail -2 "$log" | tr '\n' ' ')"
    rc=1
  else
    echo "$bal $model $window $engine B=$B: $(grep -m1 -E 'tokens/s' "$log" | cut -c1-150) ($((SECONDS - t0)) s)"
  fi
}
sweep() {
  local window=$1 batches=$2 bal models
  for bal in full a10; do
    if [ "$window" = life ] && [[ " $life_balances " != *" $bal "* ]]; then continue; fi
    models=$models_full
    [ $bal = a10 ] && models=$models_a10
    for model in $models; do
      for B in $batches; do
        for engine in $engines; do one_run "$engine" "$model" "$bal" "$window" "$B"; done
      done
    done
  done
}
has steady && sweep steady "$steady_batches"
has life && sweep life "$life_batches"
exit $rc
