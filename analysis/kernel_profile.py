#!/usr/bin/env python3
"""Where a GPU decode step's device time goes, kernel by kernel (issue 18): reads Nsight Compute's raw CSV of a greedy
GPU run (`ncu --metrics gpu__time_duration.sum --csv --page raw --log-file F.csv fd-bench run ...`; scripts/
stages-bench.sh --steps kernels), cuts the kernels into steps at each argmax (greedy sampling ends every step), keeps
the decode steps (those with a decode attention kernel and no prefill one) that ran the most common kernel sequence
(the steady batch), and prints per kernel name its median time
per step (all its launches in the step summed), its launches per step and its share of the step's kernel time, and
the sums by phase (attention, cuBLAS GEMMs, the other kernels). Under
ncu the kernels run one at a time with nothing else on the device: the sum is the step's kernel time without launch
gaps or overlap; set against the wall time of the same configuration's decode steps in a run without ncu (`--runs`: its
median step at its steady batch, fd_runs.steady_steps), the difference is launch gaps and the host's work per step.
With --balance (fd-kernel-bench --only balance JSON of the same machine: its HBM read rate BW) the attention kernels
are also set against their own roofline, the KV they must read (issue 18: "the same for the paged-swap baseline's
attention kernel"): attention_roofline = L * b * ctx * kv / BW, with L the run's layers, b its steady batch, ctx the
mean context of those steps (total_context / decode_tokens, median over the steps) and kv the fp16 KV bytes per
token and layer (analysis/shapes.py). MODELLED is the roofline; the kernel times are measured.

usage: analysis/kernel_profile.py CSV... [--runs RUN_DIR...] [--balance JSON] [--out DIR]
"""
import argparse
import csv
import gzip
import os
import statistics
import sys

from fd_runs import decode_steps, read_json, read_jsonl, steady_steps, write_report
from shapes import SHAPES

DECODE_ATTENTION = ("decode_split_kernel", "decode_combine_kernel")  # contiguous and paged (one kernel, two paths)
PREFILL = ("prefill_kernel",)
END = "argmax_kernel"


def short(name):
    """A kernel's name without its return type, namespaces, template arguments and parameters ("void
    fd::<unnamed>::decode_split_kernel<128, 1, 0>(fd::<unnamed>::DecodeArgs)" -> "decode_split_kernel"; cuBLAS's
    nvjet kernels keep their whole name, which says the tile)."""
    base = name.split("(")[0].strip()
    if base.startswith("void "):
        base = base[5:]
    return base.rsplit("::", 1)[-1].split("<")[0].strip() or name


def read_kernels(path):
    """[(kernel name, ns)] in launch order from ncu's raw CSV, or its .gz (a units row after the header, values may use ',')."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="", encoding="utf-8", errors="replace") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own log lines ("==PROF==") are not CSV
    rows = list(csv.reader(lines))
    if not rows:
        return []
    head = rows[0]
    try:
        ki, ti = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
    except ValueError:
        raise SystemExit("kernel_profile: %s has no 'Kernel Name' / 'gpu__time_duration.sum' columns" % path)
    scale = 1.0
    out = []
    for r in rows[1:]:
        if len(r) <= max(ki, ti):
            continue
        v = r[ti].replace(",", "")
        if not r[ki]:  # the units row
            scale = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}.get(v.strip(), 1.0)
            continue
        try:
            out.append((r[ki], float(v) * scale))
        except ValueError:
            continue
    return out


def steps(kernels):
    """The decode steps: runs of kernels ending at an argmax, with a decode attention kernel and no prefill one."""
    cur, out = [], []
    for name, ns in kernels:
        n = short(name)
        cur.append((n, ns))
        if n == END:
            names = {n for n, _ in cur}
            if any(n in names for n in DECODE_ATTENTION) and not any(n in names for n in PREFILL):
                out.append(cur)
            cur = []
    return out


def group(name):
    """The phase a kernel belongs to: attention (the decode split and combine kernels), gemm (cuBLAS: nvjet / gemm /
    splitK kernels) or other (norms, RoPE, embedding, casts, sampling)."""
    if name in DECODE_ATTENTION:
        return "attention"
    if name.startswith("nvjet") or "gemm" in name.lower() or "splitK" in name:
        return "gemm"
    return "other"


def profile(path):
    """The steady decode steps of one CSV: those whose kernel sequence is the most common one (a run's first decode
    step and its tail run other batch sizes, for which cuBLAS may pick other kernels)."""
    every = steps(read_kernels(path))
    if not every:
        return None
    sigs = [tuple(n for n, _ in s) for s in every]
    common = max(set(sigs), key=lambda g: (sigs.count(g), len(g)))
    dec = [s for s, g in zip(every, sigs) if g == common]
    names = []
    for n in common:
        if n not in names:
            names.append(n)
    per = {n: [sum(ns for m, ns in s if m == n) for s in dec] for n in names}
    total = [sum(ns for _, ns in s) for s in dec]
    kernels = [{"name": n, "ms": statistics.median(per[n]) / 1e6, "launches": common.count(n)} for n in names]
    groups = {}
    for k in kernels:
        groups[group(k["name"])] = groups.get(group(k["name"]), 0.0) + k["ms"]
    return {"file": os.path.basename(path), "steps": len(dec), "decode_steps": len(every),
            "total_ms": statistics.median(total) / 1e6, "groups_ms": groups, "kernels": kernels}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--runs", nargs="*", default=[],
                    help="a run folder of the same configuration without ncu, one per CSV (its median decode step)")
    ap.add_argument("--balance", default=None, help="fd-kernel-bench --only balance JSON (HBM read rate) of the same machine")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    bw = None
    if a.balance:
        bw = next((b["bytes_per_second"] for b in read_json(a.balance)["benchmarks"]
                   if b["name"].startswith("balance/read/all/")), None)
    lines, data = ["# Decode step kernels (analysis/kernel_profile.py; ncu gpu__time_duration, kernels serialised)", ""], []
    for i, path in enumerate(a.csv):
        p = profile(path)
        if not p:
            print("kernel_profile: no decode step in %s" % path, file=sys.stderr)
            continue
        ev = None
        if i < len(a.runs):
            dec = steady_steps(decode_steps(read_jsonl(a.runs[i], "steps.jsonl")))
            ev = statistics.median(x["step_ms"] for x in dec) if dec else None
            model = (read_json(os.path.join(a.runs[i], "summary.json")) or {}).get("model", {})
            if bw and dec and model.get("name") in SHAPES and "attention" in p["groups_ms"]:
                b = dec[0]["decode_tokens"]
                ctx = statistics.median(x["total_context"] / x["decode_tokens"] for x in dec)
                kv = model["layers"] * b * ctx * SHAPES[model["name"]]["kv_tok_layer"]
                p["attention_roofline"] = {"model": model["name"], "layers": model["layers"], "batch": b, "context": ctx,
                                           "kv_bytes": kv, "bw": bw, "roofline_ms": kv / bw * 1e3,
                                           "ratio": p["groups_ms"]["attention"] / (kv / bw * 1e3)}
        p["step_ms"] = ev
        data.append(p)
        lines += ["## %s: %d of %d decode steps (the most common kernel sequence), kernels %.3f ms a step%s" % (
            p["file"], p["steps"], p["decode_steps"], p["total_ms"],
            "; the same configuration's decode step without ncu %.3f ms (launch gaps and host %.3f ms)" % (ev, ev - p["total_ms"]) if ev else ""),
            "", "By phase: " + ", ".join("%s %.4f ms" % (g, p["groups_ms"][g]) for g in ("attention", "gemm", "other")
                                       if g in p["groups_ms"]) + ".",
            "", ("Attention kernels vs their roofline (MODELLED: KV bytes / HBM BW = %d layers x B %d x context %.0f x %d "
                 "B = %.3f GB at %.2f TB/s = %.4f ms): **%.2fx** (%.2f of the read rate)." % (
                     r["layers"], r["batch"], r["context"], SHAPES[r["model"]]["kv_tok_layer"], r["kv_bytes"] / 1e9,
                     r["bw"] / 1e12, r["roofline_ms"], r["ratio"], 1 / r["ratio"])
                 if (r := p.get("attention_roofline")) else "Attention roofline: not computed (needs --runs and --balance)."),
            "", "| kernel | launches / step | ms / step | share |", "|---|---|---|---|"]
        for k in sorted(p["kernels"], key=lambda k: -k["ms"]):
            lines.append("| `%s` | %g | %.4f | %.1f %% |" % (k["name"][:80], k["launches"], k["ms"], 100 * k["ms"] / p["total_ms"]))
        lines.append("")
    if not data:
        return 1
    write_report(a.out, "kernel_profile", lines, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
