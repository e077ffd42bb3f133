#!/usr/bin/env python3
"""transformers' own perplexity of a scoring workload: the external judge beside fd-bench's score runs.

    hf-score.py --checkpoint DIR --score score.jsonl --out hf_score.json [--dtype fp32|fp16|both] [--device cuda|cpu]

score.jsonl is fd-bench's workload.score file ({"prompt": [ids], "continuation": [ids]} a line). Each request is one
forward of prompt + continuation through AutoModelForCausalLM (eager attention, no KV-cache: the logits of every
position at once); its score is the log-probability of each continuation token given everything before it, in
double precision, as fd-bench scores it (docs/EXPERIMENTS.md). Writes {"checkpoint", "requests", "tokens",
"runs": {dtype: {"nll_sum", "mean_nll", "perplexity", "per_request": [...]}}, "versions"}.
Needs torch and transformers (the GPU machine has them); exits 2 with a message when they are missing.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys


def load_score(path):
    reqs = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                p, c = [int(t) for t in r["prompt"]], [int(t) for t in r["continuation"]]
            except (ValueError, KeyError, TypeError) as e:
                raise SystemExit(f"hf-score: {path}:{n}: not a score line ({e})")
            if not p or not c:
                raise SystemExit(f"hf-score: {path}:{n}: empty prompt or continuation")
            reqs.append((p, c))
    if not reqs:
        raise SystemExit(f"hf-score: {path}: no requests")
    return reqs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True, help="a Hub-layout folder (config.json + model.safetensors)")
    ap.add_argument("--score", required=True, help="fd-bench workload.score JSONL")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--dtype", choices=["fp32", "fp16", "both"], default="both")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    a = ap.parse_args(argv)
    if not os.path.isfile(os.path.join(a.checkpoint, "config.json")):
        print(f"hf-score: {a.checkpoint}: no config.json", file=sys.stderr)
        return 2
    reqs = load_score(a.score)
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"hf-score: needs torch and transformers ({e})", file=sys.stderr)
        return 2
    dev = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = {"checkpoint": os.path.abspath(a.checkpoint), "score": os.path.abspath(a.score), "requests": len(reqs),
           "tokens": sum(len(c) for _, c in reqs), "device": dev, "runs": {},
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
    for dt in (["fp32", "fp16"] if a.dtype == "both" else [a.dtype]):
        tdt = torch.float32 if dt == "fp32" else torch.float16
        model = transformers.AutoModelForCausalLM.from_pretrained(a.checkpoint, torch_dtype=tdt,
                                                                  attn_implementation="eager").to(dev).eval()
        per, total, count = [], 0.0, 0
        with torch.no_grad():
            for p, c in reqs:
                ids = torch.tensor([p + c], device=dev)
                logits = model(ids).logits[0].double()
                lp = torch.log_softmax(logits, dim=-1)
                pos = torch.arange(len(p) - 1, len(p) + len(c) - 1, device=dev)
                nll = -lp[pos, torch.tensor(c, device=dev)].sum().item()
                per.append({"tokens": len(c), "nll_sum": nll, "ppl": math.exp(nll / len(c))})
                total += nll
                count += len(c)
        out["runs"][dt] = {"nll_sum": total, "mean_nll": total / count, "perplexity": math.exp(total / count),
                           "per_request": per}
        print(f"hf-score: transformers {dt}: perplexity {math.exp(total / count):.5g} over {count} tokens")
        del model
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
