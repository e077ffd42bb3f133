#!/usr/bin/env python3
"""Issue 18's targets against the committed measurements, one verdict a row (artifacts/stages/TARGETS.md).

Each row reads the result file of the benchmark that measures it (the defaults are the committed ones; a flag points
one at a new run) and states the target, the measured range over the points the target covers, and whether every
point meets it. Rows: the quantized CPU attention kernels (fd-attn-bench JSON: speedup_vs_fp16 of int8 / int4, MHA
and GQA at context >= 1024, the median over a call's repeats per ISA, then the best ISA; fp16 GQA's ratio_to_ceiling, every run), prefill into quantized caches
(prefill_ttft.json), the pipeline at >= 8 layers (pipeline_bound.json), the transport with 4 links
(fd-transport-bench JSON), the S-Part against its GEMMs at B >= 64 (fd-spart-bench JSON, fp16 and bf16), the GPU
baselines against their roofline at B = 64..1024 (gpu_roofline.json; paged-swap's attention kernels against the KV
they read, kernel_profile.json with --balance), and the trace's tracks per CUDA stream and
per R-worker (trace_tracks.json of a CUDA FastDecode run: analysis/trace_tracks.py).

usage: analysis/stages_targets.py [--attn JSON...] [--prefill JSON] [--pipeline JSON] [--transport JSON]
                                  [--spart JSON...] [--roofline JSON] [--kernels JSON] [--trace JSON] [--out DIR]
"""
import argparse
import glob
import os
import re
import statistics
import sys

from fd_runs import read_json, write_report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ART = os.path.join(REPO, "artifacts")
DEFAULTS = {
    "attn": sorted(glob.glob(os.path.join(ART, "rworker", "gpu-machine-headmajor-0c7afb6", "new_attn_kv*_avx512*_r*.json"))),
    "prefill": os.path.join(ART, "stages", "prefill-5285944", "prefill_ttft.json"),
    "pipeline": os.path.join(ART, "stages", "pipeline", "pipeline_bound.json"),
    "transport": os.path.join(ART, "stages", "transport-inplace-236fbe0", "transport.json"),
    "spart": [os.path.join(ART, "stages", "gemm-inputs", "call3-b2b5bf8", f)
              for f in ("spart-new-fp16.json", "spart-new-bf16.json")],
    # gpu-only from the small-kernels call (two rounds, 2 and 4 layers); paged-swap's whole step and its kernels from
    # the a64f637 call (stages-bench baselines,kernels)
    "roofline": [os.path.join(ART, "stages", "small-kernels-c749edd", "call3-c749edd", "roofline-async", "gpu_roofline.json"),
                 os.path.join(ART, "stages", "gemm-inputs", "call1-a64f637", "baselines", "gpu_roofline.json")],
    "kernels": os.path.join(ART, "stages", "gemm-inputs", "call1-a64f637", "kernels", "kernel_profile.json"),
    "trace": os.path.join(ART, "stages", "pipeline", "trace_tracks.json"),
}


def load(path):
    data = read_json(path)
    if data is None:
        raise SystemExit("stages_targets: %s not found" % path)
    return data


def rel(p):
    return os.path.relpath(p, REPO)


def verdict(values, ok):
    """(range text, met) over the measured values; met when every one passes ok."""
    if not values:
        return "no point measured", False
    lo, hi = min(values), max(values)
    return ("%.2f" % lo if abs(hi - lo) < 0.005 else "%.2f-%.2f" % (lo, hi)), all(ok(v) for v in values)


def attn_rows(paths):
    """speedup_vs_fp16 per (shape, dtype, context >= 1024, batch): the median over repeats (files *_rN.json) of each
    ISA's runs, then the best ISA; a file without _rN is one repeat. The GPU machine's read rate swings between
    calls, so one disturbed repeat moves a median no further than its middle one. fp16 GQA's ratio_to_ceiling: the
    best ISA's (by median), every run kept (the ceiling itself swings, and a median would hide it; the per-point
    medians are printed beside)."""
    speed, fp16_gqa = {}, {}
    for p in paths:
        for b in load(p)["benchmarks"]:
            if not b["name"].startswith("decode_attention/") or b.get("context", 0) < 1024:
                continue
            isa, dt = b["name"].split("/")[1:3]
            shape = "MHA" if b["n_kv_heads"] == b["n_heads"] else "GQA %d/%d" % (b["n_heads"], b["n_kv_heads"])
            point = (shape, dt, int(b["context"]), int(b["batch"]))
            if dt == "fp16":
                if shape != "MHA":
                    fp16_gqa.setdefault(point, {}).setdefault(isa, []).append(b["ratio_to_ceiling"])
            elif "speedup_vs_fp16" in b:
                speed.setdefault(point, {}).setdefault(isa, []).append(b["speedup_vs_fp16"])
    best = {pt: max(statistics.median(v) for v in by_isa.values()) for pt, by_isa in speed.items()}
    rows = []
    src = ", ".join(rel(p) for p in paths)
    if len(paths) > 4:  # many repeat files: name their folders
        src = ", ".join(sorted({rel(os.path.dirname(os.path.abspath(p))) + "/" for p in paths}))
    for shape_kind, dt, target in (("MHA", "int8", 1.9), ("MHA", "int4", 3.2), ("GQA", "int8", 1.7), ("GQA", "int4", 2.6)):
        vals = [v for (shape, d, _c, _b), v in best.items() if d == dt and shape.startswith(shape_kind)]
        rng, met = verdict(vals, lambda v, t=target: v >= t)
        rows.append(("CPU attention, %s %s KV: tokens/s vs fp16 (context >= 1024, best ISA, median of repeats)" % (shape_kind, dt),
                     ">= %.1fx" % target, rng + "x", met, src))
    runs = [max(by_isa.values(), key=statistics.median) for by_isa in fp16_gqa.values()]  # the best ISA's runs
    rng, met = verdict([v for vs in runs for v in vs], lambda v: v >= 0.95)
    if any(len(vs) > 1 for vs in runs):
        rng += " (per-point medians %s)" % verdict([statistics.median(v) for v in runs], lambda v: True)[0]
    rows.append(("CPU attention, fp16 GQA: read rate vs the same-run read ceiling (every run)", ">= 0.95", rng, met, src))
    return rows


def prefill_row(path):
    vals = [r["ttft_p50_vs_fp16"] for r in load(path) if r["kv_dtype"] in ("int8", "int4")]
    rng, met = verdict(vals, lambda v: v <= 1.2)
    return ("Prefill into int8 / int4 caches: TTFT vs fp16's, same run", "<= 1.2x", rng + "x", met, rel(path))


def pipeline_row(path):
    rows = [r for r in load(path) if r["layers"] >= 8]
    vals = [r["ratio_median"] for r in rows]
    rng, met = verdict(vals, lambda v: v <= 1.05)
    met = met and all(r.get("has_copy_fields") for r in rows)
    return ("Pipeline: decode step vs max(S-Part, busiest R-worker), >= 8 layers, with d2h / h2d / wire / idle",
            "<= 1.05x", rng + "x", met, rel(path))


def transport_row(path):
    """With 4 links: the way the engine sends to R-workers on its host where the file has it (shm-inplace: the S-Part
    writes q/k/v into the shared-memory region, the engine's default; else shm, copied into the region), the other
    ways stated beside (shm copied in; the sockets, ipc and tcp: remote workers and the fallback); a file without shm
    points is judged on all of them."""
    by = {}
    for b in load(path)["benchmarks"]:
        if b["name"].startswith("round_trip/") and int(b.get("links", 0)) == 4:
            by.setdefault(b["name"].split("/")[1], []).append(b["GBps_per_link"])
    sockets = verdict([v for t, vs in by.items() if not t.startswith("shm") for v in vs], lambda v: True)[0]
    if "shm-inplace" in by:
        rng, met = verdict(by["shm-inplace"], lambda v: v >= 4.0)
        copied = verdict(by.get("shm", []), lambda v: True)[0]
        return ("Transport: GB/s per link with 4 links in flight, real protocol (shared-memory lane, q/k/v written in "
                "place; copied in and sockets beside)", ">= 4",
                "%s (shm copied in: %s; ipc/tcp: %s)" % (rng, copied, sockets), met, rel(path))
    if "shm" in by:
        rng, met = verdict(by["shm"], lambda v: v >= 4.0)
        return ("Transport: GB/s per link with 4 links in flight, real protocol (shared-memory lane; sockets beside)",
                ">= 4", "%s (ipc/tcp: %s)" % (rng, sockets), met, rel(path))
    rng, met = verdict([v for vs in by.values() for v in vs], lambda v: v >= 4.0)
    return ("Transport: GB/s per link with 4 links in flight, real protocol", ">= 4", rng, met, rel(path))


def trace_row(path):
    """Built when a CUDA FastDecode run's trace has a track per stream (one mini-batch each) and per R-worker; no result
    (no GPU run since the tracks were built) is stated as such, not met."""
    what = "trace.json: one track per CUDA stream (one stream per mini-batch) and per R-worker"
    if read_json(path) is None:
        return (what, "built", "no trace_tracks.json yet (scripts/stages-bench.sh OUT --steps pipeline on a GPU)", False,
                rel(path))
    runs = load(path)["runs"]
    streams = sorted({t for r in runs for t in r["streams"]})
    meas = "%d stream track(s) (%s), R-worker tracks: %s" % (
        len(streams), "; ".join("%s: mb %s" % (t, ",".join(str(m) for m in sorted(
            {m for r in runs for m in r["streams"].get(t, {}).get("mini_batches", [])}))) for t in streams) or "none", "yes" if all(r["rworker_tracks"] for r in runs) else "no")
    return (what, "built", meas, bool(runs) and all(r["built"] for r in runs), rel(path))


def spart_row(paths):
    """The S-Part as the engines run it: replayed from CUDA graphs (engine.cuda_graphs, on by default, at B <= 1024:
    graph_ratio), else launched kernel by kernel (ratio); the eager ratios are stated beside. Where a row has its
    rounds (fd-spart-bench --rounds), the graph ratio is the median of the rounds' ratios, as fd-spart-bench reports
    it since 51a085a (files written before computed a ratio of medians from different rounds)."""
    graphs, eager = [], []
    for p in paths:
        for r in load(p)["rows"]:
            if r["B"] >= 64:
                if r.get("graph_ratio_rounds"):
                    graphs.append(statistics.median(r["graph_ratio_rounds"]))
                else:
                    graphs.append(r["graph_ratio"] if r.get("graph_ratio") is not None else r["ratio"])
                eager.append(r["ratio"])
    rng, met = verdict(graphs, lambda v: v <= 1.10)
    return ("S-Part vs its GEMMs alone, B >= 64, fp16 and bf16 (from CUDA graphs, as the engines run it)", "<= 1.10x",
            "%sx (launched eagerly: %sx)" % (rng, verdict(eager, lambda v: True)[0]), met,
            ", ".join(rel(p) for p in paths))


def roofline_rows(paths, kernels_path):
    """gpu-only: its decode step against the roofline (gpu_roofline.json; the step period where the file has it, one
    step's start to the next's). paged-swap: the issue asks "the same for the paged-swap baseline's attention kernel":
    its attention kernels (ncu, kernel_profile.json) against the KV they read over the HBM rate; its whole step's ratio
    is stated beside it. Each engine's rows come from the first of `paths` that has it."""
    files = [(p, load(p)["rows"]) for p in ([paths] if isinstance(paths, str) else paths)]
    step, used = {}, []
    for engine in ("gpu-only", "paged-swap"):
        path, rows = next(((p, rs) for p, rs in files if any(r["engine"] == engine for r in rs)), files[0])
        if path not in used:
            used.append(path)
        pts = [r for r in rows if r["engine"] == engine and 64 <= r["requested_batch"] <= 1024]
        rng, met = verdict([r["step_vs_roofline"] for r in pts], lambda v: v <= 1.3)
        rng += "x"
        layers = sorted({r.get("layers") for r in pts})
        if len(layers) > 1:  # each depth's range (the fixed part, LM head and sampling, weighs less with more layers)
            rng = "; ".join("%d layers: %sx" % (L, verdict([r["step_vs_roofline"] for r in pts if r["layers"] == L],
                                                              lambda v: True)[0]) for L in layers)
        step[engine] = (rng, met)
    attn = [(p["attention_roofline"]["batch"], p["attention_roofline"]["ratio"]) for p in load(kernels_path)
            if p["file"].startswith("paged-swap") and "attention_roofline" in p]
    rng, met = verdict([r for _, r in attn], lambda v: v <= 1.3)
    return [("gpu-only decode step (period: one step's start to the next's) vs max(bytes / HBM BW, FLOPs / peak), "
             "B = 64-1024", "<= 1.3x", step["gpu-only"][0], step["gpu-only"][1], rel(used[0])),
            ("paged-swap attention kernels vs KV bytes / HBM BW (B %s)" % ", ".join(str(b) for b, _ in sorted(attn)),
             "<= 1.3x", "%sx (its whole decode step: %s)" % (rng, step["paged-swap"][0]), met,
             "%s, %s" % (rel(kernels_path), rel(used[-1])))]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attn", nargs="+", default=DEFAULTS["attn"])
    ap.add_argument("--prefill", default=DEFAULTS["prefill"])
    ap.add_argument("--pipeline", default=DEFAULTS["pipeline"])
    ap.add_argument("--transport", default=DEFAULTS["transport"])
    ap.add_argument("--spart", nargs="+", default=DEFAULTS["spart"])
    ap.add_argument("--roofline", nargs="+", default=DEFAULTS["roofline"])
    ap.add_argument("--kernels", default=DEFAULTS["kernels"])
    ap.add_argument("--trace", default=DEFAULTS["trace"])
    ap.add_argument("--out", default=None, help="write OUT/TARGETS.md and .json (default: print)")
    a = ap.parse_args(argv)
    rows = attn_rows(a.attn) + [prefill_row(a.prefill), pipeline_row(a.pipeline), transport_row(a.transport),
                                spart_row(a.spart)] + roofline_rows(a.roofline, a.kernels)
    rows.append(trace_row(a.trace))
    lines = ["# Issue 18's targets, as measured (generated by analysis/stages_targets.py; do not edit by hand)", "",
             "Each row: the range over the points its target covers, and `yes` only when every point meets it. The "
             "measurements and their machines are in each source's folder (artifacts/stages/README.md).", "",
             "| target | threshold | measured | met | source |", "|---|---|---|---|---|"]
    for what, thr, meas, met, src in rows:
        lines.append("| %s | %s | %s | %s | `%s` |" % (what, thr, meas, "yes" if met else "**no**", src))
    met_n = sum(1 for r in rows if r[3])
    lines += ["", "%d of %d targets met." % (met_n, len(rows))]
    data = [{"target": w, "threshold": t, "measured": m, "met": ok, "source": s} for w, t, m, ok, s in rows]
    write_report(a.out, "TARGETS", lines, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
