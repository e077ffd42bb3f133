#!/usr/bin/env python3
"""The hybrid grid side by side (issue 17; docs/HYBRID.md): experiments/hybrid/grid.sweep.json runs gpu-only,
FastDecode and hybrid interleaved in one sweep (points mem-M_cores-C_run-ENGINE-CTX, repeats rep1, rep2, ...). For each
cell (GPU memory cap x R-worker cores x context) this sets the three engines side by side: decode tokens/s two ways —
summary.json's decode-only headline (all decode-only steps: a one-off step such as a CUDA graph's capture counts in it)
and the steady rate (the decode steps' mean batch over their median step) — each the median over the repeats; their
mean running batch; the split the hybrid's controller chose (sequences on the CPUs in its decode steps); its modelled
step against the measured one; and the ratio of hybrid to the better of the other two on the steady rate (the issue's
goal: >= 0.98 in every cell, above both where GPU memory caps gpu-only's batch). Several sweep folders (the MHA and
GQA grids, or a later --only run of the cells a first one left out) are read together; a cell is keyed by the model
too (summary.json's model name). Writes OUT/hybrid_grid.md, .json.

With --online, SWEEP_DIR is experiments/hybrid/online.sweep.json's output (points run-ENGINE: the three engines on the
same Poisson arrivals): their output tokens/s, TPOT and TTFT p50 / p99 and the hybrid's split, side by side, in
OUT/hybrid_online.md, .json.

Usage: analysis/hybrid_grid.py SWEEP_DIR... [--out DIR] [--online]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from fd_runs import read_json, write_report
from fd_runs import read_jsonl_or_none as read_jsonl

REPO = Path(__file__).resolve().parent.parent

ENGINES = ("gpu-only", "fastdecode", "hybrid")


def cells(roots: list) -> dict:
    """{(model, mem, cores, ctx): {engine: [(headline, run folder), ...]}} of the sweeps' finished runs."""
    out: dict = {}
    for root in roots:
        index = read_json(root / "index.json")
        for pt in (index or {}).get("points", []):
            parts = dict(kv.split("-", 1) for kv in pt["name"].split("_"))
            engine, ctx = parts["run"].rsplit("-", 1)
            for run in pt.get("runs", []):
                if run.get("status") != "ok":
                    continue
                model = (read_json(root / run["dir"] / "summary.json") or {}).get("model", {}).get("name", "?")
                key = (model, parts["mem"], parts["cores"], ctx)
                out.setdefault(key, {}).setdefault(engine, []).append((run.get("headline", {}), root / run["dir"]))
    return out


def decode_steps(run: Path) -> list:
    return [s for s in read_jsonl(run / "steps.jsonl") if s.get("decode_tokens", 0) > 0 and s.get("prefill_tokens", 0) == 0]


def engine_numbers(runs: list) -> dict:
    """Medians over the repeats: the decode-only headline tokens/s, the steady rate, the mean batch."""
    head, steady, batch = [], [], []
    for h, run in runs:
        if h.get("decode_only.tokens_per_s") is not None:
            head.append(h["decode_only.tokens_per_s"])
        steps = decode_steps(run)
        if steps:
            b = statistics.mean(s["decode_tokens"] for s in steps)
            steady.append(b / (statistics.median(s["step_ms"] for s in steps) / 1e3))
            batch.append(b)
    med = lambda v: statistics.median(v) if v else None  # noqa: E731
    return {"tokens_per_s": med(head), "steady_tokens_per_s": med(steady), "mean_batch": med(batch), "repeats": len(runs)}


def hybrid_split(run: Path) -> dict:
    """The hybrid run's decode steps: sequences on the CPUs and on the GPU, the modelled and measured step."""
    steps = decode_steps(run)
    if not steps:
        return {}
    cpu = [s.get("counts", {}).get("cpu_seqs", 0) for s in steps]
    gpu = [s.get("counts", {}).get("gpu_seqs", 0) for s in steps]
    modelled = [s["breakdown_ms"].get("modelled_step") for s in steps if "modelled_step" in s.get("breakdown_ms", {})]
    measured = [s["step_ms"] for s in steps if "step_ms" in s]
    return {"cpu_seqs_max": max(cpu), "cpu_seqs_mean": statistics.mean(cpu), "gpu_seqs_mean": statistics.mean(gpu),
            "modelled_step_ms_median": statistics.median(modelled) if modelled else None,
            "measured_step_ms_median": statistics.median(measured) if measured else None}


def find_fd_bench(given):
    """fd-bench for the modelled columns: --fd-bench, $FD_BIN_DIR, a build folder of this checkout, PATH."""
    cands = [given] if given else []
    if os.environ.get("FD_BIN_DIR"):
        cands.append(str(Path(os.environ["FD_BIN_DIR"]) / "fd-bench"))
    cands += [str(REPO / "build" / b / "bin" / "fd-bench") for b in ("cuda", "default")]
    cands.append(shutil.which("fd-bench") or "")
    return next((c for c in cands if c and os.access(c, os.X_OK)), None)


def modelled(fd_bench: str, run: Path) -> dict:
    """The static model (fd-bench plan --hybrid-prior) on the hybrid run's own measured prior, for the cell's
    batch (requests), mean decode context, peak, GPU memory cap and R-worker memory: the split it predicts and
    tokens/s of the three engines (MODELLED)."""
    s = read_json(run / "summary.json")
    try:
        c = s["config"]
        wl, hw, rw = c["workload"], c["hardware"], c["engine"]["rworkers"]
        gpu_mem = hw["gpu"]["memory_gb"] or s["provenance"]["gpus"][0]["memory_gb"]
        workers = hw["rworkers"]["count"] or rw["spawn"]
        model = REPO / "experiments" / "models" / Path(c["model"]["config"]).name
    except (KeyError, IndexError, TypeError) as e:
        return {"error": "%s/summary.json lacks %s (not a hybrid run's summary)" % (run, e)}
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "plan.json"
        cmd = [fd_bench, "plan", "--model", str(model), "--layers", str(c["model"]["layers"]),
               "--seq", str(wl["prompt_len"] + wl["gen_len"]), "--context", str(wl["prompt_len"] + wl["gen_len"] / 2),
               "--hybrid-batch", str(wl["requests"]), "--hybrid-prior", str(run / "summary.json"),
               "--gpu-mem-gb", str(gpu_mem), "--cpu-mem-gb", str(rw["memory_gb"] * workers), "--json", str(out)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            return {"error": r.stderr.strip()}
        h = json.loads(out.read_text())["hybrid"]
    return {"cpu_seqs": h["hybrid"]["cpu_seqs"], "batch": h["hybrid"]["batch"],
            "tokens_per_s": {"hybrid": h["hybrid"]["tokens_per_s"], "gpu-only": h["gpu_only"]["tokens_per_s"],
                             "fastdecode": h["fastdecode"]["tokens_per_s"]},
            "batches": {"hybrid": h["hybrid"]["batch"], "gpu-only": h["gpu_only"]["batch"],
                        "fastdecode": h["fastdecode"]["batch"]}, "command": " ".join(cmd[1:])}


def online(roots: list, out: Path) -> int:
    """The online run's three engines side by side (one row per engine and repeat)."""
    rows = []
    for root in roots:
        for pt in (read_json(root / "index.json") or {}).get("points", []):
            engine = dict(kv.split("-", 1) for kv in pt["name"].split("_")).get("run", pt["name"])
            for i, run in enumerate(pt.get("runs", [])):
                if run.get("status") != "ok":
                    rows.append({"engine": engine, "repeat": i + 1, "status": run.get("status")})
                    continue
                res = (read_json(root / run["dir"] / "summary.json") or {}).get("results", {})
                row = {"engine": engine, "repeat": i + 1, "status": "ok", "dir": str(root / run["dir"]),
                       "output_tokens_per_s": res.get("output_throughput"),
                       "request_per_s": res.get("request_throughput"), "duration_s": res.get("duration_s"),
                       "tpot_ms": {k: res.get("tpot_ms", {}).get(k) for k in ("p50", "p99", "mean")},
                       "ttft_ms": {k: res.get("ttft_ms", {}).get(k) for k in ("p50", "p99", "mean")},
                       "queue_ms_p50": res.get("queue_ms", {}).get("p50")}
                steps = [s for s in read_jsonl(root / run["dir"] / "steps.jsonl") if s.get("decode_tokens", 0) > 0]
                if steps:
                    row["mean_batch"] = statistics.mean(s["decode_tokens"] for s in steps)
                if engine == "hybrid":
                    row.update(hybrid_split(root / run["dir"]))
                rows.append(row)
    if not rows:
        print(f"hybrid_grid: no online runs under {' '.join(map(str, roots))}", file=sys.stderr)
        return 1
    fmt = lambda x, f="%.1f": "—" if x is None else f % x  # noqa: E731
    lines = ["# The hybrid's online run (issue 17): the three engines on the same Poisson arrivals", "",
             f"From {', '.join(f'`{r}`' for r in roots)} (experiments/hybrid/online.sweep.json; analysis/hybrid_grid.py "
             "--online). Output tokens/s: every generated token over the run's duration (arrivals included); TPOT: "
             "per request, (end - first token) / (tokens - 1); batch: the mean of the decode steps' running sequences; "
             "CPU seqs: the hybrid's sequences on the R-workers in its decode steps.", "",
             "| engine | repeat | output tok/s | requests/s | TPOT p50 ms | TPOT p99 ms | TTFT p50 ms | TTFT p99 ms | queue p50 ms | mean batch | CPU seqs mean (max) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| {r['engine']} | {r['repeat']} | {r['status']} | | | | | | | | |")
            continue
        lines.append("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["engine"], r["repeat"], fmt(r["output_tokens_per_s"], "%.0f"), fmt(r["request_per_s"], "%.2f"),
            fmt(r["tpot_ms"]["p50"], "%.2f"), fmt(r["tpot_ms"]["p99"], "%.2f"), fmt(r["ttft_ms"]["p50"], "%.0f"),
            fmt(r["ttft_ms"]["p99"], "%.0f"), fmt(r["queue_ms_p50"], "%.0f"), fmt(r.get("mean_batch")),
            "" if r["engine"] != "hybrid" else "%s (%s)" % (fmt(r.get("cpu_seqs_mean")), fmt(r.get("cpu_seqs_max"), "%d"))))
    write_report(out, "hybrid_online", lines, rows)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", type=Path, nargs="+", metavar="SWEEP_DIR")
    ap.add_argument("--out", type=Path, help="where hybrid_grid.md, .json go (default: the first SWEEP_DIR)")
    ap.add_argument("--fd-bench", help="fd-bench for the MODELLED columns (default: $FD_BIN_DIR, build/*/bin, PATH)")
    ap.add_argument("--online", action="store_true", help="the online sweep's three engines (hybrid_online.md)")
    a = ap.parse_args(argv)
    out = a.out or a.roots[0]
    if a.online:
        return online(a.roots, out)
    grid = cells(a.roots)
    if not grid:
        print(f"hybrid_grid: no finished runs under {' '.join(map(str, a.roots))}", file=sys.stderr)
        return 1
    fd_bench = find_fd_bench(a.fd_bench)
    if not fd_bench:
        print("hybrid_grid: no fd-bench found: the MODELLED columns are left out (--fd-bench PATH)", file=sys.stderr)
    rows = []
    for key in sorted(grid, key=lambda k: (k[0], k[1], int(k[2]), int(k[3]))):
        model, mem, cores, ctx = key
        runs = grid[key]
        row = {"model": model, "mem_gb": mem, "cores": int(cores), "context": int(ctx)}
        for e in ENGINES:
            row[e] = engine_numbers(runs.get(e, []))
        if runs.get("hybrid"):
            row["hybrid"].update(hybrid_split(runs["hybrid"][0][1]))
            if fd_bench:
                row["modelled"] = modelled(fd_bench, runs["hybrid"][0][1])
        best = max([row[e]["steady_tokens_per_s"] or 0 for e in ("gpu-only", "fastdecode")])
        hy = row["hybrid"]["steady_tokens_per_s"]
        row["hybrid_vs_best"] = hy / best if hy and best else None
        row["meets_0.98"] = row["hybrid_vs_best"] is not None and row["hybrid_vs_best"] >= 0.98
        rows.append(row)
    fmt = lambda x, f="%.0f": "—" if x is None else f % x  # noqa: E731
    lines = ["# The hybrid grid (issue 17): decode tokens/s side by side", "",
             f"From {', '.join(f'`{r}`' for r in a.roots)} (experiments/hybrid/*.sweep.json; analysis/hybrid_grid.py). "
             "Per cell (model, GPU memory cap, "
             "R-worker cores, context): steady tokens/s (the decode steps' mean batch over their median step) and in "
             "brackets summary.json's decode-only headline (its mean includes one-off steps such as a CUDA graph's "
             "capture), each the median over the repeats; batch: mean running sequences; CPU seqs: the hybrid's "
             "sequences on the R-workers in its decode steps (mean, max); modelled / measured: the controller's step "
             "against the measured one (median ms); hybrid / best: on the steady rate.", "",
             "| model | GPU mem | cores | context | gpu-only tok/s (headline) | batch | FastDecode tok/s (headline) | batch | hybrid tok/s (headline) | batch | hybrid / best | CPU seqs mean (max) | modelled / measured ms | repeats |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        g, f, hy = r["gpu-only"], r["fastdecode"], r["hybrid"]
        lines.append("| %s | %s | %d | %d | %s (%s) | %s | %s (%s) | %s | %s (%s) | %s | %s%s | %s (%s) | %s / %s | %s |" % (
            r["model"], "full" if r["mem_gb"] == "full" else r["mem_gb"] + " GB", r["cores"], r["context"],
            fmt(g["steady_tokens_per_s"]), fmt(g["tokens_per_s"]), fmt(g["mean_batch"]),
            fmt(f["steady_tokens_per_s"]), fmt(f["tokens_per_s"]), fmt(f["mean_batch"]),
            fmt(hy["steady_tokens_per_s"]), fmt(hy["tokens_per_s"]), fmt(hy["mean_batch"]),
            fmt(r["hybrid_vs_best"], "%.3f"), "" if r["meets_0.98"] else " (below 0.98)",
            fmt(hy.get("cpu_seqs_mean"), "%.1f"), fmt(hy.get("cpu_seqs_max")),
            fmt(hy.get("modelled_step_ms_median"), "%.2f"), fmt(hy.get("measured_step_ms_median"), "%.2f"),
            "/".join(str(r[e]["repeats"]) for e in ENGINES)))
    met = sum(1 for r in rows if r["meets_0.98"])
    lines += ["", f"hybrid >= 0.98 x max(gpu-only, FastDecode) (steady rate) in {met} of {len(rows)} cells."]
    mrows = [r for r in rows if r.get("modelled")]
    if mrows:
        lines += ["", "## The static model against the runs (MODELLED)", "",
                  "`fd-bench plan --hybrid-prior` (fastdecode/sched/hybrid.h's `model_hybrid`) on the hybrid run's own "
                  "measured prior (engine_info.prior), the cell's batch (requests), mean decode context, GPU memory cap "
                  "and R-worker memory: the split it predicts against the controller's, and each engine's MODELLED "
                  "tokens/s with measured (steady) / modelled. The model counts no fixed per-step terms (embedding, "
                  "LM head, sampling, launches), so measured / modelled < 1 is expected at small steps.", "",
                  "| model | GPU mem | cores | context | split modelled (CPU seqs of batch) | split measured (CPU seqs mean) | gpu-only modelled tok/s (measured / modelled) | FastDecode modelled (measured / modelled) | hybrid modelled (measured / modelled) |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in mrows:
            m = r["modelled"]
            if "error" in m:
                lines.append("| %s | %s | %d | %d | %s | | | | |" % (r["model"], r["mem_gb"], r["cores"], r["context"], m["error"]))
                continue
            ratio = lambda e: fmt(r[e]["steady_tokens_per_s"] / m["tokens_per_s"][e] if r[e]["steady_tokens_per_s"] else None, "%.2f")  # noqa: E731
            lines.append("| %s | %s | %d | %d | %d of %d | %s of %s | %s (%s) | %s (%s) | %s (%s) |" % (
                r["model"], "full" if r["mem_gb"] == "full" else r["mem_gb"] + " GB", r["cores"], r["context"],
                m["cpu_seqs"], m["batch"], fmt(r["hybrid"].get("cpu_seqs_mean"), "%.1f"), fmt(r["hybrid"]["mean_batch"]),
                fmt(m["tokens_per_s"]["gpu-only"]), ratio("gpu-only"), fmt(m["tokens_per_s"]["fastdecode"]),
                ratio("fastdecode"), fmt(m["tokens_per_s"]["hybrid"]), ratio("hybrid")))
        agree = sum(1 for r in mrows if "error" not in r["modelled"] and
                    (r["modelled"]["cpu_seqs"] > 0) == ((r["hybrid"].get("cpu_seqs_max") or 0) > 0))
        lines += ["", f"The model and the controller agree on whether to use the CPUs in {agree} of {len(mrows)} cells."]
    write_report(out, "hybrid_grid", lines, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
