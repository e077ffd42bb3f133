#!/usr/bin/env bash
# The accuracy study: how far do quantized KV-caches (and 16-bit S-Parts) move the logits?
#
#   scripts/accuracy-study.sh [--gpu] [--bin-dir DIR] [--out DIR] [--model CONFIG] [--weights-seed N]
#                             [--checkpoint DIR --score FILE] [--formats "F ..."] [--logits-requests N]
#
# 1. The fp32 reference engine generates greedy continuations of seeded prompts
#    (experiments/accuracy/generate.json); its requests.jsonl becomes a scoring file (prompt +
#    continuation).
# 2. Every variant scores exactly that stream (teacher forcing, experiments/accuracy/score.json) and
#    records every position's logits: the reference engine in fp32 (the baseline every row is compared
#    with) and with an fp16 KV-cache; FastDecode on the CPU S-Part with fp16, int8 and int4 R-worker
#    KV on the exact fp32 path (engine.rworkers.query: fp32), and int8 / int4 KV on the integer path (an
#    int8 query and 7-bit value weights, query: int8, the default on AVX512-VNNI CPUs: the -q8 rows);
#    with --gpu also FastDecode on the CUDA S-Part (fp16 and bf16, fp16/int8/int4 KV) and GPU-only
#    (fp16, bf16).
# 3. analysis/accuracy.py writes DIR/ACCURACY.md, accuracy.json and accuracy.png.
#    Every run also scores with the reference engine through each KV format of --formats (engine.kv_format:
#    kernels/cpu/kv_codec.h; default: every int8/int4 format listed there, served and study): the `ref-FORMAT` rows.
# PYTHON picks the interpreter (default /usr/bin/python3, with numpy). Random weights (the default) measure how far
# the arithmetic moves the logits, not language quality: --checkpoint DIR (a Hub-layout folder, e.g. one
# scripts/train-small-model.py wrote) with --score FILE (its held-out text as a scoring workload) skips step 1 and
# scores that file; then, when HF_PYTHON (default python3) has torch and transformers, scripts/hf-score.py adds
# transformers' own perplexity of the same file (DIR/hf_score.json). --logits-requests N writes full logits for the
# first N requests only (perplexity still counts every scored token: the "all scored tokens" columns).
set -euo pipefail
cd "$(dirname "$0")/.."
gpu=0 bin=build/default/bin out=results/accuracy-study score_in="" ckpt="" logits_n=""
formats="int8 int4 int4-ktoken int4-ktoken-rot int4-rot"
model=() # --set arguments of every run: the model config and the random weights' seed, or the checkpoint
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu) gpu=1 ;;
    --bin-dir) bin="$2"; shift ;;
    --out) out="$2"; shift ;;
    --model)
      [ -f "${2:-}" ] || { echo "accuracy-study: --model ${2:-}: no such file" >&2; exit 2; }
      model+=(--set "model.config=$(realpath "$2")"); shift ;;
    --checkpoint)
      [ -f "${2:-}/config.json" ] || { echo "accuracy-study: --checkpoint ${2:-}: no config.json there" >&2; exit 2; }
      ckpt="$(realpath "$2")"
      model+=(--set "model.config=$ckpt/config.json" --set "model.weights={\"dir\": \"$ckpt\"}"); shift ;;
    --score)
      [ -f "${2:-}" ] || { echo "accuracy-study: --score ${2:-}: no such file" >&2; exit 2; }
      score_in="$(realpath "$2")"; shift ;;
    --formats) formats="${2:-}"; shift ;;
    --logits-requests)
      [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] || { echo "accuracy-study: --logits-requests ${2:-}: not a positive number" >&2; exit 2; }
      logits_n="$2"; shift ;;
    --weights-seed)
      [[ "${2:-}" =~ ^[0-9]+$ ]] || { echo "accuracy-study: --weights-seed ${2:-}: not a number" >&2; exit 2; }
      model+=(--set "model.weights.seed=$2"); shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "accuracy-study: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
# Waiting OpenMP threads sleep: spinning ones (the default) starve the R-workers and each other when the cores are
# shared (measured on the 2-core dev VM with a build beside it: a reference-engine score run 86 s, 1.5 s passive).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
py="${PYTHON:-/usr/bin/python3}"; [ -x "$py" ] || command -v "$py" >/dev/null || py=python3
mkdir -p "$out"
runs="$out/runs"
rm -rf "$runs"; mkdir -p "$runs"
if [ -n "$ckpt" ] && [ -z "$score_in" ]; then echo "accuracy-study: --checkpoint needs --score FILE" >&2; exit 2; fi
if [ -n "$score_in" ]; then
  cp "$score_in" "$out/score.jsonl"
else
  echo "== generating the scored stream (reference engine, fp32)"
  "$bin/fd-bench" run experiments/accuracy/generate.json --out "$runs/generate" --quiet "${model[@]}"
  "$py" - "$runs/generate/requests.jsonl" "$out/score.jsonl" <<'PY'
import json, sys
with open(sys.argv[1]) as f, open(sys.argv[2], "w") as o:
    for line in f:
        r = json.loads(line)
        o.write(json.dumps({"prompt": r["prompt"], "continuation": r["tokens"]}) + "\n")
PY
fi
score="$(cd "$out" && pwd)/score.jsonl"
[ -n "$logits_n" ] && model+=(--set "output.logits.full=$logits_n")
if [ -n "$ckpt" ]; then
  if "${HF_PYTHON:-python3}" -c 'import torch, transformers' 2>/dev/null; then
    echo "== transformers' perplexity of the same file"
    "${HF_PYTHON:-python3}" scripts/hf-score.py --checkpoint "$ckpt" --score "$score" --out "$out/hf_score.json"
  else
    echo "== transformers' perplexity: skipped (${HF_PYTHON:-python3} lacks torch or transformers)"
  fi
fi
fdcpu='{"type":"fastdecode","backend":"cpu","mini_batches":2,"rworkers":{"spawn":2,"threads":1,"kv_dtype":"%s","query":"%s","memory_gb":0.5}}'
fd='{"type":"fastdecode","backend":"cuda","dtype":"%s","mini_batches":2,"rworkers":{"spawn":2,"threads":1,"kv_dtype":"%s","query":"fp32","memory_gb":0.5}}'
variants=(
  "reference-fp32|{\"type\":\"reference\"}"
  "reference-fp16kv|{\"type\":\"reference\",\"kv_dtype\":\"fp16\"}"
  $(for f in $formats; do echo "ref-$f|{\"type\":\"reference\",\"kv_format\":\"$f\"}"; done)
  "fd-cpu-fp16kv|$(printf "$fdcpu" fp16 fp32)"
  "fd-cpu-int8kv|$(printf "$fdcpu" int8 fp32)"
  "fd-cpu-int4kv|$(printf "$fdcpu" int4 fp32)"
  "fd-cpu-int8kv-q8|$(printf "$fdcpu" int8 int8)"
  "fd-cpu-int4kv-q8|$(printf "$fdcpu" int4 int8)"
)
if [ $gpu -eq 1 ]; then
  variants+=(
    "fd-cuda-fp16-fp16kv|$(printf "$fd" fp16 fp16)"
    "fd-cuda-fp16-int8kv|$(printf "$fd" fp16 int8)"
    "fd-cuda-fp16-int4kv|$(printf "$fd" fp16 int4)"
    "fd-cuda-bf16-fp16kv|$(printf "$fd" bf16 fp16)"
    "gpu-only-fp16|{\"type\":\"gpu-only\",\"dtype\":\"fp16\"}"
    "gpu-only-bf16|{\"type\":\"gpu-only\",\"dtype\":\"bf16\"}"
  )
fi
dirs=() labels=()
for v in "${variants[@]}"; do
  label="${v%%|*}" engine="${v#*|}"
  echo "== scoring: $label"
  "$bin/fd-bench" run experiments/accuracy/score.json --out "$runs/$label" --quiet \
    --set "workload.score=$score" --set "engine=$engine" "${model[@]}"
  dirs+=("$runs/$label") labels+=(--label "$label")
done
"$py" analysis/accuracy.py "${dirs[@]}" "${labels[@]}" --out "$out"
