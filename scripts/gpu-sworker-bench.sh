#!/usr/bin/env bash
# On the GPU machine: builds with the `cuda` preset (Debian packages unpacked in .deps/, see
# scripts/device-deps.sh) and runs the S-worker stages named on the command line (default: all):
#   build      cmake --preset cuda + build
#   tests      the gpu-labelled tests (CUDA S-Part, attention kernels, green contexts, GPU-only, FastDecode-CUDA)
#   spart      fd-spart-bench: S-Part layer vs cuBLAS GEMMs alone, Llama-2-7b and Llama-3-8B, all SMs and 16 SMs
#   profile    fd-bench profile --backend cuda (T(B) of the GPU S-Part with host transfers; R of the CPU kernel)
#   quickstart the README's main job (CUDA S-Part when a GPU answers)
#   e2e        experiments/gpu/*.json: FastDecode vs GPU-only, full GPU and A10-like balance
# Results go to $1 (default results/gpu-sworker). A tree copied without git history records its commit
# from FD_GIT_COMMIT (set it when sending the tree).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/gpu-sworker}"
shift || true
stages="${*:-build tests spart profile quickstart e2e}"
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
  build/cuda/tests/fd_gpu_tests >"$out/gpu_tests.log" 2>&1 || rc=1
  grep -E "^\[  (PASSED|FAILED)|FAILED|rel err|divergence|GB/s|SMs" "$out/gpu_tests.log" | head -60
fi
if has spart; then
  for m in llama-2-7b llama-3-8b; do
    $bin/fd-spart-bench --model experiments/models/$m.json --out "$out/spart_$m.json" || rc=1
  done
  $bin/fd-spart-bench --model experiments/models/llama-2-7b.json --sm-count 16 --out "$out/spart_llama-2-7b_16sm.json" || rc=1
fi
if has profile; then
  $bin/fd-bench profile --backend cuda --model experiments/models/llama-2-7b.json --kv-dtypes fp16 int8 \
    --batches 1 16 64 128 256 512 1024 --out "$out/profile_llama-2-7b_cuda.json" >"$out/profile.log" 2>&1 || rc=1
  tail -3 "$out/profile.log"
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
fi
exit $rc
