#!/usr/bin/env python3
"""How much two runs' outputs differ: token agreement, KL, logit error and perplexity, per request and in all.

    analysis/accuracy.py RUN_A RUN_B [RUN_C ...] [--out DIR] [--label NAME ...]

Every run is compared with the first (the reference run, e.g. fp16 KV). The runs must have recorded
their logits (`output.logits` in the experiment config, docs/EXPERIMENTS.md): each run folder has
`logits.jsonl` (one line per recorded request: {"request": id, "tokens": [the tokens the run picked],
"forced": [the tokens it was fed instead], only in scoring runs}) and `logits/request_ID.npy` (fp32
[tokens, vocab], the full logits every pick was made from).

Measures, over the requests both runs recorded, position by position:
  agreement        share of positions where the two runs' tokens are equal, and each request's first
                   divergence (after it the greedy paths differ and the later positions compare different
                   contexts: run a scoring workload, `workload.score`, to compare the same token stream)
  KL               KL(P_ref || P_run) of the softmax of the logits, mean and max over positions
  logit error      max |logit_run - logit_ref| / max |logit_ref| per position, mean and max
  perplexity       exp(-mean log p(token)) under each run of the scored stream: the forced tokens of a
                   scoring run (the same for both runs, checked), else the reference run's picks
Only positions where both runs fed the same tokens so far are compared (all of them for scoring runs).

Prints a markdown table (and writes DIR/ACCURACY.md, DIR/accuracy.json and DIR/accuracy.png with --out).
Random weights say little about language quality: the table says so when the runs' weights are seeded.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np


class RunError(Exception):
    pass


def load_run(d):
    path = os.path.join(d, "logits.jsonl")
    if not os.path.isfile(path):
        raise RunError(f"{d}: no logits.jsonl (record logits with output.logits in the experiment config)")
    recs = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                r = json.loads(line)
            except ValueError as e:
                raise RunError(f"{path}:{n}: not JSON ({e})")
            if r.get("full") is False:  # recorded for its score only (output.logits.full = N): no full rows
                continue
            npy = os.path.join(d, "logits", f"request_{r['request']}.npy")
            if not os.path.isfile(npy):
                raise RunError(f"{path}:{n}: {npy} is missing")
            r["logits"] = np.load(npy).astype(np.float64)
            if r["logits"].shape[0] != len(r["tokens"]):
                raise RunError(f"{npy}: {r['logits'].shape[0]} rows for {len(r['tokens'])} tokens")
            forced = r.get("forced")
            if forced is not None and len(forced) != len(r["tokens"]):
                raise RunError(f"{path}:{n}: {len(forced)} forced tokens for {len(r['tokens'])} picks")
            recs[r["request"]] = r
    summary = {}
    sp = os.path.join(d, "summary.json")
    if os.path.isfile(sp):
        summary = json.load(open(sp))
    return {"dir": d, "requests": recs, "summary": summary}


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    z = x - m
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def compare(ref, run):
    """Per-position measures of `run` against `ref` over their common requests."""
    rows = []
    agree = total = 0
    kls, errs, lp_ref, lp_run = [], [], [], []
    for rid in sorted(set(ref["requests"]) & set(run["requests"])):
        a, b = ref["requests"][rid], run["requests"][rid]
        if a["logits"].shape[1] != b["logits"].shape[1]:
            raise RunError(f"request {rid}: vocabularies differ ({a['logits'].shape[1]} vs {b['logits'].shape[1]})")
        n = min(len(a["tokens"]), len(b["tokens"]))
        first = next((i for i in range(n) if a["tokens"][i] != b["tokens"][i]), None)
        fa, fb = a.get("forced"), b.get("forced")
        if (fa is None) != (fb is None):
            raise RunError(f"request {rid}: one run scored forced tokens, the other ran free: compare like with like")
        if fa is not None and list(fa) != list(fb):
            raise RunError(f"request {rid}: the two runs were forced through different tokens")
        forced = fa is not None
        same_prefix = n if (forced or first is None) else first + 1  # position `first` itself saw the same prefix
        la, lb = log_softmax(a["logits"][:same_prefix]), log_softmax(b["logits"][:same_prefix])
        kl = (np.exp(la) * (la - lb)).sum(axis=-1)
        scale = np.abs(a["logits"][:same_prefix]).max(axis=-1)
        err = np.abs(a["logits"][:same_prefix] - b["logits"][:same_prefix]).max(axis=-1) / np.maximum(scale, 1e-30)
        toks = np.array((fa if forced else a["tokens"])[:same_prefix])
        lp_ref += la[np.arange(same_prefix), toks].tolist()
        lp_run += lb[np.arange(same_prefix), toks].tolist()
        kls += kl.tolist()
        errs += err.tolist()
        eq = sum(int(a["tokens"][i] == b["tokens"][i]) for i in range(n))
        agree += eq
        total += n
        rows.append({"request": rid, "positions": n, "compared": same_prefix, "first_divergence": first,
                     "agreement": eq / n if n else 1.0, "kl_mean": float(kl.mean()) if len(kl) else 0.0,
                     "kl_max": float(kl.max()) if len(kl) else 0.0, "forced": bool(forced)})
    if not total:
        raise RunError(f"{ref['dir']} and {run['dir']} have no recorded request in common")
    ppl = lambda lp: math.exp(-sum(lp) / len(lp)) if lp else float("nan")  # noqa: E731
    return {
        "requests": len(rows), "positions": total, "compared_positions": len(kls),
        "token_agreement": agree / total,
        "first_divergences": [r["first_divergence"] for r in rows],
        "kl_mean": float(np.mean(kls)), "kl_max": float(np.max(kls)),
        "logit_rel_err_mean": float(np.mean(errs)), "logit_rel_err_max": float(np.max(errs)),
        "ppl_ref": ppl(lp_ref), "ppl_run": ppl(lp_run), "ppl_delta": ppl(lp_run) - ppl(lp_ref),
        "per_request": rows, "kl": kls,
    }


def describe(run, label):
    s = run["summary"]
    eng = s.get("config", {}).get("engine", {})
    w = s.get("config", {}).get("model", {}).get("weights", {})
    sc = s.get("score") or {}
    return {"label": label, "dir": run["dir"], "engine": s.get("engine"), "kv_dtype": eng.get("rworkers", {}).get("kv_dtype"),
            "kv_format": eng.get("kv_format"), "dtype": eng.get("dtype"), "random_weights": "seed" in w,
            "commit": s.get("provenance", {}).get("git_commit"),
            # every scored token of the run (summary.json "score"), also those whose logits were not recorded
            "scored_tokens": sc.get("tokens"), "scored_ppl": sc.get("perplexity")}


def table(results):
    scored = any(r["run"].get("scored_ppl") and r["ref"].get("scored_ppl") for r in results)
    lines = ["| run | vs | requests | positions compared | token agreement | KL mean | KL max | logit err mean | logit err max | ppl (ref → run) | ppl Δ (relative) |"
             + (" all scored tokens: ppl (ref → run) | Δ (relative) |" if scored else ""),
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- | --- |" if scored else "")]
    for r in results:
        m = r["measures"]
        row = (f"| {r['run']['label']} | {r['ref']['label']} | {m['requests']} | {m['compared_positions']} of {m['positions']} | "
               f"{m['token_agreement']:.4f} | {m['kl_mean']:.3e} | {m['kl_max']:.3e} | {m['logit_rel_err_mean']:.2e} | "
               f"{m['logit_rel_err_max']:.2e} | {m['ppl_ref']:.4g} → {m['ppl_run']:.4g} | "
               f"{m['ppl_delta'] / m['ppl_ref']:+.2e} |")
        if scored:
            a, b = r["ref"].get("scored_ppl"), r["run"].get("scored_ppl")
            row += (f" {a:.5g} → {b:.5g} ({r['run']['scored_tokens']} tokens) | {b / a - 1:+.2e} |" if a and b else " — | — |")
        lines.append(row)
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="run folders; the first is the reference")
    ap.add_argument("--label", action="append", default=[], help="a name per run (default: the folder name)")
    ap.add_argument("--out", help="folder for ACCURACY.md, accuracy.json, accuracy.png")
    a = ap.parse_args(argv)
    if len(a.runs) < 2:
        ap.error("give at least two runs: the reference and one to compare")
    if a.label and len(a.label) != len(a.runs):
        ap.error("give one --label per run")
    labels = a.label or [os.path.basename(os.path.normpath(d)) for d in a.runs]
    try:
        runs = [load_run(d) for d in a.runs]
        results = [{"ref": describe(runs[0], labels[0]), "run": describe(r, l), "measures": compare(runs[0], r)}
                    for r, l in zip(runs[1:], labels[1:])]
    except RunError as e:
        print(f"accuracy.py: {e}", file=sys.stderr)
        return 2
    lines = ["# Accuracy against " + labels[0], ""] + table(results)
    if any(r["run"]["random_weights"] or r["ref"]["random_weights"] for r in results):
        lines += ["", "The weights are seeded random ones: these numbers measure how far each run's arithmetic moves "
                      "the logits, not language quality. The tool works unchanged on a real checkpoint."]
    print("\n".join(lines))
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "ACCURACY.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
        slim = [{**r, "measures": {k: v for k, v in r["measures"].items() if k != "kl"}} for r in results]
        json.dump(slim, open(os.path.join(a.out, "accuracy.json"), "w"), indent=1)
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            fig, ax = plt.subplots(figsize=(6, 3.5))
            for r in results:
                kl = np.sort(np.maximum(np.array(r["measures"]["kl"]), 1e-300))
                ax.plot(kl, np.linspace(0, 1, len(kl)), label=r["run"]["label"])
            ax.set_xscale("log")
            ax.set_xlabel("KL(reference || run) per position")
            ax.set_ylabel("share of positions")
            ax.set_title("vs " + labels[0])
            ax.legend()
            fig.tight_layout()
            fig.savefig(os.path.join(a.out, "accuracy.png"), dpi=120)
        except ImportError:
            print("accuracy.py: matplotlib not installed: no figure", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
