#!/usr/bin/env python3
"""Paper-style figures (FastDecode Figs. 1, 3, 9, 10, 11, 13, 15) from committed results, one command.

Reads the JSON under --artifacts (default artifacts/sworker/gpu-machine; see its README.md):

  fig1_kv_memory              experiments/models/*.json: KV-cache GB vs batch and sequence, GPU capacities
                              minus the weights marked (COMPUTED, not measured; analysis/fig_kv_memory.py)
  spart_vs_gemm          spart_*.json: one layer's S-Part and its cuBLAS GEMMs alone vs B, and per token,
                              each series labelled with its dtype and SMs (analysis/fig_spart.py)
  e2e_throughput             e2e.json: decode tokens/s, FastDecode vs GPU-only, per model x balance (*-full, *-a10),
                              raw and full-depth equivalent (analysis/fig_throughput.py)
  fig15_step_breakdown        e2e.json: mean decode step of each FastDecode run and where it goes; with a trace.json
                              (--trace, or e2e/<run>/trace.json) one decode iteration as a timeline (analysis/fig_breakdown.py)
  rworker_scaling_model       validation.json: measured tokens/s vs R-worker CPUs P next to the performance
                              model's predictions (MODELLED), raw and full-depth equivalent (analysis/fig_throughput.py)
  per_step_latency      step_ms per step: of the folders under --sim-dir (fd-sim output: MODELLED; fd-bench run
                              folders: measured), else of the e2e FastDecode runs (analysis/fig_steps.py)

With --paper ROOT (the sweep folders scripts/reproduce.sh writes; analysis/fig_paper.py, imported only then):
fig3m (fig3_dilemma), fig8 (fig8_layers), fig11m (fig11_sls_measured), fig13s (fig13_scaling).

With --baselines DIR (run folders <balance>/<model>/<engine>-b<B>/, see analysis/fig_baselines.py), also:

  fig9_baselines_throughput  (fig9b) decode tokens/s vs batch, every engine, with the paper's stated numbers
  fig10_token_latency        (fig10) token latency mean / p1 / p50 / p99 per engine and batch

Each figure is written in every --format (default png,pdf). Prints one line per file written and "skipped figN:
why" for a figure whose inputs are missing; exits 0 if at least one figure was written, 1 otherwise. With
--strict every requested figure (those the options given ask for: fig1 ... fig11, plus fig9b / fig10 with
--baselines and fig3m / fig8 / fig11m / fig13s with --paper; or those named by --only) must be drawn, else exit 1 with
"missing figN: why" lines (CI regenerates the committed figures so: tests/python/test_figures_committed.py).

usage: analysis/figures.py --out DIR [--artifacts DIR] [--sim-dir DIR] [--trace FILE] [--baselines DIR...
       [--published FILE]] [--format png,pdf] [--only FIG...] [--strict]
"""
import argparse
import contextlib
import io
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import fig_baselines  # noqa: E402
from fig_breakdown import fig15  # noqa: E402
from fig_common import Skip  # noqa: E402
from fig_kv_memory import fig1  # noqa: E402
from fig_spart import fig3  # noqa: E402
from fig_steps import fig11  # noqa: E402
from fig_throughput import fig9, fig13  # noqa: E402

FIGURES = (("fig1", fig1), ("fig3", fig3), ("fig9", fig9), ("fig15", fig15), ("fig13", fig13), ("fig11", fig11))
FORMATS = ("png", "pdf", "svg")


def baseline_figure(fn):
    """A figure of analysis/fig_baselines.py, its Skip reported as this module's, written in every format:
    fig_baselines saves NAME.png; that save is replaced by one per format of the same Figure, and its
    "wrote NAME.png" line by one line per file written."""
    def draw(a, written):
        real_savefig = matplotlib.figure.Figure.savefig

        def savefig(fig, fname, *args, **kw):
            stem = str(fname)[:-4] if str(fname).endswith(".png") else str(fname)
            for fmt in a.formats:
                real_savefig(fig, "%s.%s" % (stem, fmt), *args, **kw)
        mine, out = [], io.StringIO()
        try:
            matplotlib.figure.Figure.savefig = savefig
            with contextlib.redirect_stdout(out):
                fn(a, mine)
        except fig_baselines.Skip as e:
            raise Skip(str(e))
        finally:
            matplotlib.figure.Figure.savefig = real_savefig
            for line in out.getvalue().splitlines():
                if line.startswith("wrote ") and line.endswith(".png"):
                    for fmt in a.formats:
                        print("wrote %s.%s" % (line[len("wrote "):-4], fmt))
                else:
                    print(line)
        for p in mine:
            stem = p[:-4] if p.endswith(".png") else p
            written.extend("%s.%s" % (stem, fmt) for fmt in a.formats)
    return draw


# Drawn when --baselines is given (every baseline engine's run folders).
BASELINE_FIGURES = (("fig9b", baseline_figure(fig_baselines.fig9)), ("fig10", baseline_figure(fig_baselines.fig10)))
PAPER_NAMES = ("fig3m", "fig8", "fig11m", "fig13s")  # analysis/fig_paper.py's FIGURES
ALL_NAMES = [n for n, _ in FIGURES + BASELINE_FIGURES] + list(PAPER_NAMES)


def paper_figures():
    """analysis/fig_paper.py's figures (imported only with --paper), their Skip reported as this module's."""
    here = os.path.dirname(os.path.abspath(__file__))  # this folder, also when figures.py is imported from elsewhere
    if here not in sys.path:
        sys.path.insert(0, here)
    import fig_paper

    def wrap(fn):
        def draw(a, written):
            try:
                fn(a, written)
            except fig_paper.Skip as e:
                raise Skip(str(e))
        return draw
    return tuple((n, wrap(fn)) for n, fn in fig_paper.FIGURES)


def formats_arg(text):
    fmts = [f.strip().lower() for f in text.split(",") if f.strip()]
    bad = [f for f in fmts if f not in FORMATS]
    if not fmts or bad:
        raise argparse.ArgumentTypeError("--format: %s (choose from %s, comma-separated)" % (", ".join(bad) or "empty", ", ".join(FORMATS)))
    return tuple(dict.fromkeys(fmts))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifacts", default="artifacts/sworker/gpu-machine",
                    help="folder with spart_*.json, e2e.json, validation.json, e2e/*/ (default: %(default)s)")
    ap.add_argument("--out", required=True, help="folder for the figures (created)")
    ap.add_argument("--sim-dir", help="folder of output folders (fd-sim's: MODELLED; fd-bench run folders: measured) for fig11")
    ap.add_argument("--trace", help="a run's trace.json for fig15's timeline (default: e2e/<run>/trace.json when committed)")
    ap.add_argument("--paper", help="root of the paper sweeps (scripts/reproduce.sh --out) for fig3m / fig8 / fig11m / fig13s")
    ap.add_argument("--baselines", nargs="+", help="root(s) of the baseline run folders for fig9b / fig10, read as one tree")
    ap.add_argument("--published", default=fig_baselines.DEFAULT_PUBLISHED, help="the paper's numbers for fig9b / fig10")
    ap.add_argument("--format", dest="formats", type=formats_arg, default=("png", "pdf"),
                    help="comma-separated file formats of every figure (default png,pdf)")
    ap.add_argument("--only", nargs="+", choices=ALL_NAMES, help="draw only these figures")
    ap.add_argument("--strict", action="store_true", help="every requested figure must be drawn, else exit 1")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    todo = FIGURES + (BASELINE_FIGURES if a.baselines else ()) + (paper_figures() if a.paper else ())
    needs = {n: "needs --baselines" for n, _ in BASELINE_FIGURES}
    needs.update({n: "needs --paper" for n in PAPER_NAMES})
    if a.only:
        todo = tuple((n, fn) for n, fn in todo if n in a.only)
    drawn_names = [t[0] for t in todo]
    # Requested (--only) but not drawable with these options.
    missing = {n: needs[n] for n in a.only or [] if n not in drawn_names}
    for n in a.only or []:
        if n in missing:
            print("skipped %s: %s" % (n, missing[n]))
    written = []
    for name, fn in todo:
        before = len(written)
        try:
            fn(a, written)
        except Skip as e:
            plt.close("all")
            print("skipped %s: %s" % (name, e))
            missing[name] = str(e)
        except (KeyError, ValueError, TypeError, IndexError, ZeroDivisionError, OSError) as e:
            plt.close("all")
            print("skipped %s: unexpected input (%s: %s)" % (name, type(e).__name__, e))
            missing[name] = "unexpected input (%s: %s)" % (type(e).__name__, e)
        else:
            if len(written) == before:
                missing[name] = "nothing was written"
    if a.strict and missing:
        for n in sorted(missing, key=ALL_NAMES.index):
            print("missing %s: %s" % (n, missing[n]))
        return 1
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
