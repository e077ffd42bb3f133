#!/usr/bin/env bash
# Session 9, call 2: GEMM operands random instead of zeros (fd-spart-bench ceiling and S-Part inputs, fd-kernel-bench
# balance and gemm groups): A/B against a64f637 built in the same call; ncu of the S-Part at B = 512; the GEMM table
# re-tuned on random operands (compared, not installed); the fill's test, and planted red.
set -u
R=$OUT/r; mkdir -p $R
t0=$SECONDS; el() { echo "[$((SECONDS-t0)) s] $*" | tee -a $R/timeline.txt; }
tar xJf .devcarry/deps.tar.xz; source scripts/device-env.sh
export OMP_WAIT_POLICY=PASSIVE
mkdir -p /tmp/old && tar xJf .devcarry/old.tar.xz -C /tmp/old
{ cmake --preset cuda && cmake --build build/cuda -j10 --target fd-spart-bench fd-kernel-bench fd_gpu_tests; } > $R/build.log 2>&1 &
( cd /tmp/old && cmake --preset cuda > /dev/null && cmake --build build/cuda -j6 --target fd-spart-bench fd-kernel-bench ) > $R/build_old.log 2>&1 &
wait; el "builds done: $(tail -1 $R/build.log | cut -c1-80) / $(tail -1 $R/build_old.log | cut -c1-80)"
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/machine.txt; lscpu | grep "Model name" >> $R/machine.txt; date -u >> $R/machine.txt
timeout 60 build/cuda/tests/fd_gpu_tests --gtest_filter='*CudaElementwise*' > $R/gpu_tests.log 2>&1; el "gpu tests rc $?"
for round in 1 2; do
  for v in new old; do
    b=build/cuda/bin; [ $v = old ] && b=/tmp/old/build/cuda/bin
    for dt in fp16 bf16; do
      f=$R/spart-$v$round-$dt.json
      timeout 60 $b/fd-spart-bench --model experiments/models/llama-2-7b.json --dtype $dt --out $f > ${f%.json}.log 2>&1; el "spart $v$round $dt rc $?"
    done
    timeout 40 $b/fd-kernel-bench --only balance --json $R/balance-$v$round.json --benchmark_counters_tabular=true > $R/balance-$v$round.log 2>&1; el "balance $v$round rc $? $(grep -m1 gemm_fp16/all $R/balance-$v$round.log | cut -c1-120)"
  done
done
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 60 $ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page raw \
  --log-file $R/spart-ncu-new.csv build/cuda/bin/fd-spart-bench --model experiments/models/llama-2-7b.json --batches 256 512 1024 \
  --reps 1 --out $R/spart-ncu-new.json > $R/spart-ncu-new.log 2>&1; el "spart ncu rc $?"
timeout 150 build/cuda/bin/fd-spart-bench --model experiments/models/llama-2-7b.json --tune-gemm $R/gemm_table_random.json > $R/tune.log 2>&1; el "tune rc $?"
sed -i 's/seed \* 0x9e3779b97f4a7c15ull + i/(seed + 1) * 0x9e3779b97f4a7c15ull + i/' kernels/cuda/ceilings.cu
grep -n "seed + 1" kernels/cuda/ceilings.cu > $R/planted.txt
cmake --build build/cuda -j16 --target fd_gpu_tests > $R/build_planted.log 2>&1; el "planted build rc $?"
timeout 60 build/cuda/tests/fd_gpu_tests --gtest_filter='*UniformFill*' > $R/gpu_tests_planted.log 2>&1; el "planted tests rc $? (expect 1)"
el done
tar cJf $OUT/r.tar.xz -C $OUT r && rm -rf $R
