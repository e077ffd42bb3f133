#!/usr/bin/env python3
"""The balance map: FastDecode's decode throughput over GPU-only's as a function of the CPU side's aggregate KV
read bandwidth relative to the GPU's HBM bandwidth — measured points, the model's curve through them, and the
crossover ("with X GB/s of CPU bandwidth per GPU, FastDecode wins for model M at sequence S").

MODELLED (the same bytes-moved argument as docs/SCHEDULING.md's step formula, decode being memory-bound on both
sides): per layer and step, FastDecode's R-Part reads the whole KV of its batch from the CPUs' memory and
GPU-only reads the layer's weights plus the KV of the batch its GPU memory holds, so per token

    FastDecode:  N * ctx * kv / BW_cpu           (R-bound; capped by its S-Part: B_fd / (N * T_S(B_fd)))
    GPU-only:    N * (w + B_go * ctx * kv) / (B_go * BW_gpu)
    ratio        = x * (w + B_go * ctx * kv) / (B_go * ctx * kv) / eta,   x = BW_cpu / BW_gpu
    crossover    x* = eta * B_go * ctx * kv / (w + B_go * ctx * kv)

with w the fp16 weight bytes of a layer, kv the KV bytes per token per layer, ctx the mean context (S/2 under
SLS), B_go = (0.9 * GPU memory - weights) / (max_context * kv * N) the batch GPU-only's memory holds, and eta
the fraction of its HBM roofline GPU-only reaches (1 = the roofline; the measured value at the points is printed
and used for the "calibrated" curve). FastDecode's S-Part and the transfers are not in the R-bound term: where
they bind the measured point falls below the curve.

The hybrid (docs/HYBRID.md; beyond the paper), MODELLED with the same bytes: its GPU side is GPU-only's batch and
its CPU side runs, in the GPU's shadow, as many more sequences as the CPUs read in one GPU step, so per step the
GPU reads w + B_go * ctx * kv and the CPUs k * ctx * kv with k = x * (w + B_go * ctx * kv) / (ctx * kv):

    hybrid / GPU-only = (B_go + k) / B_go = 1 + FastDecode / GPU-only      (never below 1: k = 0 is GPU-only)

The cost of engaging the CPUs at all (the measured engage_s of the hybrid's prior) is not in it; where it exceeds
the GPU's layer the controller places nothing and the measured point sits at 1. Hybrid points: the hybrid grid's
cells (artifacts/hybrid/*/, analysis/hybrid_grid.py) at the x of the same cell's FastDecode run.

Measured points: every FastDecode run with a gpu-only run at the same balance, model, window and B in the
baselines grid (analysis/fig_baselines.py layout), and the strong-scaling sweep's points (fewer R-worker
cores) against the gpu-only run of the same workload. x is measured too: the run's CPU KV bandwidth = KV bytes
its R-workers read per decode step / the busiest R-worker's compute time; BW_gpu = the HBM read rate of that SM
count (fd-kernel-bench --only balance).

usage: analysis/balance_map.py [--baselines ROOT...] [--paper ROOT] [--hybrid ROOT...] [--balance-bench FILE] --out DIR
writes DIR/balance_map.png and DIR/BALANCE_MAP.md (the crossover table for named GPUs and models)
"""
import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import fig_baselines  # noqa: E402
import hybrid_grid  # noqa: E402
import fig_paper  # noqa: E402
from fd_runs import decode_steps, hbm_rates, read_json, read_jsonl_or_none  # noqa: E402
from shapes import SHAPES, SOCKET_BW, layer_weight_bytes  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_BASELINES = [os.path.join(REPO, "artifacts", "baselines", r) for r in ("run1-a40a146", "run3-4bf4e28")]
DEFAULT_PAPER = os.path.join(REPO, "artifacts", "paper", "runs")
DEFAULT_HYBRID = [os.path.join(REPO, "artifacts", "hybrid", m)
                  for m in ("llama-2-7b", "llama-2-7b-4cores-a", "llama-2-7b-4cores-b", "llama-3-8b-512")]
DEFAULT_BALANCE = os.path.join(REPO, "artifacts", "baselines", "run1-a40a146", "balance_bench.json")
DEFAULT_CROSSOVER = os.path.join(REPO, "artifacts", "paper", "crossover", "crossover.json")
# GPUs of the crossover table: HBM bandwidth (datasheets) and memory; the socket bandwidth is analysis/shapes.py's.
GPUS = [("A10", 600e9, 24e9), ("A100-80GB", 2039e9, 80e9), ("H100-SXM", 3350e9, 80e9), ("H200", 4800e9, 141e9)]


def gpu_only_batch(model, mem, max_context):
    m = SHAPES[model]
    return int(max(0.0, 0.9 * mem - m["weights"]) // (max_context * m["kv_tok_layer"] * m["layers"]))


def crossover(model, ctx, b_go, eta=1.0):
    """x* = BW_cpu / BW_gpu above which FastDecode's R-bound rate beats GPU-only's."""
    m = SHAPES[model]
    kvb = b_go * ctx * m["kv_tok_layer"]
    return eta * kvb / (layer_weight_bytes(model) + kvb) if b_go > 0 else 0.0


def modelled_ratio(model, ctx, b_go, x, eta=1.0):
    m = SHAPES[model]
    if b_go <= 0:
        return float("inf")
    kvb = b_go * ctx * m["kv_tok_layer"]
    return x * (layer_weight_bytes(model) + kvb) / kvb / eta


def run_point(fd, go, hbm, label):
    """One measured point from a FastDecode run and its gpu-only peer (fig_baselines.load_run dicts or fig_paper's)."""
    s = fd["summary"]
    model = s["model"]["name"]
    if model not in SHAPES:
        return None
    dec = decode_steps(fd["steps"] if "steps" in fd else [])
    if not dec:
        return None
    r_ms = statistics.fmean(x.get("breakdown_ms", {}).get("r_compute_max", 0.0) for x in dec)
    W = statistics.fmean(x["total_context"] for x in dec)
    if r_ms <= 0:
        return None
    layers = s["model"]["layers"]
    bw_cpu = W * layers * SHAPES[model]["kv_tok_layer"] / (r_ms / 1e3)
    sm = (s.get("config", {}).get("hardware", {}).get("gpu", {}) or {}).get("sm_count") or 0
    bw_gpu = hbm.get(sm) or hbm.get(0)
    go_dec = decode_steps(go["steps"])
    go_b = statistics.fmean(x["decode_tokens"] for x in go_dec)
    go_ctx = statistics.fmean(x["total_context"] for x in go_dec) / go_b
    go_ms = statistics.fmean(x["step_ms"] for x in go_dec)
    m = SHAPES[model]
    roof_ms = 1e3 * layers * (layer_weight_bytes(model) + go_b * go_ctx * m["kv_tok_layer"]) / bw_gpu
    return {"label": label, "model": model, "x": bw_cpu / bw_gpu, "bw_cpu": bw_cpu, "bw_gpu": bw_gpu, "sm": sm,
            "ratio": fd["tok_s"] / go["tok_s"], "fd_tok_s": fd["tok_s"], "go_tok_s": go["tok_s"], "b_go": go_b,
            "ctx": go_ctx, "eta": roof_ms / go_ms, "fd_dir": os.path.relpath(fd["dir"], REPO),
            "go_dir": os.path.relpath(go["dir"], REPO)}


def modelled_hybrid(model, ctx, b_go, x, eta=1.0):
    """hybrid / GPU-only: GPU-only plus what the CPUs read in the GPU's step (module docstring)."""
    return 1.0 + modelled_ratio(model, ctx, b_go, x, eta)


def hybrid_points(roots, hbm):
    """The hybrid grid's cells whose three engines' run folders are here: x from the cell's FastDecode run, the
    measured hybrid / gpu-only and FastDecode / gpu-only (steady rates, analysis/hybrid_grid.py)."""
    out = []
    for key, runs in sorted(hybrid_grid.cells([Path(r) for r in roots if os.path.isdir(r)]).items()):
        model, mem, cores, ctx = key
        if not all(runs.get(e) for e in hybrid_grid.ENGINES):
            continue
        nums = {e: hybrid_grid.engine_numbers(runs[e]) for e in hybrid_grid.ENGINES}
        if not all(nums[e]["steady_tokens_per_s"] for e in hybrid_grid.ENGINES):
            continue
        def load(e):
            d = runs[e][0][1]
            return {"summary": read_json(d / "summary.json"), "steps": read_jsonl_or_none(d / "steps.jsonl"),
                    "tok_s": nums[e]["steady_tokens_per_s"], "dir": str(d)}
        label = "%s, %s, ctx %s, %s cores" % (model, "full memory" if mem == "full" else mem + " GB", ctx, cores)
        p = run_point(load("fastdecode"), load("gpu-only"), hbm, label)
        if not p:
            continue
        split = hybrid_grid.hybrid_split(runs["hybrid"][0][1])
        p.update({"hybrid_ratio": nums["hybrid"]["steady_tokens_per_s"] / nums["gpu-only"]["steady_tokens_per_s"],
                  "hy_tok_s": nums["hybrid"]["steady_tokens_per_s"], "cpu_seqs_max": split.get("cpu_seqs_max"),
                  "hy_dir": os.path.relpath(str(runs["hybrid"][0][1]), REPO)})
        out.append(p)
    return out


def with_steps(r):
    if "steps" not in r:
        r = dict(r, steps=fig_paper.read_jsonl(r["dir"], "steps.jsonl"))
    return r


def eta_per_layer(a, hbm):
    """GPU-only's per-layer efficiency from Fig. 8's fit (step = a + b * layers): the roofline time of one layer at
    the sweep's batch and context over b. The 2-layer points' own eta is lower (their step is mostly the fixed part
    a: LM head, sampling, launches), which a full-depth step amortises; None without the sweep."""
    if not a.paper:
        return None
    try:
        data, fits, one = fig_paper.fig8_data(a.paper)
    except fig_paper.Skip:
        return None
    if ("llama-2-7b", "gpu-only") not in fits:
        return None
    runs = fig_paper.sweep_runs(a.paper, "fig8-llama-2-7b-gpu-only")
    r = next(iter(runs.values()))[0]
    dec = decode_steps(r["steps"])
    b = statistics.fmean(x["decode_tokens"] for x in dec)
    ctx = statistics.fmean(x["total_context"] for x in dec) / b
    m = SHAPES["llama-2-7b"]
    roof_ms = 1e3 * (layer_weight_bytes("llama-2-7b") + b * ctx * m["kv_tok_layer"]) / (hbm.get(0))
    return roof_ms / fits[("llama-2-7b", "gpu-only")][1], b, ctx


def grid_points(root, hbm):
    """The balance-map sweeps (experiments/paper/balance-map-{fastdecode,gpu-only}.sweep.json): each FastDecode point
    paired with the gpu-only point of the same SM count and memory cap; [] when the sweeps were not run."""
    try:
        fd_sweep = fig_paper.sweep_runs(root, "balance-map-fastdecode")
        go_sweep = fig_paper.sweep_runs(root, "balance-map-gpu-only")
    except fig_paper.Skip:
        return []
    def hw(r):
        g = r["summary"]["config"].get("hardware", {}).get("gpu", {})
        return (g.get("sm_count") or 0, g.get("memory_gb") or 0)
    go_by = {hw(reps[0]): reps[0] for reps in go_sweep.values()}
    out = []
    for name, reps in sorted(fd_sweep.items()):
        r = reps[0]
        go = go_by.get(hw(r))
        if not go:
            print("balance_map: %s has no gpu-only point at SM count / memory %s" % (r["dir"], hw(r)))
            continue
        rw = r["summary"]["config"]["engine"]["rworkers"]
        sm, mem = hw(r)
        label = "%s SMs, %s, B = 256, %d cores" % (sm or "all", "%g GB" % mem if mem else "full memory", rw["spawn"] * rw["threads"])
        p = run_point({"summary": r["summary"], "steps": r["steps"], "tok_s": r["decode_tps"], "dir": r["dir"]},
                      {"summary": go["summary"], "steps": go["steps"], "tok_s": go["decode_tps"], "dir": go["dir"]}, hbm, label)
        if p:
            out.append(p)
    return out


def measured_points(a, hbm):
    pts = []
    runs, use = fig_baselines.load_runs(a.baselines, "steady")
    for (bal, model), engines in sorted(runs.items()):
        for B, fd in sorted(engines.get("fastdecode", {}).items()):
            go = engines.get("gpu-only", {}).get(B)
            if go:
                p = run_point(with_steps(fd), with_steps(go), hbm, "%s, B = %d, 12 cores" % (fig_baselines.BALANCES.get(bal, bal), B))
                if p:
                    pts.append(p)
    if a.paper:
        pts += grid_points(a.paper, hbm)
        try:
            sweep = fig_paper.sweep_runs(a.paper, "fig13-scaling-s1024")
        except fig_paper.Skip as e:
            print("balance_map: %s" % e)
            sweep = {}
        go = runs.get(("full", "llama-2-7b"), {}).get("gpu-only", {}).get(256)
        for name, reps in sorted(sweep.items()):
            r = reps[0]
            rw = r["summary"]["config"]["engine"]["rworkers"]
            fd = {"summary": r["summary"], "steps": r["steps"], "tok_s": r["decode_tps"], "dir": r["dir"]}
            if go:
                p = run_point(fd, with_steps(go), hbm, "full H200, B = 256, %d cores" % (rw["spawn"] * rw["threads"]))
                if p:
                    pts.append(p)
    return pts


def draw(pts, a, eta, hpts=()):
    """One curve per (model, balance), at the GPU-only batch of that group's largest-B point; the measured points in
    the group's colour (marker by B). The legend, below the plot, names each group once (its colour, its MODELLED
    crossover) and the styles once; each point's numbers are in BALANCE_MAP.md."""
    from matplotlib.lines import Line2D
    fig, ax = plt.subplots(figsize=(12, 9))
    xs = [10 ** (i / 20.0) for i in range(-60, 11)]  # 1e-3 .. 10
    groups = {}
    for p in pts:
        groups.setdefault((p["model"], p["label"].split(", B = ")[0]), []).append(p)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    markers = {16: "v", 64: "s", 256: "o", 1024: "D"}
    handles, seen_b = [], set()
    for i, ((model, bal), ps) in enumerate(sorted(groups.items())):
        c = colors[i % len(colors)]
        ref = max(ps, key=lambda p: (p["b_go"], p["label"]))
        b, ctx = round(ref["b_go"]), round(ref["ctx"])
        x1 = crossover(model, ctx, b)
        ax.plot(xs, [modelled_ratio(model, ctx, b, x) for x in xs], "-", lw=1.2, color=c)
        text = "%s, %s (GPU-only B = %d, ctx %d): MODELLED x* = %.2f" % (model, bal, b, ctx, x1)
        if eta:
            ax.plot(xs, [modelled_ratio(model, ctx, b, x, eta) for x in xs], "--", lw=0.8, color=c)
            text += " (%.2f at η)" % crossover(model, ctx, b, eta)
        handles.append(Line2D([], [], color=c, lw=2, label=text))
        for p in ps:
            B = int(p["label"].split("B = ")[1].split(",")[0])
            seen_b.add(B)
            ax.plot([p["x"]], [p["ratio"]], markers.get(B, "o"), color=c, ms=7, mec="black", mew=0.5)
    style = [Line2D([], [], color="0.3", lw=1.2, ls="-", label="MODELLED roofline (colour: the group)")]
    if eta:
        style.append(Line2D([], [], color="0.3", lw=0.8, ls="--", label="MODELLED, GPU-only at η = %.2f per layer (Fig. 8's slope)" % eta))
    for B in sorted(seen_b):
        style.append(Line2D([], [], color="0.6", marker=markers.get(B, "o"), mec="black", mew=0.5, ls="none", ms=7,
                            label="measured FastDecode / GPU-only, B = %d" % B))
    for i, p in enumerate(hpts):
        if i == 0:  # one MODELLED hybrid curve, at the first hybrid cell's GPU-only batch and context
            b, ctx = round(p["b_go"]), round(p["ctx"])
            ax.plot(xs, [modelled_hybrid(p["model"], ctx, b, x) for x in xs], ":", lw=1.4, color="black")
            style.append(Line2D([], [], color="black", lw=1.4, ls=":", label="MODELLED hybrid / GPU-only, %s (GPU-only B = %d, ctx %d)"
                                % (p["model"], b, ctx)))
            style.append(Line2D([], [], color="gold", marker="*", mec="black", mew=0.6, ls="none", ms=11,
                                label="measured hybrid / GPU-only (%d cells)" % len(hpts)))
        ax.plot([p["x"]], [p["hybrid_ratio"]], "*", color="gold", ms=11, mec="black", mew=0.6)
    ax.axhline(1.0, color="0.3", lw=0.8)
    paper_x = 8 * SOCKET_BW / 600e9
    ax.axvline(paper_x, color="0.6", ls=":", lw=1)
    ax.text(paper_x, 0.0015, "paper: A10 + 8 Epyc \nsockets, x ≈ %.1f \n(MODELLED bandwidths) " % paper_x, fontsize=7, color="0.4",
            ha="right")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(xs[0], xs[-1])
    ax.set_ylim(1e-3, 30)
    ax.set_xlabel("x = CPU side's aggregate KV read bandwidth / GPU's HBM read bandwidth")
    ax.set_ylabel("FastDecode / GPU-only decode tokens/s")
    ax.grid(True, which="both", alpha=0.3)
    fig.legend(handles=handles + style, loc="lower center", bbox_to_anchor=(0.5, 0.06), ncol=2, fontsize=7, frameon=False)
    fig.suptitle("The balance map: where offloading attention to CPUs wins (FastDecode and the hybrid over GPU-only; 2-layer runs): "
                 "measured points, MODELLED curves", fontsize=11)
    fig.text(0.01, 0.005, "Measured points: %s (x measured from each run: KV bytes per decode step / the busiest R-worker's compute; "
             "GPU: fd-kernel-bench --only balance). Curves MODELLED (analysis/balance_map.py's docstring); BALANCE_MAP.md checks "
             "each point against the model with that run's own GPU-only efficiency." % ", ".join(
                 sorted({os.path.relpath(r, REPO) for r in a.baselines + ([a.paper] if a.paper else [])})),
             fontsize=6.5, wrap=True, color="0.25")
    fig.tight_layout(rect=(0, 0.3, 1, 0.95))
    path = os.path.join(a.out, "balance_map.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print("wrote %s" % path)


def crossover_points(path):
    """The measured crossover grid (analysis/crossover.py report's crossover.json): one row per FastDecode point against
    the best GPU-side engine at its balance, with x counted in fp16 bytes (int4's fewer bytes read as a higher rate) and
    B_go the GPU side's measured sequences."""
    if not path or not os.path.isfile(path):
        return []
    d = json.load(open(path))
    attn = {p["group"]: p["gpu_attn_gbps"] * 1e9 for p in d["predictions"]}
    ctx = {(p["group"], p["memory_gb"]): p["context"] for p in d["predictions"]}
    fd = {(r["group"], r["memory_gb"], r["b"], r["kv"]): r for r in d["points"] if r["engine"] == "fastdecode" and "measured" in r}
    gpu = {(r["group"], r["memory_gb"], r["b"], r["engine"], r["point"]): r for r in d["points"]
           if r["engine"] != "fastdecode" and "measured" in r}
    out = []
    for v in d["verdicts"]:
        f = fd[(v["group"], v["memory_gb"], v["b"], v["kv"])]["measured"]
        eng, point = v["best_gpu"].split(" ", 1)
        g = gpu[(v["group"], v["memory_gb"], v["b"], eng, point)]["measured"]
        out.append({"group": v["group"], "mem": v["memory_gb"], "b": v["b"], "kv": v["kv"], "ratio": v["ratio"],
                    "x": f["cpu_fp16_equiv_gbps"] * 1e9 / attn[v["group"]], "bw_gpu": attn[v["group"]], "b_go": g["batch"],
                    "best_gpu": eng, "ctx": ctx[(v["group"], v["memory_gb"])]})
    return out


def crossover_section(xpts):
    model = "llama-2-7b"
    out = ["", "## Measured toward the crossover (artifacts/paper/crossover/CROSSOVER.md)", "",
           "Llama-2-7b at 8 SMs (the fewest green contexts allow; HBM read %.0f GB/s, an A10's 600 GB/s class) and a GPU "
           "memory cap, B = 256 or 1024, FastDecode on 15 R-worker cores with fp16 / int8 / int4 KV against the best "
           "GPU-side engine (gpu-only with slots of the 544 positions the work needs, or paged-swap; fp16 KV), "
           "decode-only tokens/s for both. x counts the R-workers' reads in fp16 bytes (int4's rate is the context it "
           "covers). x* and the MODELLED ratio: this map's roofline (η = 1) at the GPU side's measured batch B_go." % (
               max(p["bw_gpu"] for p in xpts) / 1e9), "",
           "| machine | GPU GB | B | FastDecode KV | x (fp16-equivalent) | GPU side | its sequences B_go | x* (roofline) | "
           "FastDecode / GPU side (measured) | MODELLED (roofline) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p in xpts:
        out.append("| %s | %g | %d | %s | %.3f | %s | %.1f | %.3f | %.3f | %.3f |" % (
            p["group"], p["mem"], p["b"], p["kv"], p["x"], p["best_gpu"], p["b_go"], crossover(model, p["ctx"], p["b_go"]),
            p["ratio"], modelled_ratio(model, p["ctx"], p["b_go"], p["x"])))
    out += ["", crossover_statement(xpts)]
    return out


def _span(vals, fmt="%.2f"):
    lo, hi = min(vals), max(vals)
    return fmt % lo if fmt % lo == fmt % hi else (fmt + "–" + fmt) % (lo, hi)


def crossover_statement(xpts):
    """One paragraph, for BALANCE_MAP.md and CLAIMS.md: what the crossover grid measured and how far the MODELLED
    crossover table reaches beyond it."""
    int4 = [p for p in xpts if p["kv"] == "int4"]
    f16 = [p for p in xpts if p["kv"] == "fp16"]
    mems = sorted({p["mem"] for p in int4}, reverse=True)
    by_mem = ", ".join("%s at %g GB" % (_span([p["ratio"] for p in int4 if p["mem"] == m]), m) for m in mems)
    won = sorted({p["mem"] for p in xpts if p["ratio"] > 1}, reverse=True)
    x16, x4 = max(p["x"] for p in f16), max(p["x"] for p in int4)
    xa = crossover("llama-2-7b", 512, gpu_only_batch("llama-2-7b", GPUS[0][2], 1024))
    big = [crossover(m, S / 2, gpu_only_batch(m, mem, S)) for _, _, mem in GPUS[1:] for m in SHAPES for S in (1024, 4096)]
    return ("Measured at 8 SMs (%.0f GB/s of HBM, an A10's class): FastDecode with int4 KV on 15 R-worker cores (x %s, "
            "fp16-equivalent) over the best GPU-side engine with fp16 KV reads %s; with fp16 KV on the CPUs (x %s) %s. "
            "FastDecode out-generates the GPU side at %s of GPU memory and not above. MODELLED beyond the measurements: the "
            "crossover table's A10 row for Llama-2-7b at S = 1024 (x* = %.2f) is %.1f× the largest x measured with fp16 KV "
            "and %.1f× the largest with int4 KV; its A100, H100 and H200 rows (x* %.2f–%.2f) are %.1f–%.1f× beyond the "
            "largest measured x." % (
                max(p["bw_gpu"] for p in xpts) / 1e9, _span([p["x"] for p in int4]), by_mem, _span([p["x"] for p in f16]),
                _span([p["ratio"] for p in f16]), " and ".join("%g GB" % m for m in won) or "no memory cap of the grid",
                xa, xa / x16, xa / x4, min(big), max(big), min(big) / max(x16, x4), max(big) / max(x16, x4)))


def table(pts, eta, a, hpts=(), xpts=()):
    eta = eta or 1.0
    out = ["# The balance map (analysis/balance_map.py)", "",
           "## Measured points", "",
           "Each point at 2 layers. MODELLED with the run's own η (GPU-only's step against its roofline in that run) is the "
           "model's validation: FastDecode R-bound at the CPU bandwidth the run measured, GPU-only at its measured efficiency.", "",
           "| point | model | CPU KV GB/s (measured) | GPU HBM TB/s | x | FastDecode / GPU-only (measured) | MODELLED (roofline) | "
           "GPU-only η (this run) | MODELLED with this η | measured / MODELLED |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p in pts:
        mod = modelled_ratio(p["model"], p["ctx"], p["b_go"], p["x"])
        mod_e = modelled_ratio(p["model"], p["ctx"], p["b_go"], p["x"], p["eta"])
        out.append("| %s | %s | %.1f | %.2f | %.4f | %.3f (%.0f / %.0f tok/s) | %.3f | %.2f | %.3f | %.2f |" % (
            p["label"], p["model"], p["bw_cpu"] / 1e9, p["bw_gpu"] / 1e12, p["x"], p["ratio"], p["fd_tok_s"], p["go_tok_s"],
            mod, p["eta"], mod_e, p["ratio"] / mod_e))
    if hpts:
        out += ["", "## The hybrid (beyond the paper)", "",
                "The hybrid grid's cells (2 layers, steady rates; analysis/hybrid_grid.py) at the x of the cell's own FastDecode "
                "run. MODELLED hybrid / GPU-only = 1 + FastDecode / GPU-only (roofline; module docstring): the CPUs add what "
                "they read in the GPU's step, and the cost of engaging them is not counted.", "",
                "| cell | x (FastDecode run) | FastDecode / GPU-only (measured) | hybrid / GPU-only (measured) | MODELLED hybrid / GPU-only | CPU seqs (max) |",
                "|---|---|---|---|---|---|"]
        for p in hpts:
            out.append("| %s | %.4f | %.3f | %.3f | %.3f | %s |" % (p["label"], p["x"], p["ratio"], p["hybrid_ratio"],
                                                                 modelled_hybrid(p["model"], p["ctx"], p["b_go"], p["x"]), p["cpu_seqs_max"]))
        out += ["", "Hybrid runs: " + "; ".join(p["hy_dir"] for p in hpts)]
    if xpts:
        out += crossover_section(xpts)
    out += ["", "Run folders: " + "; ".join(sorted({"%s vs %s" % (p["fd_dir"], p["go_dir"]) for p in pts})), "",
            "## Crossover: the CPU bandwidth per GPU above which FastDecode out-generates GPU-only (MODELLED)", "",
            "x* = η·B_go·ctx·kv / (w + B_go·ctx·kv), B_go = what 90 %% of the GPU's memory holds beside the fp16 weights at "
            "max_context = S positions per sequence, ctx = S/2 (SLS's mean context). Roofline (η = 1) and with η = %.2f, "
            "GPU-only's measured per-layer efficiency (Fig. 8's slope against one layer's roofline: what a full-depth step "
            "approaches); sockets: AMD EPYC 7003 at %.0f GB/s sustained." % (eta, SOCKET_BW / 1e9), "",
            "| GPU | model | S | GPU-only batch | x* (roofline) | CPU GB/s needed (roofline) | = Epyc sockets | CPU GB/s needed (η = %.2f) | = sockets |" % eta,
            "|---|---|---|---|---|---|---|---|---|"]
    for gpu, bw, mem in GPUS:
        for model in SHAPES:
            for S in (1024, 4096):
                b = gpu_only_batch(model, mem, S)
                if b == 0:
                    out.append("| %s | %s | %d | 0 (the weights leave no room) | — | any: GPU-only cannot serve it | — | — | — |" % (gpu, model, S))
                    continue
                x1, xe = crossover(model, S / 2, b), crossover(model, S / 2, b, eta)
                out.append("| %s | %s | %d | %d | %.2f | %.0f | %.1f | %.0f | %.1f |" % (
                    gpu, model, S, b, x1, x1 * bw / 1e9, x1 * bw / SOCKET_BW, xe * bw / 1e9, xe * bw / SOCKET_BW))
    out += ["", "Read: with more CPU KV bandwidth per GPU than the \"needed\" column, FastDecode's R-bound throughput is above "
            "GPU-only's (both at full depth; FastDecode's S-Part and transfers not counted, so near the crossover it needs "
            "somewhat more). This machine has ~%.0f GB/s on 12 R-worker cores against a %.1f TB/s H200."
            % (max((p["bw_cpu"] for p in pts), default=0) / 1e9, max((p["bw_gpu"] for p in pts), default=0) / 1e12)]
    path = os.path.join(a.out, "BALANCE_MAP.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
    print("wrote %s (%d measured points)" % (path, len(pts)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baselines", nargs="+", default=DEFAULT_BASELINES)
    ap.add_argument("--paper", default=DEFAULT_PAPER, help="reproduce.sh's sweeps (fig13-scaling-s1024: fewer cores)")
    ap.add_argument("--hybrid", nargs="*", default=DEFAULT_HYBRID, help="hybrid grid sweep folders (artifacts/hybrid/MODEL)")
    ap.add_argument("--balance-bench", default=DEFAULT_BALANCE, help="fd-kernel-bench --only balance JSON (HBM rate per SM count)")
    ap.add_argument("--crossover", default=DEFAULT_CROSSOVER, help="analysis/crossover.py's crossover.json ('' : none)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    hbm = hbm_rates(a.balance_bench)
    pts = measured_points(a, hbm)
    if not pts:
        print("balance_map: no FastDecode run with a gpu-only peer under %s" % ", ".join(a.baselines))
        return 1
    e = eta_per_layer(a, hbm)
    eta = e[0] if e else None
    if e:
        print("balance_map: GPU-only per-layer efficiency %.3f (Fig. 8 slope at B = %.0f, ctx %.0f)" % e)
    hpts = hybrid_points(a.hybrid, hbm)
    print("balance_map: %d hybrid cells" % len(hpts))
    draw(pts, a, eta, hpts)
    table(pts, eta, a, hpts, crossover_points(a.crossover))
    return 0


if __name__ == "__main__":
    sys.exit(main())
