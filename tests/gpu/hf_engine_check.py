#!/usr/bin/env python3
"""Check a FastDecode engine's greedy tokens against HuggingFace transformers on the same weights.

Run on the GPU machine (torch, transformers, numpy):

    python3 tests/gpu/hf_engine_check.py --bin-dir build/cuda/bin --out results/hf_engines.json

For each model spec NAME[:LAYERS] and each engine (ENGINES: fastdecode with the CUDA S-Part and 2 spawned
R-workers, fp16 wire, also as 2 tensor ranks and as 2 pipeline stages sharing GPU 0; gpu-only, also as 2 tensor
ranks on GPU 0 (the tensor-rank engines need Gloo: --bin-dir build/cuda-parallel/bin); paged-swap; host-offload;
hybrid; vanilla, LibTorch on the GPU):

1. ``fd-weights random --model CONFIG --seed S --dtype fp16 [--layers N] --out W``;
2. ``fd-bench run`` of a config on those weights: 4 requests, seeded 16-token prompts, 32 greedy
   tokens each (requests.jsonl records each prompt and its tokens);
3. HF (fp32, eager attention, TF32 off) runs one teacher-forced forward over prompt + tokens[:-1] per
   request: at every generated position the engine's token must be HF's argmax or, where it is not, a
   near-tie of HF's logits: (HF max - HF logit of the engine's token) <= NEAR_TIE * max|HF logit| with
   NEAR_TIE = 5e-3 (the engines compute in fp16 with fp32 accumulation; stages are within ~3e-4 of
   fp32, artifacts/sworker). Teacher forcing checks every position, also after a near-tie flip.

Writes one JSON file (--out) with per-(model, engine) results and provenance; exits 1 if any check
fails or errors.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hf_crosscheck as hc  # noqa: E402  (load_hf, hf_forward, run, parse_spec, provenance, log)

NEAR_TIE = 5e-3
_RW = {"spawn": 2, "threads": 2, "memory_gb": 2}
ENGINES = {
    "fastdecode-cuda": {"type": "fastdecode", "backend": "cuda", "wire_dtype": "fp16", "rworkers": _RW},
    "fastdecode-cuda-tp2": {"type": "fastdecode", "backend": "cuda", "wire_dtype": "fp16", "rworkers": _RW,
                            "cuda_graphs": False, "parallel": {"tensor": 2, "devices": [0, 0], "comm": "gloo"}},
    "fastdecode-cuda-pp2": {"type": "fastdecode", "backend": "cuda", "wire_dtype": "fp16", "rworkers": _RW,
                            "cuda_graphs": False, "parallel": {"pipeline": 2, "devices": [0, 0]}},
    "gpu-only": {"type": "gpu-only", "max_context": 64},
    "gpu-only-tp2": {"type": "gpu-only", "max_context": 64, "cuda_graphs": False,
                     "parallel": {"tensor": 2, "devices": [0, 0], "comm": "gloo"}},
    "paged-swap": {"type": "paged-swap"},
    "host-offload": {"type": "host-offload", "host_kv_gb": 1, "max_context": 64},
    "hybrid": {"type": "hybrid", "max_context": 64, "rworkers": _RW},
    "vanilla": {"type": "vanilla", "device": "cuda"},
}


def check(args, spec, engine, seed, device, tmp: Path) -> dict:
    label, config_path, layers = hc.parse_spec(spec)
    wdir, rdir = tmp / "w", tmp / "run"
    cmd = [args.bin_dir / "fd-weights", "random", "--model", config_path, "--seed", seed, "--dtype", "fp16",
           "--out", wdir]
    if layers is not None:
        cmd += ["--layers", layers]
    hc.run(cmd)
    cfg = {"name": f"hf-check-{engine}", "model": {"weights": {"dir": str(wdir)}},
           "workload": {"requests": 4, "prompt_len": 16, "gen_len": args.steps, "seed": seed},
           "sampling": {"temperature": 0}, "engine": ENGINES[engine]}
    (tmp / "config.json").write_text(json.dumps(cfg))
    hc.run([args.bin_dir / "fd-bench", "run", tmp / "config.json", "--out", rdir, "--quiet"])
    model, _ = hc.load_hf(wdir, device)
    rows = []
    ok = True
    for line in (rdir / "requests.jsonl").read_text().splitlines():
        r = json.loads(line)
        prompt, toks = r["prompt"], r["tokens"]
        logits = hc.hf_forward(model, prompt + toks[:-1], device)[len(prompt) - 1:]
        flips = []
        for i, t in enumerate(toks):
            row = logits[i]
            best = int(np.argmax(row))
            if best != t:
                gap = float(row[best] - row[t])
                rel = gap / max(float(np.max(np.abs(row))), 1e-30)
                flips.append({"index": i, "engine_token": t, "hf_token": best, "gap": gap, "gap_rel": rel})
                ok &= rel <= NEAR_TIE
        rows.append({"id": r["id"], "tokens": len(toks), "flips": flips})
    n = sum(x["tokens"] for x in rows)
    f = sum(len(x["flips"]) for x in rows)
    worst = max((fl["gap_rel"] for x in rows for fl in x["flips"]), default=0.0)
    hc.log(f"{label} {engine}: {n - f}/{n} tokens are HF's argmax; worst flip gap {worst:.2e} of max|logit| "
           f"({'pass' if ok else 'FAIL'})")
    return {"model": label, "engine": engine, "pass": ok, "tokens": n, "argmax_agree": n - f,
            "worst_flip_gap_rel": worst, "near_tie_bound": NEAR_TIE, "requests": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="FastDecode engines vs HF transformers (greedy, teacher-forced)")
    ap.add_argument("--bin-dir", type=Path, required=True)
    ap.add_argument("--models", default="tiny-llama,tiny-opt,tiny-llama-gqa,tiny-opt-350m,tiny-llama-bias,"
                    "llama-2-7b:2,llama-3-8b:2,opt-350m:2")
    ap.add_argument("--engines", default="fastdecode-cuda,gpu-only",
                    help=f"comma-separated, or 'all': {','.join(ENGINES)}")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    results = []
    for spec in args.models.split(","):
        for engine in (list(ENGINES) if args.engines == "all" else args.engines.split(",")):
            with tempfile.TemporaryDirectory() as t:
                try:
                    results.append(check(args, spec, engine, args.seed, device, Path(t)))
                except Exception as e:  # one failure does not stop the others
                    traceback.print_exc()
                    results.append({"model": spec, "engine": engine, "pass": False, "error": str(e)})
    out = {"results": results, "provenance": hc.provenance(sys.argv[1:])}
    out["provenance"]["command"] = " ".join([sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    for r in results:
        print(f"{r['model']:16s} {r['engine']:16s} {'pass' if r['pass'] else 'FAIL'} "
              f"{r.get('argmax_agree', '-')}/{r.get('tokens', '-')} argmax, worst flip {r.get('worst_flip_gap_rel', '-')}")
    return 0 if all(r["pass"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
