#!/usr/bin/env bash
# Issue 15's one command, for a machine with two GPUs or more (nvidia-h200-x2): builds the cuda-parallel preset
# (Gloo and NCCL), runs the parallel GPU tests, times one OPT-175b layer per tensor rank with its NCCL
# all-reduces (fd-spart-bench --tensor 1 and 2), and runs Fig. 14's sweep. Results under OUT (default
# results/parallel). NVLink multicast stays off in every process it starts.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/parallel}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
echo "parallel-bench: ${gpus:-0} GPU(s) answer"
cmake --preset cuda-parallel >/dev/null
cmake --build build/cuda-parallel -j"$(nproc)" --target fd_gpu_tests fd-bench fd-rworker fd-spart-bench
mkdir -p "$out"
FD_REQUIRE_NCCL=1 build/cuda-parallel/tests/fd_gpu_tests --gtest_filter='*Parallel*:Nccl*' | tee "$out/gpu_parallel_tests.txt"
for t in 1 2; do
  build/cuda-parallel/bin/fd-spart-bench --model experiments/models/opt-175b.json --batches 16 64 256 1024 \
    --tensor $t --out "$out/spart_opt175b_t$t.json"
done
if [ "${gpus:-0}" -ge 2 ]; then
  build/cuda-parallel/bin/fd-bench sweep experiments/paper/fig14-parallel.sweep.json --out "$out/fig14-parallel"
else
  echo "parallel-bench: Fig. 14's sweep needs 2 GPUs; not run"
fi
