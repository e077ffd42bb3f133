#!/usr/bin/env python3
"""Paper-style figures (FastDecode Figs. 3, 9, 11, 13, 15) from committed results.

Reads the JSON under --artifacts (default artifacts/sworker/gpu-machine; see its README.md):

  fig3_spart_vs_gemm.png      spart_*.json: one layer's S-Part and its cuBLAS GEMMs alone vs B, and per token
  fig9_throughput.png         e2e.json: decode tokens/s, FastDecode vs GPU-only, per model x balance (*-full, *-a10)
  fig15_step_breakdown.png    e2e.json: mean decode step of each FastDecode run and where it goes
  fig13_rworker_scaling.png   validation.json: measured tokens/s vs R-worker CPUs P (Llama-2-7b, B ~ 908)
                              next to the performance model's predictions (MODELLED)
  fig11_per_step_latency.png  step_ms per step: of fd-sim output folders under --sim-dir (MODELLED), else of
                              the e2e FastDecode runs (e2e/*/steps.jsonl)

With --baselines DIR (run folders <balance>/<model>/<engine>-b<B>/, see analysis/fig_baselines.py), also:

  fig9_baselines_throughput.png  (fig9b) decode tokens/s vs batch, every engine, with the paper's stated numbers
  fig10_token_latency.png        (fig10) token latency mean / p1 / p50 / p99 per engine and batch

Prints one line per file written and "skipped figN: why" for a figure whose inputs are missing; exits 0
if at least one figure was written, 1 otherwise.

usage: analysis/figures.py --out DIR [--artifacts DIR] [--sim-dir DIR] [--baselines DIR [--published FILE]]
"""
import argparse
import glob
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from fd_runs import decode_steps  # noqa: E402
import fig_baselines  # noqa: E402

DPI = 120
CAPTION_SIZE = 7.5


class Skip(Exception):
    """A figure's inputs are missing or unusable; the message says why."""


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------

def load_json(path):
    if not os.path.isfile(path):
        raise Skip("%s not found" % path)
    try:
        with open(path) as f:
            return json.load(f)
    except ValueError as e:
        raise Skip("%s is not valid JSON (%s)" % (path, e))


def load_jsonl(path):
    if not os.path.isfile(path):
        raise Skip("%s not found" % path)
    rows = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as e:
                    raise Skip("%s:%d is not valid JSON (%s)" % (path, i, e))
    return rows


def machine_of(prov):
    """'NVIDIA H200 (132 SMs), 16-core Intel(R) Xeon(R) Processor' from a provenance object (either key set)."""
    if not prov:
        return None
    parts = []
    gpus = prov.get("gpus") or []
    if gpus:
        g = gpus[0]
        parts.append("%s (%s SMs)" % (g.get("name", "GPU"), g.get("sm_count", "?")) + (" x%d" % len(gpus) if len(gpus) > 1 else ""))
    cpu = prov.get("cpu_model") or prov.get("cpu")
    if cpu:
        cores = prov.get("cpu_cores")
        parts.append(("%s-core %s" % (cores, cpu)) if cores else cpu)
    return ", ".join(parts) or None


def e2e_machine(artifacts, rows):
    """The machine of the e2e runs: e2e.json's provenance lacks the CPU, the run folders' summary.json have it."""
    for r in rows:
        p = os.path.join(artifacts, "e2e", r.get("name", ""), "summary.json")
        if os.path.isfile(p):
            try:
                m = machine_of(json.load(open(p)).get("provenance"))
            except ValueError:
                m = None
            if m:
                return m
    for r in rows:
        m = machine_of(r.get("provenance"))
        if m:
            return m
    return "machine not recorded"


def add_caption(fig, text):
    fig.text(0.01, 0.008, text, fontsize=CAPTION_SIZE, ha="left", va="bottom", wrap=True, color="0.25")


def save(fig, out_dir, name, written):
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    written.append(path)
    print("wrote %s" % path)


# ------------------------------------------------------------------------------------------------
# Fig. 3: S-Part vs cuBLAS GEMMs alone
# ------------------------------------------------------------------------------------------------

def fig3(a, written):
    files = sorted(glob.glob(os.path.join(a.artifacts, "spart_*.json")))
    if not files:
        raise Skip("no spart_*.json in %s" % a.artifacts)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.6))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    machines, commits, used = [], [], []
    for i, path in enumerate(files):
        d = load_json(path)
        rows = sorted(d.get("rows") or [], key=lambda r: r["B"])
        if not rows:
            print("figures: %s has no rows, left out of fig3" % path, file=sys.stderr)
            continue
        used.append(os.path.basename(path))
        c = colors[i % len(colors)]
        label = "%s, %s SMs" % (d.get("model", "?"), d.get("sm_count", "?"))
        B = [r["B"] for r in rows]
        sp = [r["spart_ms"] for r in rows]
        gm = [r["gemm_ms"] for r in rows]
        last = rows[-1]
        ax1.plot(B, sp, "o-", color=c, label="%s: S-Part (%.2f× the GEMMs at B=%d)" % (label, last["spart_ms"] / last["gemm_ms"], last["B"]))
        ax1.plot(B, gm, "x--", color=c, label=label + ": cuBLAS GEMMs alone")
        ax2.plot(B, [1e3 * s / b for s, b in zip(sp, B)], "o-", color=c, label=label + ": S-Part")
        ax2.plot(B, [1e3 * g / b for g, b in zip(gm, B)], "x--", color=c, label=label + ": GEMMs alone")
        m = machine_of(d.get("provenance")) or d.get("device")
        if m and m not in machines:
            machines.append(m)
        cm = (d.get("provenance") or {}).get("git_commit")
        if cm and cm not in commits:
            commits.append(cm)
    if not used:
        raise Skip("no spart_*.json in %s has rows" % a.artifacts)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: "%g" % v))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: "%g" % v))
        ax.set_xlabel("batch B (decode tokens per step)")
        ax.grid(True, which="both", alpha=0.3)
    ax1.set_ylabel("time per layer (ms)")
    ax1.set_title("One layer's S-Part vs its GEMMs alone", fontsize=10)
    ax2.set_ylabel("time per token per layer (µs) = time / B")
    ax2.set_title("Per-token cost falls ~B-fold: batching pays for the S-Part", fontsize=10)
    ax1.legend(fontsize=7, loc="upper left")
    ax2.legend(fontsize=7, loc="upper right")
    fig.suptitle("Fig. 3: S-Part (fp16 GEMMs + elementwise kernels) vs cuBLAS GEMMs alone, by batch size", fontsize=12)
    add_caption(fig, "Machine: %s. Measured: numbers from %s (fd-spart-bench, commit %s; CUDA events; no host transfers)."
                % ("; ".join(machines) or "not recorded", ", ".join(used), ", ".join(commits) or "?"))
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    save(fig, a.out, "fig3_spart_vs_gemm.png", written)


# ------------------------------------------------------------------------------------------------
# Fig. 9: decode throughput, FastDecode vs GPU-only
# ------------------------------------------------------------------------------------------------

def short_balance(b):
    return "A10-like\n" + b[len("A10-like"):].strip() if b.startswith("A10-like") else b


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
    fig, ax = plt.subplots(figsize=(11, 6))
    w = 0.38
    ticks = []
    for i, (m, bal, f, g) in enumerate(groups):
        for dx, r, color, label in ((-w / 2, f, "tab:blue", "FastDecode (CUDA S-Part + CPU R-workers)"),
                                    (w / 2, g, "tab:orange", "GPU-only (attention on the GPU)")):
            if r is None:
                continue
            v = r["decode_tokens_per_s"]
            ax.bar(i + dx, v, w, color=color, label=label if i == 0 or label not in ax.get_legend_handles_labels()[1] else None)
            extra = "\nP=%d CPUs" % r["rworker_cpus"] if r.get("rworker_cpus") else ""
            ax.annotate("%s\nB=%.0f%s" % (format(round(v), ",").replace(",", " "), r["mean_batch"], extra), (i + dx, v),
                        textcoords="offset points", xytext=(0, 3), ha="center", va="bottom", fontsize=8)
        ratio = ("\nFD / GPU-only = %.3f" % (f["decode_tokens_per_s"] / g["decode_tokens_per_s"])) if f and g else ""
        ticks.append("%s\n%s%s" % (m, short_balance(bal), ratio))
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(ticks, fontsize=9)
    ax.set_yscale("log")
    ymax = max(r["decode_tokens_per_s"] for _, _, f, g in groups for r in (f, g) if r)
    ymin = min(r["decode_tokens_per_s"] for _, _, f, g in groups for r in (f, g) if r)
    ax.set_ylim(10 ** int(math.floor(math.log10(ymin / 3))), ymax * 8)
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: format(v, ",.0f").replace(",", " ")))
    ax.set_ylabel("decode throughput (tokens/s, log scale)")
    ax.legend(fontsize=9, loc="upper right")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.set_title("Fig. 9: decode throughput, FastDecode vs GPU-only (label: tokens/s, mean batch B over decode-only steps)",
                 fontsize=11)
    add_caption(fig, "Machine: %s. Measured: numbers from e2e.json (analysis/e2e_report.py over e2e/*/: decode-only steps). "
                "Models reduced to 2 of 32 layers (memory accounted at full depth): tokens/s are of the 2-layer model. "
                "1024 requests, prompt 512, 32 new tokens. A10-like = 24 GB budget and a 16-SM green context."
                % e2e_machine(a.artifacts, rows))
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    save(fig, a.out, "fig9_throughput.png", written)


# ------------------------------------------------------------------------------------------------
# Fig. 15: where a FastDecode decode step goes
# ------------------------------------------------------------------------------------------------

def other_note(artifacts, name):
    """'other' per decode-only step from the run's steps.jsonl, if committed: its median and the last step's."""
    path = os.path.join(artifacts, "e2e", name, "steps.jsonl")
    if not os.path.isfile(path):
        return ""
    try:
        dec = decode_steps(load_jsonl(path))
        oth = sorted(x["step_ms"] - x["breakdown_ms"].get("s_compute", 0.0) - x["breakdown_ms"].get("r_wait", 0.0) for x in dec)
        last = dec[-1]["step_ms"] - dec[-1]["breakdown_ms"].get("s_compute", 0.0) - dec[-1]["breakdown_ms"].get("r_wait", 0.0)
    except (Skip, KeyError, IndexError, TypeError):
        return ""
    return "\nother: median %.1f, last step %.0f ms" % (oth[len(oth) // 2], last)


def fig15(a, written):
    rows = [r for r in load_json(os.path.join(a.artifacts, "e2e.json")) if r.get("engine") == "fastdecode"]
    rows = [r for r in rows if r.get("breakdown_ms") and r.get("mean_step_ms")]
    if not rows:
        raise Skip("e2e.json has no FastDecode run with a step breakdown")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 1.4 + 1.1 * len(rows)), gridspec_kw={"width_ratios": [3, 2]})
    h = 0.36
    labels = []
    for i, r in enumerate(rows):
        bd = r["breakdown_ms"]
        step = r["mean_step_ms"]
        s, rw, rc = bd.get("s_compute", 0.0), bd.get("r_wait", 0.0), bd.get("r_compute_max", 0.0)
        other = step - s - rw
        if other < 0:
            print("figures: %s: s_compute + r_wait exceeds the mean step by %.2f ms; 'other' drawn as 0"
                  % (r["name"], -other), file=sys.stderr)
            other = 0.0
        y = i
        parts = ((s, "tab:green", "s_compute: S-Part on the GPU"),
                 (rw, "tab:red", "r_wait: S-worker waits for R-worker replies"),
                 (other, "0.7", "other = step − s_compute − r_wait (sampling, frees; per run: median and last step)"))
        for ax, scale in ((ax1, 1.0), (ax2, 100.0 / step)):
            left = 0.0
            for v, c, lab in parts:
                ax.barh(y - h / 2, v * scale, h, left=left, color=c, label=lab if i == 0 else None)
                left += v * scale
            ax.barh(y + h / 2, rc * scale, h, color="tab:purple", hatch="//", alpha=0.8,
                    label="r_compute_max: busiest R-worker's own compute (overlaps r_wait)" if i == 0 else None)
        ax1.annotate("step %.1f ms" % step, (step, y - h / 2), textcoords="offset points", xytext=(4, 0), va="center", fontsize=8)
        ax1.annotate("%.1f ms" % rc, (rc, y + h / 2), textcoords="offset points", xytext=(4, 0), va="center", fontsize=8)
        ax2.annotate("S %.0f%%" % (100 * s / step), (100 * s / step, y - h / 2), textcoords="offset points", xytext=(3, 0),
                     va="center", fontsize=7.5, color="white" if s / step > 0.08 else "black")
        ax2.annotate("R busy %.0f%%" % (100 * rc / step), (100 * rc / step, y + h / 2), textcoords="offset points",
                     xytext=(-3, 0), ha="right", va="center", fontsize=7.5, color="white")
        labels.append("%s\nB=%.0f, P=%s CPUs%s" % (r["name"], r["mean_batch"], r.get("rworker_cpus") or "?",
                                                  other_note(a.artifacts, r["name"])))
    ax1.set_yticks(range(len(rows)))
    ax1.set_yticklabels(labels, fontsize=8)
    ax1.invert_yaxis()
    ax2.set_yticks(range(len(rows)))
    ax2.set_yticklabels([])
    ax2.invert_yaxis()
    ax1.set_xlabel("mean decode step (ms, 2 layers)")
    ax1.set_xlim(right=max(r["mean_step_ms"] for r in rows) * 1.2)
    ax2.set_xlabel("share of the mean decode step (%)")
    ax2.set_xlim(0, 105)
    for ax in (ax1, ax2):
        ax.grid(True, axis="x", alpha=0.3)
    ax1.set_title("absolute (upper bar: step = s_compute + r_wait + other; lower: busiest R-worker)", fontsize=9)
    ax2.set_title("as a share of the step", fontsize=9)
    handles, labs = ax1.get_legend_handles_labels()
    fig.legend(handles, labs, loc="upper center", ncol=2, fontsize=8, bbox_to_anchor=(0.5, 0.955))
    fig.suptitle("Fig. 15: where a FastDecode decode step goes (mean over decode-only steps)", fontsize=12)
    add_caption(fig, "Machine: %s. Measured: numbers from e2e.json (breakdown_ms per step averaged by analysis/e2e_report.py). "
                "2 of 32 layers run; 2 mini-batches pipelined, so r_compute_max can exceed r_wait. 'other' is almost all in each run's "
                "last decode step (read from e2e/<run>/steps.jsonl)." % e2e_machine(a.artifacts, rows))
    top = 1 - 0.8 / fig.get_figheight()
    fig.tight_layout(rect=(0, 0.5 / fig.get_figheight(), 1, top))
    save(fig, a.out, "fig15_step_breakdown.png", written)


# ------------------------------------------------------------------------------------------------
# Fig. 13: R-worker scaling, measured vs the performance model
# ------------------------------------------------------------------------------------------------

FIG13_RUNS = ("llama-2-7b-fastdecode-p6", "llama-2-7b-fastdecode-full")


def fig13(a, written):
    rows = [r for r in load_json(os.path.join(a.artifacts, "validation.json")) if r.get("run") in FIG13_RUNS]
    if not rows:
        raise Skip("validation.json has no rows of %s" % " / ".join(FIG13_RUNS))
    measured = sorted({(r["P"], r["measured_tok_s"], r["run"], r["B"]) for r in rows})
    fig, ax = plt.subplots(figsize=(10, 6))
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
    ax.plot(P, T, "o-", color="tab:red", ms=9, lw=2, label="measured (decode-only steps)")
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
    ax.set_xlim(0, pmax)
    ax.set_ylim(0, None)
    ax.set_xlabel("R-worker CPUs P (cores, pinned)")
    ax.set_ylabel("decode throughput (tokens/s, 2-layer model)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0, 0.93))
    ax.set_title("Fig. 13: R-worker scaling, Llama-2-7b, B ≈ %.0f, W ≈ %.0f tokens: measured vs MODELLED\n"
                 "(dashed: model tokens/s = B / (N·max(2·T(B/2), W·R/P)) over P)" % (rows[0]["B"], rows[0]["W"]), fontsize=11)
    prov = None
    e2e = os.path.join(a.artifacts, "e2e", rows[0]["run"], "summary.json")
    if os.path.isfile(e2e):
        try:
            prov = json.load(open(e2e)).get("provenance")
        except ValueError:
            prov = None
    add_caption(fig, "Machine: %s. Numbers from validation.json (analysis/perf_model_validation.py): measured = the e2e runs, "
                "predicted = the performance model with T(B) and R from profile_*_cuda_r{1,6,12}.json (MODELLED). "
                "2 of 32 layers run (N = 2)." % (machine_of(prov) or "the GPU machine (see artifacts/sworker/README.md)"))
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    save(fig, a.out, "fig13_rworker_scaling.png", written)


# ------------------------------------------------------------------------------------------------
# Fig. 11: per-step latency
# ------------------------------------------------------------------------------------------------

def sim_folders(sim_dir):
    if not os.path.isdir(sim_dir):
        raise Skip("--sim-dir %s is not a directory" % sim_dir)
    cands = [sim_dir] + sorted(os.path.join(sim_dir, d) for d in os.listdir(sim_dir))
    return [d for d in cands if os.path.isfile(os.path.join(d, "steps.jsonl")) and os.path.isfile(os.path.join(d, "summary.json"))]


def sim_label(cfg, res):
    mode = cfg.get("mode", "?")
    lab = mode
    if mode == "fixed-interval":
        lab += " (F=%s)" % cfg.get("interval")
    elif mode == "load-control":
        lab += " (W_lim=%s%s)" % (cfg.get("w_lim"), ", min_gap=%s" % cfg["min_gap"] if cfg.get("min_gap") else "")
    lab += ", B=%s, S=%s" % (cfg.get("batch"), cfg.get("seq"))
    if res.get("tokens_per_s"):
        lab += ": %.0f tok/s" % res["tokens_per_s"]
    return "MODELLED " + lab


def fig11_sim(a, written):
    folders = sim_folders(a.sim_dir)
    if not folders:
        raise Skip("no fd-sim output folder (steps.jsonl + summary.json) in %s" % a.sim_dir)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 8), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    used, costs = [], []
    for d in folders:
        s = load_json(os.path.join(d, "summary.json"))
        steps = load_jsonl(os.path.join(d, "steps.jsonl"))
        steps = [x for x in steps if x.get("step_ms") is not None]
        # Without cost flags fd-sim writes null times (steps.jsonl and summary.json).
        if not any(x["step_ms"] > 0 for x in steps) or s.get("results", {}).get("duration_s") is None:
            print("figures: %s has no step times (fd-sim without cost flags), left out of fig11" % d, file=sys.stderr)
            continue
        cfg = s.get("config", {})
        lab = sim_label(cfg, s.get("results", {}))
        x = [st["step"] for st in steps]
        line, = ax1.plot(x, [st["step_ms"] for st in steps], "-", lw=1.4, label=lab)
        ax2.plot(x, [st["total_context"] for st in steps], "-", lw=1.2, color=line.get_color(), label=lab)
        peak = s.get("results", {}).get("peak_step_ms")
        if peak:
            ax1.axhline(peak, color=line.get_color(), lw=0.6, ls=":")
        used.append(os.path.relpath(d, a.sim_dir) if d != a.sim_dir else os.path.basename(os.path.normpath(d)))
        c = cfg.get("cost", {})
        desc = "N=%s, P=%s, " % (c.get("layers"), ("%g" % c["rworkers"]) if isinstance(c.get("rworkers"), (int, float)) else c.get("rworkers"))
        if c.get("profile"):
            desc += "T, R from %s" % os.path.basename(c["profile"])
        else:
            desc += "S %s ms/step, R %s ns/token/layer" % (c.get("t_ms_per_step_s_part") or "T(B) table",
                                                            ("%.0f" % (c["r_s_per_token_layer"] * 1e9)) if c.get("r_s_per_token_layer") else "?")
        if desc not in costs:
            costs.append(desc)
    if not used:
        raise Skip("the fd-sim folders in %s have no step times (run fd-sim with cost flags)" % a.sim_dir)
    ax1.set_ylabel("step latency (ms, simulated)")
    ax1.set_title("step_ms per step (dotted: each run's peak)", fontsize=9)
    handles, labs = ax1.get_legend_handles_labels()
    fig.legend(handles, labs, loc="upper center", ncol=2 if len(labs) > 1 else 1, fontsize=8, bbox_to_anchor=(0.5, 0.95))
    ax1.grid(True, alpha=0.3)
    ax2.set_ylabel("total context W (tokens)")
    ax2.set_xlabel("step (engine iteration)")
    ax2.set_title("load on the R-workers: total context per step", fontsize=9)
    ax2.grid(True, alpha=0.3)
    fig.suptitle("Fig. 11: per-step latency under different admission schedules (MODELLED, fd-sim)", fontsize=12)
    add_caption(fig, "No hardware: MODELLED by fd-sim's cost model (step = max(N·T(n), N·W·R/P); %s). "
                "Numbers from summary.json + steps.jsonl of %s in %s." % ("; ".join(costs), ", ".join(used), a.sim_dir))
    fig.tight_layout(rect=(0, 0.04, 1, 0.95 - 0.022 * ((len(labs) + 1) // 2)))
    save(fig, a.out, "fig11_per_step_latency.png", written)


def fig11_e2e(a, written):
    runs = []
    for d in sorted(glob.glob(os.path.join(a.artifacts, "e2e", "*"))):
        sp = os.path.join(d, "summary.json")
        if not (os.path.isfile(sp) and os.path.isfile(os.path.join(d, "steps.jsonl"))):
            continue
        s = load_json(sp)
        if s.get("engine") == "fastdecode":
            runs.append((d, s, load_jsonl(os.path.join(d, "steps.jsonl"))))
    if not runs:
        raise Skip("no FastDecode run folder with steps.jsonl under %s" % os.path.join(a.artifacts, "e2e"))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 8), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    for d, s, steps in runs:
        x = [st["step"] for st in steps]
        line, = ax1.plot(x, [st["step_ms"] for st in steps], "-", lw=1.2, label=s.get("name", os.path.basename(d)))
        c = line.get_color()
        pre = [st for st in steps if st.get("prefill_tokens", 0) > 0]
        dec = decode_steps(steps)
        ax1.plot([st["step"] for st in pre], [st["step_ms"] for st in pre], "o", mfc="none", color=c, ms=5)
        ax1.plot([st["step"] for st in dec], [st["step_ms"] for st in dec], "o", color=c, ms=3)
        ax2.plot(x, [st.get("decode_tokens", 0) for st in steps], "-", color=c, lw=1.2)
    ax1.plot([], [], "o", mfc="none", color="0.3", label="step with prefill (admission)")
    ax1.plot([], [], "o", color="0.3", ms=3, label="decode-only step")
    ax1.set_yscale("log")
    ax1.set_ylabel("step latency (ms, log scale)")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8, ncol=2)
    ax1.set_title("step_ms per step (admission in prompt-budget waves, then decode, then drain)", fontsize=9)
    ax2.set_ylabel("decode tokens in the step (B)")
    ax2.set_xlabel("step (engine iteration)")
    ax2.grid(True, alpha=0.3)
    fig.suptitle("Fig. 11: per-step latency of the measured FastDecode runs", fontsize=12)
    add_caption(fig, "Machine: %s. Measured: numbers from e2e/<run>/steps.jsonl (and summary.json) of %d FastDecode runs in %s; "
                "2 of 32 layers run; all requests offered at once (no SLS: pass --sim-dir for fd-sim schedules)."
                % (machine_of(runs[0][1].get("provenance")) or "not recorded", len(runs), os.path.join(a.artifacts, "e2e")))
    fig.tight_layout(rect=(0, 0.04, 1, 0.96))
    save(fig, a.out, "fig11_per_step_latency.png", written)


def fig11(a, written):
    (fig11_sim if a.sim_dir else fig11_e2e)(a, written)


# ------------------------------------------------------------------------------------------------

FIGURES = (("fig3", fig3), ("fig9", fig9), ("fig15", fig15), ("fig13", fig13), ("fig11", fig11))


def baseline_figure(fn):
    """A figure of analysis/fig_baselines.py, its Skip reported as this module's."""
    def draw(a, written):
        try:
            fn(a, written)
        except fig_baselines.Skip as e:
            raise Skip(str(e))
    return draw


# Drawn when --baselines is given (every baseline engine's run folders).
BASELINE_FIGURES = (("fig9b", baseline_figure(fig_baselines.fig9)), ("fig10", baseline_figure(fig_baselines.fig10)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", default="artifacts/sworker/gpu-machine",
                    help="folder with spart_*.json, e2e.json, validation.json, e2e/*/ (default: %(default)s)")
    ap.add_argument("--out", required=True, help="folder for the PNGs (created)")
    ap.add_argument("--sim-dir", help="folder of fd-sim output folders (each with steps.jsonl and summary.json) for fig11")
    ap.add_argument("--baselines", nargs="+", help="root(s) of the baseline run folders for fig9b / fig10, read as one tree")
    ap.add_argument("--published", default=fig_baselines.DEFAULT_PUBLISHED, help="the paper's numbers for fig9b / fig10")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    written = []
    for name, fn in FIGURES + (BASELINE_FIGURES if a.baselines else ()):
        try:
            fn(a, written)
        except Skip as e:
            plt.close("all")
            print("skipped %s: %s" % (name, e))
        except (KeyError, ValueError, TypeError, IndexError, ZeroDivisionError, OSError) as e:
            plt.close("all")
            print("skipped %s: unexpected input (%s: %s)" % (name, type(e).__name__, e))
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
