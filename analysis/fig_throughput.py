"""Fig. 9 (FastDecode vs GPU-only, e2e.json) and Fig. 13 (R-worker scaling, validation.json): decode
throughput of reduced-layer runs, each drawn raw (left axis) and as its full-depth equivalent (right axis,
tokens/s × N/L: the step taken as L/N times the measured one, Fig. 8's linearity; also written in each
bar's label in Fig. 9)."""
import json
import math
import os

import matplotlib.pyplot as plt
import matplotlib.ticker

from fig_common import (FULL_DEPTH_NOTE, Skip, add_caption, depth_factor, e2e_machine, full_layers,
                        load_json, machine_of, save)


def spaced(v):
    return format(round(v), ",").replace(",", " ")


def short_balance(b):
    return "A10-like\n" + b[len("A10-like"):].strip() if b.startswith("A10-like") else b


def run_summary(artifacts, name):
    p = os.path.join(artifacts, "e2e", name, "summary.json")
    try:
        return json.load(open(p)) if os.path.isfile(p) else None
    except ValueError:
        return None


def depth_of(artifacts, r):
    """(layers run N, full depth L, factor N/L or None) of an e2e.json row."""
    n = r.get("layers")
    full = full_layers(r.get("model"), run_summary(artifacts, r.get("name", "")))
    return n, full, depth_factor(n, full)


def fig9(a, written):
    rows = load_json(os.path.join(a.artifacts, "e2e.json"))
    rows = [r for r in rows if r.get("name", "").endswith(("-full", "-a10"))]
    groups = []
    for m in sorted({r["model"] for r in rows}):
        for bal in sorted({r["balance"] for r in rows}, key=lambda b: (not b.startswith("full"), b)):
            f = [r for r in rows if r["model"] == m and r["balance"] == bal and r["engine"] == "fastdecode"]
            g = [r for r in rows if r["model"] == m and r["balance"] == bal and r["engine"] == "gpu-only"]
            if f or g:
                groups.append((m, bal, f[0] if f else None, g[0] if g else None))
    if not groups:
        raise Skip("e2e.json has no runs named *-full or *-a10")
    machine = e2e_machine(a.artifacts, rows)
    fig, ax = plt.subplots(figsize=(11, 6.4))
    w = 0.38
    ticks, depths = [], set()
    for i, (m, bal, f, g) in enumerate(groups):
        for dx, r, color, label in ((-w / 2, f, "tab:blue", "FastDecode (CUDA S-Part + CPU R-workers), measured"),
                                    (w / 2, g, "tab:orange", "GPU-only (attention on the GPU), measured")):
            if r is None:
                continue
            v = r["decode_tokens_per_s"]
            n, full, factor = depth_of(a.artifacts, r)
            depths.add((n, full, factor))
            ax.bar(i + dx, v, w, color=color, label=label if label not in ax.get_legend_handles_labels()[1] else None)
            extra = "\nP=%d CPUs" % r["rworker_cpus"] if r.get("rworker_cpus") else ""
            fd = "\n≈%s full-depth" % spaced(v * factor) if factor else ""
            ax.annotate("%s\nB=%.0f%s%s" % (spaced(v), r["mean_batch"], extra, fd), (i + dx, v),
                        textcoords="offset points", xytext=(0, 3), ha="center", va="bottom", fontsize=8)
        ratio = ("\nFD / GPU-only = %.3f" % (f["decode_tokens_per_s"] / g["decode_tokens_per_s"])) if f and g else ""
        ticks.append("%s\n%s%s" % (m, short_balance(bal), ratio))
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(ticks, fontsize=9)
    ax.set_yscale("log")
    vals = [r["decode_tokens_per_s"] for _, _, f, g in groups for r in (f, g) if r]
    ax.set_ylim(10 ** int(math.floor(math.log10(min(vals) / 3))), max(vals) * 12)
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: format(v, ",.0f").replace(",", " ")))
    ax.set_ylabel("decode throughput of the layers run (tokens/s, log scale)")
    # One unit on the axis (issue 45): the full-depth equivalent is in each bar's label, not on a second axis.
    ax.legend(fontsize=9, loc="upper right", title="machine: " + machine, title_fontsize=8)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.set_title("Beside Fig. 9: decode throughput, FastDecode vs GPU-only (label: tokens/s, mean batch B over decode-only steps,\n"
                 "full-depth equiv. %s)" % FULL_DEPTH_NOTE, fontsize=10)
    depth_text = "; ".join("%s of %s layers run" % (n, full) for n, full, _ in sorted(depths, key=str))
    add_caption(fig, "Machine: %s. Measured: numbers from e2e.json (analysis/e2e_report.py over e2e/*/: decode-only steps). "
                "Models reduced (%s; memory accounted at full depth): bars are the tokens/s of the layers run, "
                "'full-depth' = tokens/s × N/L. Balance under each pair: full = the whole GPU; A10-like = 24 GB budget and "
                "a 16-SM green context." % (machine, depth_text))
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    save(fig, a.out, "e2e_throughput.png", written, a.formats)


FIG13_RUNS = ("llama-2-7b-fastdecode-p6", "llama-2-7b-fastdecode-full")


def fig13(a, written):
    rows = [r for r in load_json(os.path.join(a.artifacts, "validation.json")) if r.get("run") in FIG13_RUNS]
    if not rows:
        raise Skip("validation.json has no rows of %s" % " / ".join(FIG13_RUNS))
    summary = run_summary(a.artifacts, rows[0]["run"])
    machine = machine_of((summary or {}).get("provenance")) or "the GPU machine (see artifacts/sworker/README.md)"
    measured = sorted({(r["P"], r["measured_tok_s"], r["run"], r["B"]) for r in rows})
    fig, ax = plt.subplots(figsize=(10.5, 6))
    pmax = max(16, max(p for p, *_ in measured))
    grid = [1 + i * (pmax - 1) / 150 for i in range(151)]
    for k, rt in enumerate(sorted({r["r_threads"] for r in rows})):
        sub = sorted([r for r in rows if r["r_threads"] == rt], key=lambda r: r["P"])
        c = plt.cm.viridis(0.15 + 0.3 * k)
        ax.plot([r["P"] for r in sub], [r["predicted_tok_s"] for r in sub], "s", color=c, ms=8,
                label="MODELLED, R from the %d-CPU profile (%s): %s" % (
                    rt, sub[0]["profile"], ", ".join("%.0f at P=%d" % (r["predicted_tok_s"], r["P"]) for r in sub)))
        # The model's curve over P for the same B, W, N, T: tokens/s = B / (N·max(t_s, W·R/P)).
        r0 = sub[0]
        curve = [r0["B"] / (r0["N"] * max(r0["t_s_ms"] / 1e3, r0["W"] * r0["R"] / p)) for p in grid]
        ax.plot(grid, curve, "--", color=c, lw=1)
    P = [m[0] for m in measured]
    T = [m[1] for m in measured]
    hw = ((summary or {}).get("config") or {}).get("hardware", {}).get("gpu")
    bal = "full GPU" if not (hw or {}).get("sm_count") else "%s GB, %s SMs" % (hw.get("memory_gb"), hw.get("sm_count"))
    ax.plot(P, T, "o-", color="tab:red", ms=9, lw=2, label="measured (decode-only steps), %s, %s" % (machine, bal))
    top_rt = max(r["r_threads"] for r in rows)
    for p, t, run, b in measured:
        pred = [r["predicted_tok_s"] for r in rows if r["run"] == run and r["r_threads"] == top_rt]
        ax.annotate("%.0f\n%s%s" % (t, run, "\n= %.2f × MODELLED (%d-CPU R)" % (t / pred[0], top_rt) if pred else ""), (p, t),
                    textcoords="offset points", xytext=(8, -30), fontsize=8, color="tab:red")
    if len(measured) >= 2:
        p0, t0 = P[0], T[0]
        ax.plot([0, pmax], [0, t0 * pmax / p0], ":", color="0.5", lw=1, label="linear scaling from measured P=%d" % p0)
        eff = (T[-1] / t0) / (P[-1] / p0)
        ax.text(0.02, 0.97, "P %d → %d: measured ×%.2f (scaling efficiency %.0f %%)" % (p0, P[-1], T[-1] / t0, 100 * eff),
                transform=ax.transAxes, va="top", fontsize=9)
    n = rows[0]["N"]
    full = full_layers(rows[0].get("model"), summary)
    factor = depth_factor(n, full)
    ax.set_xlim(0, pmax)
    ax.set_ylim(0, None)
    ax.set_xlabel("R-worker CPUs P (cores, pinned)")
    ax.set_ylabel("decode throughput (tokens/s, %s-layer model)" % n)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, 0.93))
    ax.set_title("Beside Fig. 13: R-worker scaling, Llama-2-7b, B ≈ %.0f, W ≈ %.0f tokens: measured vs MODELLED\n"
                 "(dashed: model tokens/s = B / (N·max(2·T(B/2), W·R/P)) over P)" % (rows[0]["B"], rows[0]["W"]), fontsize=11)
    add_caption(fig, "Machine: %s. Numbers from validation.json (analysis/perf_model_validation.py): measured = the e2e runs, "
                "predicted = the performance model with T(B) and R from profile_*_cuda_r{1,6,12}.json (MODELLED). "
                "%s of %s layers run (N = %s): full-depth equiv. = tokens/s × N/L%s %s." % (
                    machine, n, full or "?", n, " (× %.4g here)" % factor if factor else "", FULL_DEPTH_NOTE))
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    save(fig, a.out, "rworker_scaling_model.png", written, a.formats)
