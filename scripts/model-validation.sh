#!/usr/bin/env bash
# On the GPU machine: what the performance model needs from profiles alone, and fresh FastDecode runs to judge it by
# (issue 41; analysis/perf_model_validation.py). Stages (default: profile runs):
#   build    cmake --preset cuda + build
#   profile  fd-bench profile --backend cuda --service: T(B) of the CUDA S-Part (whole GPU and SM_COUNTS), R of the
#            kernel on RW_THREADS CPUs, and R of R-workers in service for each of SERVICE_CONFIGS (WORKERSxTHREADS,
#            pinned as hardware.rworkers pins them) over SERVICE_BATCHES x SERVICE_CONTEXTS, 2 layers, KV dtypes SERVICE_KV
#   balance  fd-kernel-bench --only balance: the HBM read rate per SM count (OUT/balance_bench.json)
#   crossover-predict  analysis/crossover.py predict from OUT's profiles and balance_bench.json ->
#            OUT/predictions_mem-M.json for each M of CROSSOVER_MEMS (GPU GB, default 24), before any run (the crossover
#            grid: SWEEPS="crossover-fastdecode crossover-gpu-only crossover-paged-swap", SERVICE_CONFIGS=5x3,
#            SERVICE_KV="fp16 int8 int4", SM_COUNTS=8; CROSSOVER_ONLY="kv=int4 b=256 ...": a subset, as sweep --only).
#            Its sweeps run once per M into OUT/runs/mem-M/.
#   runs     the runs to predict, on this commit: the baselines grid's FastDecode steady runs (full GPU, B in
#            STEADY_BATCHES), and the SWEEPS (default: the balance-map FastDecode grid and the fig8-intercept sweep)
#            (SWEEP_ARGS: more fd-bench sweep arguments for those, e.g. "--repeats 1")
#   pack     everything under OUT into PACK (a .tar.gz; for a machine that returns few files)
# Results: OUT/profile_*.json, OUT/runs/ (the run folders, traces dropped), OUT/*.log. A tree copied without git history
# records its commit from FD_GIT_COMMIT.
#   REPS: timed repetitions of each profiled point (default 5; medians)
#   MODEL: the model config profiled (default experiments/models/llama-2-7b.json; files are named after it), SVC_TAG: a
#   suffix for the service profiles' file names (e.g. a second grid of the same model), RWORKER_BINARY: the fd-rworker
#   the service profile spawns (another build's, for an A/B)
#   usage: [PACK=FILE] scripts/model-validation.sh OUT [stage...]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/model-validation}"
shift || true
stages="${*:-profile runs}"
mkdir -p "$out"
[ -f scripts/device-env.sh ] && [ -d .deps ] && source scripts/device-env.sh
export CUDACXX="${CUDACXX:-/usr/local/cuda/bin/nvcc}" OMP_WAIT_POLICY=PASSIVE
bin=build/cuda/bin
model="${MODEL:-experiments/models/llama-2-7b.json}"
mname=$(basename "$model" .json)
service_configs="${SERVICE_CONFIGS:-4x3 5x3 4x1}"
service_batches="${SERVICE_BATCHES:-16 64 256 1024}"
service_contexts="${SERVICE_CONTEXTS:-128 512 1024}"
service_kv="${SERVICE_KV:-fp16}"
sm_counts="${SM_COUNTS:-8 32}"
steady_batches="${STEADY_BATCHES-16 64 256 1024}"
rc=0
has() { [[ " $stages " == *" $1 "* ]]; }
if has build; then
  { cmake --preset cuda && cmake --build --preset cuda -j "$(nproc)"; } >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
  echo "build ok ($SECONDS s)"
fi
if has profile; then
  first=1
  for cfg in $service_configs; do
    w=${cfg%x*} t=${cfg#*x}
    # The whole GPU's T(B) once (with the first service config); the kernel R on the config's CPUs.
    $bin/fd-bench profile --backend cuda --model "$model" --kv-dtypes $service_kv --r-threads $((w * t)) \
      --batches 1 8 16 32 64 128 256 512 1024 --service --rworkers "$w" --rworker-threads "$t" --first-cpu 0 \
      --service-batches $service_batches --contexts $service_contexts --reps "${REPS:-5}" ${RWORKER_BINARY:+--rworker-binary $RWORKER_BINARY} \
      --out "$out/profile_${mname}_cuda_svc${cfg}${SVC_TAG:-}.json" >"$out/profile_${mname}_svc${cfg}${SVC_TAG:-}.log" 2>&1 || { rc=1; tail -5 "$out/profile_${mname}_svc${cfg}${SVC_TAG:-}.log"; }
    grep -E "service: |wrote" "$out/profile_${mname}_svc${cfg}${SVC_TAG:-}.log" | tail -24
    first=0
  done
  for sm in $sm_counts; do
    $bin/fd-bench profile --backend cuda --sm-count "$sm" --model "$model" --kv-dtypes fp16 --r-threads 12 \
      --batches 1 8 16 32 64 128 256 512 1024 --reps "${REPS:-5}" --out "$out/profile_${mname}_cuda_sm${sm}.json" \
      >"$out/profile_sm${sm}.log" 2>&1 || { rc=1; tail -5 "$out/profile_sm${sm}.log"; }
  done
  echo "profile done ($SECONDS s)"
fi
if has balance; then
  $bin/fd-kernel-bench --only balance --json "$out/balance_bench.json" >"$out/balance_bench.log" 2>&1 || { rc=1; tail -5 "$out/balance_bench.log"; }
  echo "balance done ($SECONDS s)"
fi
# The crossover grid's GPU memory caps (one predictions file and one runs folder each) and its --only subset.
crossover_mems="${CROSSOVER_MEMS:-24}"
only_args() {  # the CROSSOVER_ONLY entries (AXIS=LABEL[,LABEL...]) whose axis sweep $1 has, as --only arguments
  local o
  for o in ${CROSSOVER_ONLY-}; do grep -q "\"name\": \"${o%%=*}\"" "experiments/paper/$1.sweep.json" && printf -- '--only %s ' "$o"; done
}
if has crossover-predict; then
  # The predictions exist before the runs they predict (analysis/crossover.py's criteria are in the file).
  for M in $crossover_mems; do
    python3 analysis/crossover.py predict --fd-bench $bin/fd-bench --profiles "$out" --balance-bench "$out/balance_bench.json" \
      --memory-gb "$M" ${CROSSOVER_ONLY:+--only $CROSSOVER_ONLY} --out "$out/predictions_mem-$M.json" || rc=1
  done
  date -u +"predictions written %Y-%m-%dT%H:%M:%SZ"
fi
if has runs; then
  runs="$out/runs"
  mkdir -p "$runs/steady"
  for B in $steady_batches; do
    d="$runs/steady/fastdecode-b$B"
    timeout 150 $bin/fd-bench run experiments/baselines/llama-2-7b-fastdecode.json --set workload.requests=$B --out "$d" --quiet \
      >"$d.log" 2>&1 || { rc=1; echo "steady B=$B FAILED: $(tail -2 "$d.log" | tr '\n' ' ')"; }
    rm -f "$d/trace.json"
    echo "steady B=$B: $(grep -m1 -E 'tokens/s' "$d.log" | cut -c1-120)"
  done
  for s in ${SWEEPS-balance-map-fastdecode fig8-intercept-llama-2-7b}; do
    if [[ $s == crossover-* ]]; then  # once per GPU memory cap, into runs/mem-M/
      for M in $crossover_mems; do
        # shellcheck disable=SC2046
        $bin/fd-bench sweep "experiments/paper/$s.sweep.json" --out "$runs/mem-$M/$s" --set hardware.gpu.memory_gb="$M" \
          $(only_args "$s") --quiet >"$out/sweep_${s}_mem-$M.log" 2>&1 || rc=1
        find "$runs/mem-$M/$s" -name trace.json -delete
        echo "$s at $M GB: $(ls -d "$runs/mem-$M/$s"/*/rep* 2>/dev/null | wc -l) runs ($SECONDS s)"
      done
      continue
    fi
    # shellcheck disable=SC2086
    $bin/fd-bench sweep "experiments/paper/$s.sweep.json" --out "$runs/$s" --quiet ${SWEEP_ARGS:-} >"$out/sweep_$s.log" 2>&1 || rc=1
    find "$runs/$s" -name trace.json -delete
    echo "$s: $(ls -d "$runs/$s"/*/rep* 2>/dev/null | wc -l) runs ($SECONDS s)"
  done
fi
if has pack; then
  tar czf "${PACK:?pack needs PACK=FILE}" -C "$(dirname "$out")" "$(basename "$out")" && echo "packed $(du -h "$PACK" | cut -f1) into $PACK"
fi
exit $rc
