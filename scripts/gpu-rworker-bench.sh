#!/usr/bin/env bash
# R-worker benchmarks on the GPU machine's CPU (16 cores; PyTorch there, no package manager): builds
# with .deps/ (scripts/device-deps.sh), then runs, each under a time box so the whole fits one
# 10-minute device call:
#   fd-attn-bench   MHA 32/32 and GQA 32/8, d=128: AVX-512 (fp16/int8/int4) and AVX2 (fp16), each
#                   decode_attention benchmark right after its read_ceiling (same bytes, same threads)
#   bench_torch_sdpa.py  PyTorch CPU SDPA (bf16, fp16) on the same shapes and threads
#   fd-transport-bench   real ATTEND round trips (RWorkerClient -> echo R-worker processes) over TCP and
#                   IPC loopback, each right after its memcpy_ceiling
# The two fd-* programs write Google Benchmark JSON (provenance in its "context" as fd_* keys; docs/
# RWORKER.md, "Benchmarks"); analysis/rworker_report.py OUT makes the tables. Results go to $1 (default
# results/gpu-rworker-bench). A tree copied without git history records its commit from FD_GIT_COMMIT.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/gpu-rworker-bench}"
mkdir -p "$out"
source scripts/device-env.sh
export OMP_WAIT_POLICY=PASSIVE
T=$(nproc)
{ cmake --preset cpu && cmake --build --preset cpu -j "$T" --target fd-attn-bench fd-transport-bench; } >"$out/build.log" 2>&1 \
  || { tail -30 "$out/build.log"; exit 1; }
B=build/cpu/bin
rc=0
MHA=(--batch 1 16 64 256 1024 --context 128 512 2048 8192 --memory-gb 24)
GQA=(--heads 32 --kv-heads 8 --batch 1 16 64 256 --context 512 2048 8192 --memory-gb 24)
timeout 180 $B/fd-attn-bench --threads "$T" --isa avx512 --kv-dtype fp16 int8 int4 "${MHA[@]}" --json "$out/attn_mha_avx512.json" >"$out/attn.txt" 2>&1 || rc=1
timeout 50 $B/fd-attn-bench --threads "$T" --isa avx2 --kv-dtype fp16 "${MHA[@]}" --json "$out/attn_mha_avx2.json" >>"$out/attn.txt" 2>&1 || rc=1
timeout 80 $B/fd-attn-bench --threads "$T" --isa avx512 --kv-dtype fp16 int8 int4 "${GQA[@]}" --json "$out/attn_gqa_avx512.json" >>"$out/attn.txt" 2>&1 || rc=1
timeout 90 python3 tests/gpu/bench_torch_sdpa.py --threads "$T" --dtype bf16 fp16 --batch 1 16 64 256 1024 --context 128 512 2048 8192 --memory-gb 24 --json "$out/torch_sdpa_mha.json" >"$out/torch.txt" 2>&1 || rc=1
timeout 40 python3 tests/gpu/bench_torch_sdpa.py --threads "$T" --dtype bf16 fp16 --heads 32 --kv-heads 8 --batch 1 16 64 256 --context 512 2048 8192 --memory-gb 24 --json "$out/torch_sdpa_gqa.json" >>"$out/torch.txt" 2>&1 || rc=1
timeout 45 $B/fd-transport-bench --sizes 64K,1M,4M,32M --transports tcp,ipc --links 1,4 --io-threads 1,4 --time 0.1 --json "$out/transport.json" >"$out/transport.txt" 2>&1 || rc=1
tail -5 "$out/attn.txt" "$out/torch.txt" "$out/transport.txt"
python3 analysis/rworker_report.py "$out" --out "$out/REPORT.md" >/dev/null || rc=1
exit $rc
