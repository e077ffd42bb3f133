#!/usr/bin/env python3
"""KV formats judged on a trained model: held-out perplexity over fp16 KV, per format and engine, against the
issue's criteria, and the int4 key format they choose.

    analysis/kv_formats.py STUDY_DIR [STUDY_DIR ...] --out DIR

Each STUDY_DIR is one model's `scripts/accuracy-study.sh --checkpoint CKPT --score FILE --out STUDY_DIR` (its
accuracy.json, runs/*/summary.json, hf_score.json when transformers ran) with the checkpoint's train_report.json
copied in (scripts/train-small-model.py: the variant, the held-out perplexity, K's outlier channels).

The criteria, written before any number was read (issue 44, "Done when"):
  * int8 KV: held-out perplexity at most +0.1 % over fp16 KV; int4 KV: at most +1 %. Judged per engine against the
    fp16-KV run of the same engine: FastDecode's R-workers (fd-cpu-*, fd-cuda-*) against their fp16-KV run, the
    reference engine's formats (ref-*) against reference-fp16kv.
  * The int4 key format is chosen by accuracy first: the int4 format with the lowest held-out perplexity on the
    reference engine, over all models (the mean of its relative Δ), unless it beats the served int4 by less than
    0.1 % of perplexity, in which case the served int4 stays (it has a kernel; speed decides among equals).
  * The reference engine is checked against transformers on the same file: |ppl_ref_fp32 / ppl_hf_fp32 - 1| <= 0.1 %
    (else the table says the two disagree, and why cannot be known from here).
Writes DIR/KV_FORMATS.md and DIR/kv_formats.json; prints the markdown.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

LIMITS = {"int8": 0.001, "int4": 0.01}
CHOOSE_MARGIN = 0.001
HF_AGREE = 0.001


class StudyError(Exception):
    pass


def kv_of(run):
    """(format, bits) of a run's KV: its kv_format (reference) or kv_dtype (FastDecode); None for fp16 / fp32."""
    f = run.get("kv_format") or run.get("kv_dtype")
    if not f or f in ("fp16", "fp32"):
        return None
    return f, "int8" if f.startswith("int8") else "int4" if f.startswith("int4") else None


def baseline_for(label):
    if label.startswith("ref-") or label.startswith("reference"):
        return "reference-fp16kv"
    for prefix in ("fd-cpu-", "fd-cuda-fp16-", "fd-cuda-bf16-"):
        if label.startswith(prefix):
            return prefix + "fp16kv"
    return None


def load_study(d):
    def read(name, required=True):
        p = os.path.join(d, name)
        if not os.path.isfile(p):
            if required:
                raise StudyError(f"{d}: no {name}")
            return None
        try:
            return json.load(open(p))
        except ValueError as e:
            raise StudyError(f"{p}: not JSON ({e})")
    acc, train, hf = read("accuracy.json"), read("train_report.json"), read("hf_score.json", False)
    runs = {}
    for r in acc:
        for side in ("ref", "run"):
            runs.setdefault(r[side]["label"], r[side])
        runs[r["run"]["label"]]["vs_fp32"] = r["measures"]
    for label, r in runs.items():
        if not r.get("scored_ppl"):
            raise StudyError(f"{d}: run {label} has no scored perplexity (summary.json score)")
    name = (train.get("model") or {}).get("variant") or train.get("variant") or os.path.basename(d)
    return {"dir": d, "runs": runs, "train": train, "hf": hf, "name": name}


def judge(study):
    runs, rows = study["runs"], []
    for label, r in runs.items():
        base = baseline_for(label)
        kv = kv_of(r)
        delta = None
        if base in runs:
            delta = r["scored_ppl"] / runs[base]["scored_ppl"] - 1
        row = {"label": label, "engine": r.get("engine"), "kv": (kv or ("fp16",))[0] if label != "reference-fp32" else "fp32",
               "ppl": r["scored_ppl"], "tokens": r.get("scored_tokens"), "baseline": base if base in runs else None,
               "delta": delta, "agreement_vs_fp32": (r.get("vs_fp32") or {}).get("token_agreement"),
               "kl_vs_fp32": (r.get("vs_fp32") or {}).get("kl_mean"), "limit": None, "verdict": None}
        if kv and kv[1] in LIMITS and delta is not None and label != base:
            row["limit"] = LIMITS[kv[1]]
            row["verdict"] = "met" if delta <= LIMITS[kv[1]] else "not met"
        rows.append(row)
    hf = study["hf"]
    check = None
    if hf and "fp32" in hf.get("runs", {}) and "reference-fp32" in runs:
        ratio = runs["reference-fp32"]["scored_ppl"] / hf["runs"]["fp32"]["perplexity"] - 1
        check = {"ref_over_hf": ratio, "agree": abs(ratio) <= HF_AGREE,
                 "hf": {k: v["perplexity"] for k, v in hf["runs"].items()}, "hf_tokens": hf.get("tokens")}
    return {"name": study["name"], "rows": rows, "hf_check": check, "train": study["train"]}


def choose(judged):
    """The int4 key format by accuracy on the reference engine (mean relative Δ over the models)."""
    per = {}
    for j in judged:
        for r in j["rows"]:
            if r["label"].startswith("ref-int4") and r["delta"] is not None:
                per.setdefault(r["kv"], []).append(r["delta"])
    complete = {f: sum(v) / len(v) for f, v in per.items() if len(v) == len(judged)}
    if "int4" not in complete:
        return None
    best = min(complete, key=complete.get)
    keep = best == "int4" or complete["int4"] - complete[best] < CHOOSE_MARGIN
    return {"mean_delta": complete, "best": best, "chosen": "int4" if keep else best,
            "reason": ("the served int4 is the most accurate" if best == "int4" else
                       f"{best} beats the served int4 by {100 * (complete['int4'] - complete[best]):.3f} % of perplexity, "
                       + ("under the 0.1 % margin: the served int4 stays" if keep else "at least the 0.1 % margin"))}


def pct(x):
    return "—" if x is None else f"{100 * x:+.3f} %"


def markdown(judged, chosen):
    out = ["# KV formats on a trained model (held-out perplexity)", "",
           "Generated by `analysis/kv_formats.py` from `scripts/accuracy-study.sh` runs; criteria in the script's "
           "header, written before the numbers. Δ = perplexity over the fp16-KV run of the same engine.", ""]
    for j in judged:
        t = j["train"]
        out += [f"## {j['name']}", ""]
        m, tr = t.get("model") or {}, t.get("training") or {}
        held = ((t.get("heldout_eval") or {}).get("checkpoint_fp32") or {})
        out.append(f"Trained here (scripts/train-small-model.py): {m.get('parameters', t.get('params', '?'))} parameters, "
                   f"{tr.get('tokens_seen', '?')} tokens in {tr.get('wall_time_s', float('nan')):.0f} s; held-out perplexity "
                   f"{held.get('perplexity', float('nan')):.4g} over {held.get('tokens_scored', '?')} tokens (transformers, fp32).")
        layers = (t.get("outliers") or {}).get("layers") or []
        if layers:
            ratio = lambda w: ", ".join(f"{row[w]['ratio_max_over_median']:.1f}" for row in layers)  # noqa: E731
            out.append(f"Outlier channels, largest / median channel max |x| per layer: K after RoPE {ratio('k_post_rope')}; "
                       f"K before RoPE {ratio('k_pre_rope')}; V {ratio('v')}.")
        c = j["hf_check"]
        if c:
            out.append(f"transformers on the same scored file: {', '.join(f'{k} {v:.5g}' for k, v in c['hf'].items())} "
                       f"({c['hf_tokens']} tokens); the reference engine in fp32 / transformers fp32 − 1 = "
                       f"{100 * c['ref_over_hf']:+.4f} % ({'agree' if c['agree'] else 'DISAGREE'} within 0.1 %).")
        out += ["", "| run | KV | held-out ppl | tokens | Δ vs fp16 KV | limit | verdict | token agreement vs fp32 | KL vs fp32 |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in j["rows"]:
            out.append(f"| {r['label']} | {r['kv']} | {r['ppl']:.5g} | {r['tokens']} | {pct(r['delta'])} | "
                       f"{pct(r['limit']) if r['limit'] else '—'} | {r['verdict'] or '—'} | "
                       f"{'—' if r['agreement_vs_fp32'] is None else format(r['agreement_vs_fp32'], '.4f')} | "
                       f"{'—' if r['kl_vs_fp32'] is None else format(r['kl_vs_fp32'], '.2e')} |")
        out.append("")
    if chosen:
        out += ["## The int4 key format", "", "Mean Δ over the models (reference engine): " +
                ", ".join(f"{f} {pct(v)}" for f, v in sorted(chosen["mean_delta"].items(), key=lambda x: x[1])) + ".",
                f"Chosen: **{chosen['chosen']}** ({chosen['reason']}).", ""]
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("studies", nargs="+", help="accuracy-study.sh output folders, one per model")
    ap.add_argument("--out", help="folder for KV_FORMATS.md and kv_formats.json")
    a = ap.parse_args(argv)
    try:
        judged = [judge(load_study(d)) for d in a.studies]
    except StudyError as e:
        print(f"kv_formats.py: {e}", file=sys.stderr)
        return 2
    chosen = choose(judged)
    md = markdown(judged, chosen)
    print(md)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        open(os.path.join(a.out, "KV_FORMATS.md"), "w").write(md + "\n")
        json.dump({"models": judged, "choice": chosen, "limits": LIMITS, "choose_margin": CHOOSE_MARGIN},
                  open(os.path.join(a.out, "kv_formats.json"), "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
