#!/usr/bin/env python3
"""The paper's figures that come from sweeps (scripts/reproduce.sh, experiments/paper/*.sweep.json):

  fig3_dilemma.png          Fig. 3: time per token per layer vs B of the S-Part (falls ~B-fold) and of decode
                            attention on the GPU and on the CPU R-worker kernel (flat: attention does not batch)
  fig8_layers.png           Fig. 8: decode step vs layer count per model and engine, with the least-squares
                            line step = a + b * layers and its R^2 (the linearity that justifies reduced layers)
  fig11_sls_measured.png    Figs. 11/12: per-step latency of all-at-once, fixed-interval and load-control on the
                            same workload (S = 1024 and 768), with the peak and throughput ratios next to the paper's
  fig13_scaling.png         Fig. 13: decode tokens/s vs R-worker cores, and the strong-scaling efficiency
                            tokens/s(P) / (P * tokens/s(P_min) / P_min) as the paper defines it

Input: --paper ROOT, the folder reproduce.sh writes: ROOT/<sweep name>/<point>/rep<k>/{summary.json,steps.jsonl}
(fd-bench sweep's layout). Every number is read from summary.json's resolved config and results (decode_only,
steady when present; else recomputed from steps.jsonl with analysis/fd_runs.py); repeats are drawn as their
median with a min-max bar. A sweep that is missing is a Skip naming it.

usage: analysis/fig_paper.py --paper ROOT --out DIR    (analysis/figures.py --paper ROOT draws them too)
"""
import argparse
import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fd_runs import decode_steps, decode_tokens_per_s, jsonl_path, read_jsonl  # noqa: E402

DPI = 120


class Skip(Exception):
    """A figure's inputs are missing; the message says why."""


def load_run(d):
    """{summary, steps, decode_ms (mean decode-only step), decode_tps, steady_tps, layers, full_layers} of a run."""
    s = json.load(open(os.path.join(d, "summary.json")))
    steps = read_jsonl(d, "steps.jsonl") if jsonl_path(d, "steps.jsonl") else []
    res = s.get("results", {})
    dec = decode_steps(steps)
    do = res.get("decode_only") or {}
    decode_ms = (do.get("step_ms") or {}).get("mean")
    if decode_ms is None and dec:
        decode_ms = statistics.fmean(x["step_ms"] for x in dec)
    decode_tps = do.get("tokens_per_s", decode_tokens_per_s(dec) if dec else None)
    st = res.get("steady") or {}
    return {"dir": d, "summary": s, "steps": steps, "decode_ms": decode_ms, "decode_tps": decode_tps,
            "steady_tps": st.get("tokens_per_s"), "steady": st, "layers": (s.get("model") or {}).get("layers"),
            "full_layers": (s.get("model") or {}).get("full_layers", (s.get("model") or {}).get("layers")),
            "run_tps": res.get("output_throughput")}


def sweep_runs(root, name):
    """{point: [run, ...]} of ROOT/<name>/<point>/rep<k>/ (a folder without summary.json is left out, printed)."""
    top = os.path.join(root, name)
    if not os.path.isdir(top):
        raise Skip("%s not found (scripts/reproduce.sh writes it: sweep experiments/paper/%s.sweep.json)" % (top, name))
    points = {}
    for p in sorted(os.listdir(top)):
        pdir = os.path.join(top, p)
        if not os.path.isdir(pdir):
            continue
        for r in sorted(os.listdir(pdir)):
            d = os.path.join(pdir, r)
            if not (r.startswith("rep") and os.path.isdir(d)):
                continue
            if not os.path.isfile(os.path.join(d, "summary.json")):
                print("fig_paper: %s: no summary.json (unfinished run), left out" % d)
                continue
            points.setdefault(p, []).append(load_run(d))
    if not points:
        raise Skip("no finished run under %s" % top)
    return points


def med(vals):
    vals = [v for v in vals if v is not None]
    return (statistics.median(vals), min(vals), max(vals)) if vals else (None, None, None)


def machine(run):
    prov = run["summary"].get("provenance", {})
    gpus = prov.get("gpus") or []
    g = gpus[0].get("name", "").replace("NVIDIA ", "") if gpus else "no GPU"
    hw = run["summary"].get("config", {}).get("hardware", {}).get("gpu", {})
    bal = " (%s GB, %s SMs)" % (hw.get("memory_gb"), hw.get("sm_count")) if hw.get("sm_count") else ""
    return "%s%s + %s cores, commit %s" % (g, bal, prov.get("cpu_cores", "?"), prov.get("git_commit", "?"))


def fit_line(xs, ys):
    """(a, b, r2) of the least-squares line y = a + b x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    a = my - b * mx
    ss_res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    ss_tot = sum((y - my) ** 2 for y in ys)
    return a, b, (1.0 - ss_res / ss_tot) if ss_tot else 1.0


def save(fig, a, stem, written, caption):
    fig.text(0.01, 0.005, caption, fontsize=7, ha="left", va="bottom", wrap=True, color="0.25")
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    for fmt in getattr(a, "formats", ("png",)):
        path = os.path.join(a.out, "%s.%s" % (stem, fmt))
        fig.savefig(path, dpi=DPI)
        written.append(path)
        print("wrote %s" % path)
    plt.close(fig)


def present(root, names):
    return [n for n in names if os.path.isdir(os.path.join(root, n))]


FIG8 = [("llama-2-7b", "fastdecode"), ("llama-2-7b", "gpu-only"), ("llama-2-7b", "hybrid"), ("llama-2-13b", "fastdecode"),
        ("llama-2-13b", "gpu-only"), ("opt-175b", "fastdecode")]  # OPT-175b: FastDecode only (GPU-only refuses its 350 GB of full-depth weights)


def fig8_data(root):
    """{(model, engine): [(layers, median ms, min, max)]}, the fits {(model, engine): (a, b, r2)} and one run."""
    data, fits, one = {}, {}, None
    for m, e in FIG8:
        name = "fig8-%s-%s" % (m, e)
        if not os.path.isdir(os.path.join(root, name)):
            continue
        rows = []
        for runs in sweep_runs(root, name).values():
            one = one or runs[0]
            md, lo, hi = med([r["decode_ms"] for r in runs])
            if md is not None:
                rows.append((runs[0]["layers"], md, lo, hi))
        rows.sort()
        if rows:
            data[(m, e)] = rows
            if len(rows) >= 2:
                fits[(m, e)] = fit_line([r[0] for r in rows], [r[1] for r in rows])
    if not data:
        raise Skip("no fig8-<model>-<engine> sweep under %s" % root)
    return data, fits, one


def fig8(a, written):
    data, fits, first = fig8_data(a.paper)
    models = sorted({m for m, _ in data})
    fig, axes = plt.subplots(1, len(models), figsize=(6.2 * len(models), 5), squeeze=False)
    for ax, m in zip(axes[0], models):
        for e, style in (("fastdecode", "o-"), ("gpu-only", "s-"), ("hybrid", "^--")):
            rows = data.get((m, e))
            if not rows and e == "hybrid":  # beyond the paper: only where its sweep was run
                continue
            if not rows:
                ax.text(0.02, 0.02 if e == "gpu-only" else 0.07, "%s: not measured" % e, transform=ax.transAxes, fontsize=7)
                continue
            L = [r[0] for r in rows]
            ax.errorbar(L, [r[1] for r in rows], yerr=[[r[1] - r[2] for r in rows], [r[3] - r[1] for r in rows]],
                        fmt=style, capsize=3, label="%s, measured" % e)
            if (m, e) in fits:
                a0, b0, r2 = fits[(m, e)]
                ax.plot([0, max(L)], [a0, a0 + b0 * max(L)], ":", color="0.4",
                        label="%s fit: %.2f + %.3f·layers ms, R² = %.4f" % (e, a0, b0, r2))
        ax.set_xlabel("layers run (model.layers)")
        ax.set_ylabel("mean decode-only step (ms)")
        ax.set_title(m, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("Fig. 8: decode step vs layer count (measured), with the least-squares line", fontsize=12)
    save(fig, a, "fig8_layers", written,
         "Measured on %s. Mean decode-only step (no prompt tokens) of each run in %s/fig8-<model>-<engine>/ (median of repeats, "
         "bar = min-max). A straight line with R² near 1 is what lets a reduced-layer run stand for the full depth "
         "(full-depth equivalent = a + b·N)." % (machine(first), a.paper))


def sim_runs(root, name):
    """{point: [run]} of ROOT/<name>-fdsim/<point>/ (analysis/sls_predict.py: fd-sim on each measured run's experiment);
    a Skip when absent."""
    top = os.path.join(root, name + "-fdsim")
    if not os.path.isdir(top):
        raise Skip("%s not found (analysis/sls_predict.py writes it)" % top)
    out = {}
    for p in sorted(os.listdir(top)):
        d = os.path.join(top, p)
        if os.path.isfile(os.path.join(d, "summary.json")):
            r = load_run(d)
            r["run_tps"] = r["summary"].get("results", {}).get("tokens_per_s")  # fd-sim's whole-run rate
            out[p] = [r]
    if not out:
        raise Skip("no fd-sim output under %s" % top)
    return out


# One metric for every schedule (issue 42): each run's steady window (harness/step_stats.h: the steps strictly between
# the last admission and the first finish; a run whose admissions and finishes interleave with no such step, e.g.
# all-at-once over several batches, is its whole run: whole periods of the schedule); throughput = its tokens over the
# window's summed step time (results.steady.tokens_per_s), latency = p99 of its decode-only steps
# (results.steady.decode_step_ms.p99). Whole-run rates (tokens over the wall time, prefill and ramps included) are kept
# beside them. Repeats: the median, with the min and max.
SLS_WINDOW = ("steady window (results.steady): the steps between the last admission and the first finish, else the "
              "whole run; throughput over its summed step time, latency = p99 of its decode-only steps; "
              "the same rule for every schedule, median of the repeats")


def sls_data(root, name, sim=False):
    """{schedule mode: {p99, tps (steady window, median over repeats), p99_range, tps_range, whole_tps, whole_p99
    (whole run), mean_batch, imbalance (steady p50, max over repeats), repeats, run (the first), steps: [(step, ms, W)]}}
    of the measured runs, or (sim=True) of fd-sim's predictions for them."""
    out = {}
    for runs in (sim_runs(root, name) if sim else sweep_runs(root, name)).values():
        r = runs[0]
        cfg = r["summary"]["config"]
        mode = cfg["mode"] if sim else cfg["schedule"]["mode"]
        dec = decode_steps(r["steps"])
        if not dec or dec[0].get("step_ms") is None:
            continue  # fd-sim without costs
        res = [x["summary"]["results"] for x in runs]
        p99s = [((x.get("steady") or {}).get("decode_step_ms") or {}).get("p99") for x in res]
        tpss = [(x.get("steady") or {}).get("tokens_per_s") for x in res]
        p99, tps = med(p99s), med(tpss)
        imb = [x.get("worker_kv_imbalance", {}).get("steady") or {} for x in res]
        out[mode] = {"p99": p99[0], "p99_range": p99[1:], "tps": tps[0], "tps_range": tps[1:], "p99s": p99s, "tpss": tpss,
                     "whole_tps": med([x.get("output_throughput", x.get("tokens_per_s")) for x in res])[0],
                     "whole_p99": med([((x.get("decode_only") or {}).get("step_ms") or {}).get("p99") for x in res])[0],
                     "mean_batch": med([(x.get("steady") or {}).get("mean_batch") for x in res])[0],
                     "imbalance": (med([i.get("p50") for i in imb])[0], max([i["max"] for i in imb if i.get("max")], default=None)),
                     "repeats": len(runs), "run": r,
                     "steps": [(x["step"], x["step_ms"], x.get("total_context", 0)) for x in r["steps"]]}
    return out


def paired_ratio(num, den):
    """The median over repeats of num[k] / den[k] when both have the same number of repeats (a sweep interleaves
    repeat k of every point side by side: analysis/compare.py pairs them the same way), else median / median."""
    if len(num) == len(den) and all(x is not None for x in num + den):
        return statistics.median(a / b for a, b in zip(num, den))
    return med(num)[0] / med(den)[0]


def sls_ratios(d, base_mode="all-at-once"):
    """{mode: (latency ratio = its steady p99 / the base's (all-at-once's window is its whole run: its peak load),
    throughput ratio - 1)} for the other modes, one metric for all (SLS_WINDOW), paired by repeat."""
    base = d.get(base_mode)
    if not base:
        return {}
    return {m: (paired_ratio(v["p99s"], base["p99s"]), paired_ratio(v["tpss"], base["tpss"]) - 1.0)
            for m, v in d.items() if m != base_mode}


def fig11(a, written):
    names = present(a.paper, ["fig11-sls-s1024", "fig11-sls-s768"])
    if not names:
        raise Skip("no fig11-sls-s1024 / fig11-sls-s768 sweep under %s" % a.paper)
    fig, axes = plt.subplots(len(names), 1, figsize=(13, 6.4 * len(names)), squeeze=False)
    machines = []
    for ax, name in zip(axes[:, 0], names):
        d = sls_data(a.paper, name)
        ratios = sls_ratios(d)
        try:
            sim = sls_data(a.paper, name, sim=True)
        except Skip as e:
            print("fig_paper: %s: no fd-sim prediction (%s)" % (name, e))
            sim = {}
        sim_r = sls_ratios(sim)
        colors = {}
        for mode, v in sorted(d.items()):
            if not machines or machines[-1][0] != name:
                machines.append((name, machine(v["run"]), v["repeats"]))
            lab = "%s: p99 %.1f ms, %.0f tok/s" % (mode, v["p99"], v["tps"])
            if mode in ratios:
                lab += " = %.0f %% of all-at-once's p99, %+.1f %% tok/s" % (100 * ratios[mode][0], 100 * ratios[mode][1])
            if v["imbalance"][0]:
                lab += "; busiest/mean worker KV %.3f" % v["imbalance"][0]
            l, = ax.plot([s for s, _, _ in v["steps"]], [ms for _, ms, _ in v["steps"]], lw=0.7, label="measured " + lab)
            colors[mode] = l.get_color()
        for mode, v in sorted(sim.items()):
            lab = "MODELLED (fd-sim, the machine's profile) %s: p99 %.1f ms, %.0f tok/s" % (mode, v["p99"], v["tps"])
            if mode in sim_r:
                lab += " = %.0f %%, %+.1f %%" % (100 * sim_r[mode][0], 100 * sim_r[mode][1])
            ax.plot([s for s, _, _ in v["steps"]], [ms for _, ms, _ in v["steps"]], "--", lw=0.9, color=colors.get(mode, "0.4"), label=lab)
        ax.set_yscale("log")
        ax.set_xlabel("step (the first repeat's)")
        ax.set_ylabel("step latency (ms)")
        ax.set_title("%s (paper: SLS at 66-70 %% of the peak, +8-11 %% throughput; +13 %% at S = 768)" % name, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)  # below the axes, not over the steps
    fig.suptitle("Figs. 11/12: per-step latency under admission schedules, FastDecode measured end to end (solid) and "
                 "MODELLED by fd-sim (dashed)", fontsize=12)
    save(fig, a, "fig11_sls_measured", written,
         "Measured on %s, real generation. Every schedule judged the same way: %s. Dashed: fd-sim on each run's "
         "experiment with the profile measured on the same machine (analysis/sls_predict.py; MODELLED)." % (
             "; ".join("%s: %s, %d repeats interleaved" % m for m in machines), SLS_WINDOW))


def scaling_data(root, name):
    """[(cores, median tok/s, min, max)] sorted by cores, and the efficiency vs the fewest cores."""
    rows = []
    for runs in sweep_runs(root, name).values():
        rw = runs[0]["summary"]["config"]["engine"]["rworkers"]
        md, lo, hi = med([r["decode_tps"] for r in runs])
        if md is not None:
            rows.append((rw["spawn"] * rw["threads"], md, lo, hi))
    rows.sort()
    if not rows:
        raise Skip("%s: no decode-only steps" % name)
    p0, t0 = rows[0][0], rows[0][1]
    eff = [(p, t / (t0 * p / p0)) for p, t, _, _ in rows]
    return rows, eff


def fig13(a, written):
    names = present(a.paper, ["fig13-scaling-s1024", "fig13-scaling-s128"])
    if not names:
        raise Skip("no fig13-scaling-s* sweep under %s" % a.paper)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    first = None
    for name in names:
        rows, eff = scaling_data(a.paper, name)
        first = first or next(iter(sweep_runs(a.paper, name).values()))[0]
        P = [r[0] for r in rows]
        ax1.errorbar(P, [r[1] for r in rows], yerr=[[r[1] - r[2] for r in rows], [r[3] - r[1] for r in rows]], fmt="o-",
                     capsize=3, label=name)
        ax1.plot(P, [rows[0][1] * p / rows[0][0] for p in P], ":", color="0.5")
        ax2.plot(P, [100 * e for _, e in eff], "o-", label="%s: %.0f %% at %d cores" % (name, 100 * eff[-1][1], eff[-1][0]))
    ax1.set_xlabel("R-worker cores (workers × threads)")
    ax1.set_ylabel("decode tokens/s (2 layers)")
    ax1.set_title("throughput (dotted: linear from the fewest cores)", fontsize=10)
    ax2.set_xlabel("R-worker cores")
    ax2.set_ylabel("efficiency (%)")
    ax2.set_ylim(0, 110)
    ax2.set_title("strong-scaling efficiency (paper: 72.8 % 7b, 84.1 % 13b from 1 to 8 sockets at S = 1024)", fontsize=9)
    for ax in (ax1, ax2):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Fig. 13: R-worker strong scaling, measured (FastDecode, Llama-2-7b)", fontsize=12)
    save(fig, a, "fig13_scaling", written,
         "Measured on %s. Decode-only tokens/s per point of %s/fig13-scaling-s<S>/; efficiency = tokens/s(P) / (P/P0 · tokens/s(P0)), "
         "P0 the fewest cores measured. The paper's unit is a socket; ours is a core of one socket." % (machine(first), a.paper))


def dilemma_data(root):
    """Fig. 3's three curves, seconds per token per layer vs B: {"spart": [(B, s)], "gpu_attention": [...],
    "cpu_attention": [...]} from ROOT/fig3/ (fd-spart-bench, fd-kernel-bench --only decode-batch, fd-attn-bench),
    and the files' provenance (machine text)."""
    d = os.path.join(root, "fig3")
    if not os.path.isdir(d):
        raise Skip("%s not found (scripts/reproduce.sh fig3 writes it)" % d)
    out, where = {}, {}
    for name in sorted(os.listdir(d)):
        path = os.path.join(d, name)
        if name.startswith("spart_") and name.endswith(".json"):
            j = json.load(open(path))
            out["spart %s" % j.get("model", name)] = [(r["B"], r["spart_ms"] / 1e3 / r["B"]) for r in sorted(j["rows"], key=lambda r: r["B"])]
            where["spart"] = j.get("provenance", {})
        elif name == "gpu_attention_vs_b.json":
            j = json.load(open(path))
            rows = [(int(b["name"].split("/B")[1].split("/")[0]), b["seconds_per_token"]) for b in j["benchmarks"]
                    if "/attention/" in b["name"] and "seconds_per_token" in b]
            out["gpu_attention"] = sorted(rows)
            where["gpu"] = j.get("context", {})
            where["gpu_name"] = j.get("context", {}).get("fd_device")
        elif name == "cpu_attention_vs_b.json":
            j = json.load(open(path))
            rows = [(int(b["name"].split("B:")[1].split("/")[0]), 1.0 / b["tokens_per_second"]) for b in j["benchmarks"]
                    if b["name"].startswith("decode_attention/") and b.get("tokens_per_second")]
            out["cpu_attention"] = sorted(rows)
            where["cpu"] = j.get("context", {})
    if not out:
        raise Skip("no fig3 benchmark file in %s" % d)
    return out, where


def fig3m(a, written):
    data, where = dilemma_data(a.paper)
    fig, ax = plt.subplots(figsize=(9, 5.6))
    for k, rows in sorted(data.items()):
        style = "o-" if k.startswith("spart") else ("s--" if k == "gpu_attention" else "^--")
        lab = {"gpu_attention": "decode attention on the GPU (ctx 1024, 32 heads)",
               "cpu_attention": "decode attention on the CPU R-worker kernel (ctx 1024, all cores)"}.get(k, k.replace("spart", "S-Part, one layer,"))
        ax.plot([r[0] for r in rows], [1e6 * r[1] for r in rows], style, label=lab)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch B")
    ax.set_ylabel("time per token per layer (µs)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ctx = where.get("cpu") or {}
    fig.suptitle("Fig. 3: the dilemma, measured: the S-Part's cost per token falls with B, attention's does not", fontsize=11)
    save(fig, a, "fig3_dilemma", written,
         "Measured: %s/fig3/ (fd-spart-bench: one layer's S-Part, CUDA events; fd-kernel-bench decode-batch: the GPU's "
         "flash-decoding kernel; fd-attn-bench: the R-worker's CPU kernel, %s threads). Machine: %s, %s." % (
             a.paper, ctx.get("fd_threads", ctx.get("num_cpus", "?")), where.get("gpu_name") or "GPU not recorded",
             ctx.get("fd_cpu_model", "CPU not recorded")))


FIGURES = (("fig3m", fig3m), ("fig8", fig8), ("fig11m", fig11), ("fig13s", fig13))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paper", required=True, help="root of the sweep folders (scripts/reproduce.sh --out)")
    ap.add_argument("--out", required=True, help="folder for the figures (created)")
    a = ap.parse_args(argv)
    a.formats = ("png", "pdf")
    os.makedirs(a.out, exist_ok=True)
    written = []
    for name, fn in FIGURES:
        try:
            fn(a, written)
        except Skip as e:
            plt.close("all")
            print("skipped %s: %s" % (name, e))
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
