#!/usr/bin/env bash
# On the GPU machine: builds with the `cuda` preset (Debian packages unpacked in .deps/, see
# scripts/device-deps.sh) and runs the S-worker stages named on the command line (default: all):
#   build      cmake --preset cuda + build
#   tests      the gpu-labelled tests (CUDA S-Part, attention kernels, green contexts, GPU-only, FastDecode-CUDA, paged-swap,
#              host-offload, vanilla; GTEST_FILTER narrows them)
#              with FD_REQUIRE_GPU=1 (device-env.sh): no device is a failure, not a skip; prints the counts
#   kernels    fd-kernel-bench: decode/prefill attention and sampling kernels vs their ceilings
#   spart      fd-spart-bench: S-Part layer vs cuBLAS GEMMs alone, Llama-2-7b and Llama-3-8B, all SMs and 16 SMs,
#              and Llama-2-7b with bf16
#   profile    fd-bench profile --backend cuda (T(B) of the GPU S-Part with host transfers; R of the CPU kernel
#              per CPU, measured with 1, 6 and 12 CPUs together)
#   hf         tests/gpu/hf_engine_check.py: the engines' greedy tokens vs transformers (HF_MODELS, HF_ENGINES: its
#              --models and --engines; default FastDecode-CUDA and GPU-only)
#   quickstart the README's main job (CUDA S-Part when a GPU answers)
#   e2e        experiments/gpu/*.json: FastDecode vs GPU-only, full GPU and A10-like balance; then
#              analysis/e2e_report.py and analysis/perf_model_validation.py over the runs
# Results go to $1 (default results/gpu-sworker). A tree copied without git history records its commit
# from FD_GIT_COMMIT (set it when sending the tree).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/gpu-sworker}"
shift || true
stages="${*:-build tests kernels spart profile quickstart e2e}"
mkdir -p "$out"
source scripts/device-env.sh
export CUDACXX="${CUDACXX:-/usr/local/cuda/bin/nvcc}" OMP_WAIT_POLICY=PASSIVE
bin=build/cuda/bin
rc=0
has() { [[ " $stages " == *" $1 "* ]]; }
if has build; then
  { cmake --preset cuda && cmake --build --preset cuda -j "$(nproc)"; } >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
  echo "build ok"
fi
if has tests; then
  # Every gpu-labelled executable (GTEST_FILTER, read by GoogleTest itself, narrows them); counts summed over them.
  : >"$out/gpu_tests.log"
  for t in fd_gpu_tests fd_gpu_paged_swap_tests fd_gpu_host_offload_tests fd_gpu_vanilla_tests; do
    [ -x build/cuda/tests/$t ] || { echo "no build/cuda/tests/$t" | tee -a "$out/gpu_tests.log"; rc=1; continue; }
    build/cuda/tests/$t >>"$out/gpu_tests.log" 2>&1 || rc=1
  done
  grep -E "^\[  (PASSED|FAILED)|FAILED|rel err|divergence|not the reference|GB/s|SMs" "$out/gpu_tests.log" | head -60
  sum() { sed -n "$1" "$out/gpu_tests.log" | awk '{s += $1} END {print s + 0}'; }
  n_run=$(sum 's/^\[==========\] \([0-9]*\) tests\? from .* ran\..*/\1/p')
  n_pass=$(sum 's/^\[  PASSED  \] \([0-9]*\) tests\?\..*/\1/p')
  n_skip=$(sum 's/^\[  SKIPPED \] \([0-9]*\) tests\?, listed below.*/\1/p')
  n_fail=$(sum 's/^\[  FAILED  \] \([0-9]*\) tests\?, listed below.*/\1/p')
  echo "gpu tests (FD_REQUIRE_GPU=${FD_REQUIRE_GPU:-}${GTEST_FILTER:+, GTEST_FILTER=$GTEST_FILTER}): $n_run run, $n_pass passed, $n_skip skipped, $n_fail failed"
  grep -E "^\[  SKIPPED \] [^0-9]" "$out/gpu_tests.log" | sort -u | head -10
fi
if has kernels; then
  $bin/fd-kernel-bench --json "$out/kernel_bench.json" --benchmark_counters_tabular=true >"$out/kernel_bench.log" 2>&1 || rc=1
  cat "$out/kernel_bench.log"
fi
if has spart; then
  for m in llama-2-7b llama-3-8b; do
    $bin/fd-spart-bench --model experiments/models/$m.json --out "$out/spart_$m.json" || rc=1
  done
  $bin/fd-spart-bench --model experiments/models/llama-2-7b.json --sm-count 16 --out "$out/spart_llama-2-7b_16sm.json" || rc=1
  $bin/fd-spart-bench --model experiments/models/llama-2-7b.json --dtype bf16 --out "$out/spart_llama-2-7b_bf16.json" || rc=1
fi
if has profile; then
  for m in llama-2-7b llama-3-8b; do
    for rt in ${PROFILE_R_THREADS:-1 6 12}; do
      $bin/fd-bench profile --backend cuda --model experiments/models/$m.json --kv-dtypes fp16 --r-threads "$rt" \
        --batches 1 16 64 128 256 512 1024 --out "$out/profile_${m}_cuda_r$rt.json" >"$out/profile_${m}_r$rt.log" 2>&1 || rc=1
    done
  done
fi
if has hf; then
  python3 tests/gpu/hf_engine_check.py --bin-dir $bin ${HF_MODELS:+--models $HF_MODELS} ${HF_ENGINES:+--engines $HF_ENGINES} --out "$out/hf_engine_check.json" >"$out/hf_engine_check.log" 2>&1 || rc=1
  tail -12 "$out/hf_engine_check.log"
fi
if has quickstart; then
  $bin/fd-bench run experiments/quickstart.json --out "$out/quickstart" --quiet || rc=1
fi
if has e2e; then
  for f in ${E2E_CONFIGS:-experiments/gpu/*.json}; do
    n=$(basename "$f" .json)
    timeout 300 $bin/fd-bench run "$f" --out "$out/e2e/$n" --quiet >"$out/e2e_$n.log" 2>&1 || { rc=1; echo "$n failed"; tail -3 "$out/e2e_$n.log"; }
    grep -E "tokens/s|breakdown" "$out/e2e_$n.log" | head -2
    rm -f "$out/e2e/$n/trace.json"  # large; steps.jsonl keeps the per-step record
  done
  python3 analysis/e2e_report.py "$out"/e2e/* --out "$out" || rc=1
  ls "$out"/profile_*_cuda*.json >/dev/null 2>&1 && python3 analysis/perf_model_validation.py \
    $(for p in "$out"/profile_*_cuda*.json; do echo --profile "$p"; done) --out "$out" "$out"/e2e/* || rc=1
fi
exit $rc
