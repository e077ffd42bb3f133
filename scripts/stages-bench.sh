#!/usr/bin/env bash
# Issue 18's measurements on the GPU machine, each against its same-run ceiling or peer (artifacts/stages/README.md):
#   quantize   fd-attn-bench --quantize: the KV quantizer, scalar vs AVX-512, one thread (OUT/quantize.json)
#   attn       fd-attn-bench, MHA 32/32 and GQA 32/8, fp16/int8/int4, every SIMD ISA the CPU has, all cores, B 64,
#              context 1024 and 4096 (OUT/attn_kv32.json, attn_kv8.json; with `perf stat` where perf exists: .perf)
#   transport  fd-transport-bench, 1 and 4 links, IPC, TCP and the shared-memory lane (copied in, and in place), 1 and 4
#              I/O threads, 1-32 MB
#              (OUT/transport.json)
#   prefill    experiments/gpu/prefill-kv-dtype.sweep.json + analysis/prefill_ttft.py (OUT/prefill/)
#   pipeline   experiments/gpu/pipeline-layers.sweep.json at 2 and 8 layers + analysis/pipeline_bound.py and
#              analysis/trace_tracks.py (OUT/pipeline/; the 8-layer run's trace kept as trace-layers-8.json.gz)
#   baselines  the GPU baselines' steady windows (gpu-only, paged-swap; Llama-2-7b, 2 layers, B 64/256/1024) and
#              the device's rates (scripts/baselines-bench.sh), then analysis/gpu_roofline.py (OUT/baselines/)
#   kernels    the same decode steps kernel by kernel under Nsight Compute (gpu-only B 64 and 252, paged-swap B 64 and
#              256) beside a run of each without it, then analysis/kernel_profile.py with the attention kernels against
#              the KV they read (the HBM rate from the baselines step, else fd-kernel-bench --only balance) (OUT/kernels/)
#   gemms      fd-kernel-bench --only gemm: the Llama-2-7b weight GEMMs at B 64, 256, 512, cuBLAS's default (what the
#              engines run) against every algorithm cuBLASLt's heuristic offers, each timed (OUT/gemm_algos.json)
#   spart      fd-spart-bench: one Llama-2-7b layer's S-Part (eagerly and from a CUDA graph) against its GEMMs alone,
#              B 1-1024, fp16 and bf16 (OUT/spart_llama-2-7b.json, spart_llama-2-7b_bf16.json)
# Then analysis/stages_targets.py gives every target's verdict with this run's results where it has them
# (OUT/TARGETS.md; the committed results for the rest).
# Every step writes its provenance (commit, command, CPU, GPU, date) beside its result; sweeps' run folders are
# packed (analysis/pack_runs.py) and the whole OUT is tarred into OUT.tar.xz at the end (the device machine copies
# back only two folder levels). One device call runs at most 10 minutes: pick steps with --steps.
# Usage: scripts/stages-bench.sh OUT [--steps quantize,attn,transport,prefill,pipeline,baselines,kernels,gemms,spart]
#        [--quick]
#   --quick: attn at context 1024 only, transport at 4 and 16 MB only, pipeline at 8 layers only.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: scripts/stages-bench.sh OUT [--steps LIST] [--quick]}"
shift
steps="quantize,attn,transport,prefill,pipeline" quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="${2:?--steps needs a comma-separated list}"; shift 2 ;;
    --quick) quick=1; shift ;;
    *) echo "stages-bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
for s in ${steps//,/ }; do
  case "$s" in quantize|attn|transport|prefill|pipeline|baselines|kernels|gemms|spart) ;; *) echo "stages-bench.sh: unknown step $s" >&2; exit 2 ;; esac
done
bin=${BIN:-build/cuda/bin}
has() { [[ ",$steps," == *",$1,"* ]]; }
need=(fd-bench)  # the programs the chosen steps run
{ has quantize || has attn; } && need+=(fd-attn-bench)
has transport && need+=(fd-transport-bench)
{ has baselines || has kernels || has gemms; } && need+=(fd-kernel-bench)
has spart && need+=(fd-spart-bench)
for p in "${need[@]}"; do
  [ -x "$bin/$p" ] || { echo "stages-bench.sh: no $bin/$p (build it: cmake --preset cuda && cmake --build build/cuda --target fd-bench fd-rworker fd-attn-bench fd-transport-bench fd-kernel-bench)" >&2; exit 2; }
done
mkdir -p "$out"
commit=${LOCAL_HEAD:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
prov() {  # prov FILE COMMAND...
  local f=$1; shift
  python3 - "$f" "$commit" "$*" <<'PY'
import json, os, subprocess, sys, datetime
def sh(c):
    try:
        return subprocess.run(c, shell=True, capture_output=True, text=True).stdout.strip()
    except Exception:
        return ""
cpu = next((l.split(":", 1)[1].strip() for l in sh("lscpu").splitlines() if l.startswith("Model name")), "")
json.dump({"commit": sys.argv[2], "command": sys.argv[3], "cpu": cpu, "cores": os.cpu_count(),
           "gpu": sh("nvidia-smi --query-gpu=name --format=csv,noheader | head -1"),
           "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}, open(sys.argv[1], "w"), indent=1)
PY
}
rc=0 t0=$SECONDS
step() { echo "== $1 ($((SECONDS - t0)) s)"; }
perf_stat() {  # perf_stat FILE COMMAND...: the command under perf stat where perf works, else as it is
  local f=$1; shift
  if command -v perf >/dev/null && perf stat -e cycles true >/dev/null 2>&1; then
    perf stat -e cycles,instructions,task-clock -o "$f" -- "$@"
  else
    "$@"
  fi
}
if has quantize; then
  step quantize
  cmd=("$bin/fd-attn-bench" --quantize --isa scalar avx512 --kv-dtype fp16 int8 int4 --batch 1 --context 64 --threads 1
       --reps 10 --benchmark_filter=kv_quantize --json "$out/quantize.json")
  prov "$out/quantize_provenance.json" "${cmd[*]}"
  "${cmd[@]}" > "$out/quantize.txt" 2>&1 || rc=1
fi
if has attn; then
  step attn
  isas=(avx2 avx512 avx512vnni)  # one the CPU lacks is skipped and listed in the JSON's context.fd_skipped
  ctx=(1024 4096); ((quick)) && ctx=(1024)
  for kvh in 32 8; do
    cmd=("$bin/fd-attn-bench" --heads 32 --kv-heads "$kvh" --head-dim 128 --kv-dtype fp16 int8 int4 --isa "${isas[@]}"
         --threads "$(nproc)" --batch 64 --context "${ctx[@]}" --json "$out/attn_kv$kvh.json")
    prov "$out/attn_kv${kvh}_provenance.json" "${cmd[*]}"
    perf_stat "$out/attn_kv$kvh.perf" "${cmd[@]}" > "$out/attn_kv$kvh.txt" 2>&1 || rc=1
  done
fi
if has transport; then
  step transport
  sizes=(1M 4M 16M 32M); ((quick)) && sizes=(4M 16M)
  cmd=("$bin/fd-transport-bench" --sizes "${sizes[@]}" --transports ipc tcp shm shm-inplace --io-threads 1 4 --links 1 4 --json "$out/transport.json")
  prov "$out/transport_provenance.json" "${cmd[*]}"
  "${cmd[@]}" > "$out/transport.txt" 2>&1 || rc=1
fi
if has prefill; then
  step prefill
  "$bin/fd-bench" sweep experiments/gpu/prefill-kv-dtype.sweep.json --out "$out/prefill" > "$out/prefill.log" 2>&1 || rc=1
  python3 analysis/pack_runs.py "$out/prefill" > /dev/null || rc=1
  python3 analysis/prefill_ttft.py "$out/prefill" || rc=1
fi
if has pipeline; then
  step pipeline
  layers="layers=2,8"; ((quick)) && layers="layers=8"
  "$bin/fd-bench" sweep experiments/gpu/pipeline-layers.sweep.json --out "$out/pipeline" --only "$layers" > "$out/pipeline.log" 2>&1 || rc=1
  # The traces' tracks (a CUDA stream per mini-batch, an R-worker each), then one trace kept (gzip) to open in Perfetto.
  python3 analysis/trace_tracks.py "$out/pipeline" --out "$out/pipeline" > /dev/null || rc=1
  keep=$(find "$out/pipeline" -path "*layers-8*" -name trace.json | head -1)
  [ -n "$keep" ] && gzip -c "$keep" > "$out/pipeline/trace-layers-8.json.gz"
  find "$out/pipeline" -name trace.json -delete
  python3 analysis/pack_runs.py "$out/pipeline" > /dev/null || rc=1
  python3 analysis/pipeline_bound.py "$out/pipeline" || rc=1
fi
if has baselines; then
  step baselines
  MODELS_FULL=llama-2-7b MODELS_A10="" ENGINES="gpu-only paged-swap" STEADY_BATCHES="64 256 1024" \
    scripts/baselines-bench.sh "$out/baselines" balance steady > "$out/baselines.log" 2>&1 || rc=1
  python3 analysis/gpu_roofline.py --baselines "$out/baselines" --balance-bench "$out/baselines/balance_bench.json" \
    --out "$out/baselines" || rc=1
fi
if has kernels; then
  step kernels
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  mkdir -p "$out/kernels"
  csvs=() runs=()
  for er in gpu-only:64 gpu-only:252 paged-swap:64 paged-swap:256; do
    e=${er%%:*} B=${er##*:}
    cfg="experiments/baselines/llama-2-7b-$e.json"
    sets=(--set workload.requests="$B" --set workload.gen_len=8)
    [ "$e" = paged-swap ] && sets+=(--set engine.max_num_seqs="$B")
    "$bin/fd-bench" run "$cfg" "${sets[@]}" --out "$out/kernels/$e-b$B" --quiet > "$out/kernels/$e-b$B.log" 2>&1 || rc=1
    rm -f "$out/kernels/$e-b$B/trace.json"
    if [ -n "$ncu" ]; then
      cmd=("$ncu" --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page raw
           --log-file "$out/kernels/$e-b$B.csv" "$bin/fd-bench" run "$cfg" "${sets[@]}" --out "$out/kernels/ncu-$e-b$B" --quiet)
      prov "$out/kernels/$e-b${B}_provenance.json" "${cmd[*]}"
      "${cmd[@]}" > "$out/kernels/ncu-$e-b$B.log" 2>&1 || rc=1
      rm -rf "$out/kernels/ncu-$e-b$B"
      csvs+=("$out/kernels/$e-b$B.csv") runs+=("$out/kernels/$e-b$B")
    else
      echo "kernels: no ncu on this machine" >&2; rc=1
    fi
  done
  # The HBM read rate for the attention kernels' roofline: the baselines step's, else measured here.
  bal="$out/baselines/balance_bench.json"
  if [ ! -f "$bal" ]; then
    bal="$out/kernels/balance_bench.json"
    "$bin/fd-kernel-bench" --only balance --json "$bal" > "$out/kernels/balance_bench.log" 2>&1 || rc=1
  fi
  ((${#csvs[@]})) && { python3 analysis/kernel_profile.py "${csvs[@]}" --runs "${runs[@]}" --balance "$bal" --out "$out/kernels" || rc=1; }
fi
if has gemms; then
  step gemms
  cmd=("$bin/fd-kernel-bench" --only gemm --json "$out/gemm_algos.json" --benchmark_counters_tabular=true)
  prov "$out/gemm_algos_provenance.json" "${cmd[*]}"
  "${cmd[@]}" > "$out/gemm_algos.log" 2>&1 || rc=1
  grep -E "^gemm/" "$out/gemm_algos.log"
fi
if has spart; then
  step spart
  for dt in fp16 bf16; do
    f="$out/spart_llama-2-7b$([ $dt = bf16 ] && echo _bf16).json"
    "$bin/fd-spart-bench" --model experiments/models/llama-2-7b.json --dtype $dt --out "$f" > "${f%.json}.log" 2>&1 || rc=1
    cat "${f%.json}.log"
  done
fi
# The targets' verdicts with this run's results where it has them (the committed ones elsewhere): OUT/TARGETS.md.
targets=()
[ -f "$out/prefill/prefill_ttft.json" ] && targets+=(--prefill "$out/prefill/prefill_ttft.json")
[ -f "$out/pipeline/pipeline_bound.json" ] && targets+=(--pipeline "$out/pipeline/pipeline_bound.json")
[ -f "$out/pipeline/trace_tracks.json" ] && targets+=(--trace "$out/pipeline/trace_tracks.json")
[ -f "$out/transport.json" ] && targets+=(--transport "$out/transport.json")
[ -f "$out/baselines/gpu_roofline.json" ] && targets+=(--roofline "$out/baselines/gpu_roofline.json")
[ -f "$out/kernels/kernel_profile.json" ] && targets+=(--kernels "$out/kernels/kernel_profile.json")
[ -f "$out/spart_llama-2-7b.json" ] && [ -f "$out/spart_llama-2-7b_bf16.json" ] &&
  targets+=(--spart "$out/spart_llama-2-7b.json" "$out/spart_llama-2-7b_bf16.json")
attn=()
for f in "$out"/attn_kv32.json "$out"/attn_kv8.json; do [ -f "$f" ] && attn+=("$f"); done
((${#attn[@]})) && targets+=(--attn "${attn[@]}")
if ((${#targets[@]})); then
  step targets
  python3 analysis/stages_targets.py "${targets[@]}" --out "$out" > /dev/null || rc=1
  grep -E "targets met" "$out/TARGETS.md"
fi
step "tar $out.tar.xz"
tar cJf "$out.tar.xz" -C "$(dirname "$out")" "$(basename "$out")" || rc=1
step "done (rc $rc)"
exit $rc
