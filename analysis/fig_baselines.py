#!/usr/bin/env python3
"""Figs. 9 and 10 with every baseline: decode throughput vs batch, and the token-latency distribution.

Input layout (one run folder per engine and batch, as fd-bench run or baselines/hf/run_hf.py writes it):

    artifacts/baselines/<balance>/<model>/[<window>/]<engine>-b<B>/summary.json
                                                                  /steps.jsonl

  <balance>  "full" (the whole H200) or "a10" (the A10-like emulation: hardware.gpu.memory_gb / sm_count);
             any other folder name is drawn under its own name
  <model>    our model config's name (llama-2-7b, llama-3-8b, ...)
  <engine>   fastdecode | gpu-only | paged-swap | vanilla | host-offload | hf-transformers (summary.json's
             "engine" must say the same, else the folder is left out with a printed reason)
             ("hf" is read as hf-transformers, as scripts/baselines-bench.sh names those folders)
  <B>        the batch the run was configured with (schedule batch, slots, --batch-size): the x axis of Fig. 9
  <window>   optional (scripts/baselines-bench.sh writes one): Fig. 9 draws the "steady" runs (steady-state
             decode windows), Fig. 10 the "life" runs (a sequence's whole life); without that window, the runs
             with no window level (else the first window, printed)

Drawn from steps.jsonl: the decode-only steps (analysis/fd_runs.py: no prompt tokens that step) give the decode
throughput (decode tokens / their wall time) and the token latency (their step_ms: mean, p1, p50, p99).
paged-swap steps that moved KV blocks (steps.jsonl "counts" swap_out_bytes / swap_in_bytes > 0, or breakdown_ms
swap_out_ms / swap_in_ms > 0) are marked one by one in Fig. 10.

The paper's numbers (experiments/paper/published.json: stated in its text, or derived from those by arithmetic;
its curves were not digitised) are drawn on an axis of their own, each as an unjoined marker labelled
"paper, A10+Epyc", in the row of the model with the paper model's shapes. An engine without a run folder is
printed and written in its panel as "not measured", never drawn.

  fig9_baselines_throughput.png   Fig. 9: decode tokens/s vs B, one series per engine, per model x balance
  fig10_token_latency.png         Fig. 10: per engine and B, mean / p1 / p50 / p99 token latency
  baselines_table.md              every run folder of both windows as a row: reached batch, decode and whole-run
                                  tokens/s, latency mean / p1 / p50 / p99, swap steps and bytes, commit

usage: analysis/fig_baselines.py --out DIR [--baselines ROOT...] [--published experiments/paper/published.json]
(analysis/figures.py draws both too, as fig9b and fig10.)
"""
import argparse
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from fd_runs import decode_steps, decode_tokens_per_s, jsonl_path, read_jsonl  # noqa: E402

ENGINES = ("fastdecode", "gpu-only", "paged-swap", "vanilla", "host-offload", "hf-transformers")
STYLE = {"fastdecode": ("tab:blue", "o"), "gpu-only": ("tab:orange", "s"), "paged-swap": ("tab:green", "^"),
         "vanilla": ("tab:red", "v"), "host-offload": ("tab:purple", "P"), "hf-transformers": ("tab:brown", "X")}
BALANCES = {"full": "full H200", "a10": "A10-like"}
PAPER = "paper, A10+Epyc"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PUBLISHED = os.path.join(REPO, "experiments", "paper", "published.json")
FOLDER = re.compile(r"^(?P<engine>[a-z0-9-]+)-b(?P<B>[0-9]+)$")
ALIASES = {"hf": "hf-transformers"}  # scripts/baselines-bench.sh names the transformers runs hf-b<B>
WINDOWS = {"fig9b": "steady", "fig10": "life"}
DPI = 120


class Skip(Exception):
    """A figure's inputs are missing; the message says why."""


def is_swap_step(st):
    c, b = st.get("counts") or {}, st.get("breakdown_ms") or {}
    return any(c.get(k, 0) > 0 for k in ("swap_out_bytes", "swap_in_bytes")) or \
        any(b.get(k, 0) > 0 for k in ("swap_out_ms", "swap_in_ms"))


def subdirs(d):
    return sorted(n for n in os.listdir(d) if os.path.isdir(os.path.join(d, n))) if os.path.isdir(d) else []


def run_folders(root):
    """(balance, model, window, engine, B, path) of every <balance>/<model>/[<window>/]<engine>-b<B>/ folder."""
    if not os.path.isdir(root):
        raise Skip("%s not found (layout: <balance>/<model>/[<window>/]<engine>-b<B>/, see analysis/fig_baselines.py)" % root)
    out = []
    for bal in subdirs(root):
        for model in subdirs(os.path.join(root, bal)):
            mdir = os.path.join(root, bal, model)
            for name in subdirs(mdir):
                inner = subdirs(os.path.join(mdir, name))
                if FOLDER.match(name):
                    cands = [("", name, os.path.join(mdir, name))]
                elif any(FOLDER.match(n) for n in inner):  # a window level
                    cands = [(name, n, os.path.join(mdir, name, n)) for n in inner]
                else:
                    print("fig_baselines: %s: neither <engine>-b<B> nor a window folder of them, left out" % os.path.join(mdir, name))
                    continue
                for window, n, d in cands:
                    m = FOLDER.match(n)
                    if not m:
                        print("fig_baselines: %s: not <engine>-b<B>, left out" % d)
                        continue
                    out.append((bal, model, window, ALIASES.get(m["engine"], m["engine"]), int(m["B"]), d))
    return out


def load_run(engine, d):
    """What the figures draw of one run folder, or None (printed why)."""
    sp = os.path.join(d, "summary.json")
    if not (os.path.isfile(sp) and jsonl_path(d, "steps.jsonl")):
        print("fig_baselines: %s: no summary.json + steps.jsonl, left out" % d)
        return None
    try:
        s = json.load(open(sp))
        steps = read_jsonl(d, "steps.jsonl")
    except (OSError, ValueError) as e:
        print("fig_baselines: %s: not valid JSON (%s), left out" % (d, e))
        return None
    eng = s.get("engine")
    eng = eng.get("type") if isinstance(eng, dict) else eng
    if eng != engine:
        print("fig_baselines: %s: summary.json says engine %r, the folder %r; left out" % (d, eng, engine))
        return None
    dec = decode_steps(steps)
    if not dec:
        print("fig_baselines: %s: no decode-only step, left out" % d)
        return None
    lat = [x["step_ms"] for x in dec]
    return {"dir": d, "summary": s, "tok_s": decode_tokens_per_s(dec),
            "mean_batch": sum(x["decode_tokens"] for x in dec) / len(dec),
            "lat": {"mean": float(np.mean(lat)), "p1": float(np.percentile(lat, 1)),
                    "p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99))},
            "swap_ms": [x["step_ms"] for x in dec if is_swap_step(x)],
            "swap_steps": sum(1 for x in steps if is_swap_step(x)),
            "swap_bytes": sum((x.get("counts") or {}).get(k, 0) for x in steps for k in ("swap_out_bytes", "swap_in_bytes"))}


def roots_text(roots):
    return roots if isinstance(roots, str) else " + ".join(roots)


def load_runs(roots, window):
    """({(balance, model): {engine: {B: run}}}, the window used): the runs of `window` ("steady" for Fig. 9,
    "life" for Fig. 10) when there are any, else those without a window level, else the first window.
    Several roots are read as one tree (a grid measured in several runs); a point in two roots is drawn
    from the later root, printed."""
    roots = [roots] if isinstance(roots, str) else list(roots)
    folders = [f for root in roots for f in run_folders(root)]
    windows = sorted({f[2] for f in folders})
    use = window if window in windows else ("" if "" in windows else (windows[0] if windows else None))
    if any(windows) and use != window:
        print("fig_baselines: no %s/ window under %s; drawing %s" % (window, ", ".join(roots), ("window " + use) if use else "the runs without a window"))
    runs, where = {}, {}
    for bal, model, w, engine, B, d in folders:
        if w == use:
            r = load_run(engine, d)
            if r:
                key = (bal, model, engine, B)
                if key in where:
                    print("fig_baselines: %s and %s are the same point; drawing %s" % (where[key], d, d))
                where[key] = d
                runs.setdefault((bal, model), {}).setdefault(engine, {})[B] = r
    if not runs:
        raise Skip("no run folder <balance>/<model>/[<window>/]<engine>-b<B>/ with summary.json + steps.jsonl under %s" % ", ".join(roots))
    return runs, use


def load_published(path):
    try:
        doc = json.load(open(path, encoding="utf-8"))
    except (OSError, ValueError) as e:
        print("fig_baselines: %s unreadable (%s): no paper marks" % (path, e))
        return {"entries": [], "model_shapes": {}}
    return doc


def paper_marks(doc, figure, unit, model):
    """published.json entries of a figure and unit whose paper model has our `model`'s shapes."""
    shapes = doc.get("model_shapes", {})
    return [e for e in doc["entries"] if e["figure"] == figure and e["unit"] == unit and shapes.get(e["model"]) == model]


def mark_label(e):
    b = {"lower": "> ", "upper": "< "}.get(e["bound"], "")
    return "%s: %s %s%s, %s%g %s (%s)" % (PAPER, e["system"], e["model"], ", B=%d" % e["batch"] if e["batch"] else "",
                                          b, e["value"], e["unit"], e["kind"])


def draw_paper(ax, doc, figure, unit, model):
    marks = paper_marks(doc, figure, unit, model)
    ax.set_title("%s (text numbers; curves not digitised)" % PAPER, fontsize=8)
    ax.set_xticks([])
    if not marks:
        ax.text(0.5, 0.5, "no published %s\nfor %s" % (unit, model), ha="center", va="center", transform=ax.transAxes, fontsize=8)
        return
    for i, e in enumerate(marks):
        ax.plot([i], [e["value"]], "*" if e["kind"] == "stated" else "D", ms=11 if e["kind"] == "stated" else 7, linestyle="none",
                color="black" if e["system"] == "FastDecode" else "0.55", label=mark_label(e))
        ax.annotate("%s\n%s%g" % (e["system"], {"lower": ">", "upper": "<"}.get(e["bound"], ""), e["value"]), (i, e["value"]),
                    textcoords="offset points", xytext=(0, 8), ha="center", fontsize=7)
    ax.set_xlim(-0.8, len(marks) - 0.2)
    ax.set_yscale("log")
    vals = [e["value"] for e in marks]
    ax.set_ylim(min(vals) / 2.5, max(vals) * 2.5)
    ax.set_ylabel("%s (paper: full depth, A10 + Epyc)" % unit, fontsize=8)
    ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.03))


def panels(runs):
    models = sorted({m for _, m in runs})
    bals = sorted({b for b, _ in runs}, key=lambda b: (b != "full", b != "a10", b))
    return models, bals


def balance_label(bal, engines):
    hw = {}
    for by_b in engines.values():
        for r in by_b.values():
            hw = r["summary"].get("config", {}).get("hardware", {}).get("gpu", {}) or hw
    extra = " (%s GB, %s SMs)" % (hw.get("memory_gb"), hw.get("sm_count")) if hw.get("sm_count") else ""
    return BALANCES.get(bal, bal) + extra


def missing_engines(runs, fig, models, bals):
    out = {}
    for m in models:
        for b in bals:
            miss = [e for e in ENGINES if e not in runs.get((b, m), {})]
            out[(b, m)] = miss
            if miss:
                print("%s: %s / %s: not measured: %s" % (fig, BALANCES.get(b, b), m, ", ".join(miss)))
    return out


def grid(models, bals):
    fig, axes = plt.subplots(len(models), len(bals) + 1, figsize=(5.2 * len(bals) + 3.6, 4.6 * len(models) + 1.2),
                             squeeze=False, gridspec_kw={"width_ratios": [3] * len(bals) + [2]})
    return fig, axes


def finish(fig, out, name, written, caption):
    fig.text(0.01, 0.005, caption, fontsize=7, ha="left", va="bottom", wrap=True, color="0.25")
    fig.tight_layout(rect=(0, 0.075, 1, 0.96))
    path = os.path.join(out, name)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    written.append(path)
    print("wrote %s" % path)


def window_note(window):
    """For captions: which run folders (the window's subfolder) a figure reads."""
    return ", the runs in <balance>/<model>/%s/" % window if window else ""


def depth_note(engines):
    """', 2 of 32 layers run' for a panel of reduced-layer runs (its tokens/s are those of the layers run), else ''."""
    for by_b in engines.values():
        for r in by_b.values():
            m = r["summary"].get("model", {})
            if m.get("layers") and m.get("full_layers", 0) > m["layers"]:
                return ", %d of %d layers run" % (m["layers"], m["full_layers"])
    return ""


def not_measured(ax, title, what):
    """A panel without a measured run: no axes, the reason in words (no empty plot)."""
    import textwrap
    ax.axis("off")
    ax.text(0.5, 0.5, "%s\n\nnot measured:\n%s" % (title, textwrap.fill(what, 40)), transform=ax.transAxes, ha="center",
            va="center", fontsize=9, color="0.3")


def engine_legend(fig, axes):
    """One legend for the figure, below the panels (no legend over data): every label drawn, once."""
    seen = {}
    for ax in axes:
        for h, l in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(l, h)
    if seen:
        fig.legend(list(seen.values()), list(seen.keys()), loc="lower center", ncol=min(len(seen), 6), fontsize=8,
                   bbox_to_anchor=(0.5, 0.035), frameon=False)


def fig9(a, written):
    runs, window = load_runs(a.baselines, WINDOWS["fig9b"])
    doc = load_published(a.published)
    models, bals = panels(runs)
    miss = missing_engines(runs, "fig9b", models, bals)
    fig, axes = grid(models, bals)
    for i, m in enumerate(models):
        for j, b in enumerate(bals):
            ax = axes[i][j]
            engines = runs.get((b, m), {})
            title = "%s, %s%s" % (m, balance_label(b, engines), depth_note(engines))
            if not engines:
                not_measured(ax, title, ", ".join(miss[(b, m)]) or "no run")
                continue
            for e in ENGINES:
                if e not in engines:
                    continue
                bs = sorted(engines[e])
                c, mk = STYLE[e]
                ax.plot(bs, [engines[e][x]["tok_s"] for x in bs], "-", marker=mk, color=c, label="%s (measured)" % e)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("batch B (configured)")
            ax.set_ylabel("decode tokens/s of the layers run")
            ax.set_title(title, fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            if miss[(b, m)]:
                ax.text(0.02, 0.98, "not measured: " + ", ".join(miss[(b, m)]), transform=ax.transAxes, fontsize=7, color="0.3",
                        va="top")
        draw_paper(axes[i][-1], doc, "Fig. 9", "tokens/s", m)
    engine_legend(fig, [ax for row in axes for ax in row[:-1]])
    fig.suptitle("Fig. 9: decode throughput vs batch, every engine (measured), next to the paper's stated numbers", fontsize=12)
    finish(fig, a.out, "fig9_baselines_throughput.png", written,
           "Measured: run folders under %s%s (decode tokens / wall time of the decode-only steps; reduced-layer models, so the tokens/s "
           "are those of the layers run: for full depth divide by full layers / layers run, which assumes the step linear in layers, "
           "Fig. 8). Paper: %s, its text's numbers on 1 A10 + up to 4 nodes of 2x AMD Epyc, full-depth models: "
           "a different machine and depth, drawn apart, never joined to measured lines." % (roots_text(a.baselines), window_note(window),
                                                                               os.path.relpath(a.published, REPO)))


def fig10(a, written):
    runs, window = load_runs(a.baselines, WINDOWS["fig10"])
    doc = load_published(a.published)
    models, bals = panels(runs)
    miss = missing_engines(runs, "fig10", models, bals)
    fig, axes = grid(models, bals)
    for i, m in enumerate(models):
        for j, b in enumerate(bals):
            ax = axes[i][j]
            engines = runs.get((b, m), {})
            title = "%s, %s%s" % (m, balance_label(b, engines), depth_note(engines))
            if not engines:
                not_measured(ax, title, ", ".join(miss[(b, m)]) or "no run")
                continue
            ticks, x, swap_labelled = [], 0, False
            for e in ENGINES:
                c, _ = STYLE[e]
                for bb in sorted(engines.get(e, {})):
                    r = engines[e][bb]["lat"]
                    ax.plot([x, x], [r["p1"], r["p99"]], "-", color=c, lw=2.5, solid_capstyle="butt",
                            label="p1-p99" if x == 0 else None)
                    ax.plot([x], [r["p50"]], "o", color=c, mfc="white", ms=7, label="p50" if x == 0 else None)
                    ax.plot([x], [r["mean"]], "D", color="black", ms=4, label="mean" if x == 0 else None)
                    sw = engines[e][bb]["swap_ms"]
                    if sw:
                        ax.plot([x + 0.18] * len(sw), sw, "x", color="red", ms=5, linestyle="none",
                                label=None if swap_labelled else "a step that swapped KV blocks (count under the tick)")
                        swap_labelled = True
                    ticks.append("%s\nB=%d%s" % (e, bb, "\n%d swap steps" % len(sw) if sw else ""))
                    x += 1
            ax.set_xticks(range(len(ticks)))
            ax.set_xticklabels(ticks, fontsize=6.5, rotation=45, ha="right")
            ax.set_yscale("log")
            ax.set_ylabel("token latency = decode step (ms)")
            ax.set_title(title, fontsize=9)
            ax.grid(True, axis="y", which="both", alpha=0.3)
            if miss[(b, m)]:
                ax.text(0.98, 0.98, "not measured: " + ", ".join(miss[(b, m)]), transform=ax.transAxes, fontsize=7, ha="right",
                        va="top", color="0.3")
        draw_paper(axes[i][-1], doc, "Fig. 10", "ms", m)
    engine_legend(fig, [ax for row in axes for ax in row[:-1]])
    fig.suptitle("Fig. 10: token latency per engine and batch: mean, p1, p50, p99 of the decode-only steps (measured)", fontsize=12)
    finish(fig, a.out, "fig10_token_latency.png", written,
           "Measured: step_ms of the decode-only steps in %s/<balance>/<model>/%s<engine>-b<B>/steps.jsonl (every request in a step "
           "gets its next token at the step's end). Paper: %s (A10 + Epyc, full depth; the paper's P0.01/P0.50/P0.99 bars were not "
           "digitised, only the text's means)." % (roots_text(a.baselines), window + "/" if window else "", os.path.relpath(a.published, REPO)))


FIGURES = (("fig9b", fig9), ("fig10", fig10))
TABLE = "baselines_table.md"


def table(a, written):
    """baselines_table.md: every run folder of both windows as one row (what Figs. 9 and 10 draw, as numbers)."""
    rows = []
    for window in ("steady", "life"):
        try:
            runs, use = load_runs(a.baselines, window)
        except Skip:
            continue
        if use != window:
            continue
        for (bal, model), engines in runs.items():
            for engine, by_b in engines.items():
                for B, r in by_b.items():
                    res, prov = r["summary"].get("results", {}), r["summary"].get("provenance", {})
                    rows.append((window, bal, model, B, ENGINES.index(engine) if engine in ENGINES else 99, engine, r,
                                 res.get("output_throughput"), prov.get("git_commit", "?")))
    if not rows:
        raise Skip("no steady/ or life/ run folders under %s" % roots_text(a.baselines))
    rows.sort(key=lambda x: (x[0] != "steady", x[1] != "full", x[2], x[3], x[4]))
    out = ["# Baselines: every run folder (analysis/fig_baselines.py)", "",
           "Decode tok/s and token latency over the decode-only steps (no prompt tokens that step); run tok/s = output "
           "tokens / the whole run (summary.json output_throughput); reached B = mean decode tokens per decode-only step; "
           "swap steps = steps that moved KV blocks (paged-swap), with the bytes moved. Read from %s." % roots_text(a.baselines), "",
           "| window | balance | model | B | engine | reached B | decode tok/s | run tok/s | latency mean / p1 / p50 / p99 (ms) "
           "| swap steps (GB) | commit |", "|" + "---|" * 11]
    for window, bal, model, B, _, engine, r, run_tps, commit in rows:
        lat = r["lat"]
        swap = "%d (%.2f)" % (r["swap_steps"], r["swap_bytes"] / 1e9) if r["swap_steps"] else "-"
        out.append("| %s | %s | %s | %d | %s | %.0f | %.0f | %s | %.2f / %.2f / %.2f / %.2f | %s | %s |" % (
            window, BALANCES.get(bal, bal), model, B, engine, r["mean_batch"], r["tok_s"],
            "%.0f" % run_tps if run_tps is not None else "-", lat["mean"], lat["p1"], lat["p50"], lat["p99"], swap, commit))
    path = os.path.join(a.out, TABLE)
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    written.append(path)
    print("wrote %s (%d runs)" % (path, len(rows)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baselines", nargs="+", default=["artifacts/baselines"],
                    help="root(s) of the run folders, read as one tree (default %(default)s)")
    ap.add_argument("--published", default=DEFAULT_PUBLISHED, help="the paper's numbers (default experiments/paper/published.json)")
    ap.add_argument("--out", required=True, help="folder for the PNGs (created)")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    written = []
    for name, fn in FIGURES + (("table", table),):
        try:
            fn(a, written)
        except Skip as e:
            plt.close("all")
            print("skipped %s: %s" % (name, e))
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
