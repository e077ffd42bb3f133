#!/usr/bin/env python3
"""FastDecode's decode step against its pipeline bound (issue 18): for each run of a sweep (or run folders), the
decode-only steps' median of step_ms / max(s_compute, r_compute_max) — the two-mini-batch pipeline's bound is the
busier side: the S-Part's whole time (it runs the mini-batches one after the other) or the busiest R-worker's
compute (its requests too) — and the medians of the breakdown: s_compute, d2h and h2d (the S-Part's copies, inside
s_compute), r_compute_max, r_wait, wire (per layer and mini-batch, the last reply's send-to-receipt minus its
worker's compute, summed), idle (the decode's time outside the S-Part) and send (the S-worker's time handing the
ATTENDs over: the copies into the shared-memory regions, unless the S-Part wrote q/k/v there; 0 in runs before it was
recorded). Target: <= 1.05 at >= 8 layers.
Writes OUT/pipeline_bound.md, .json.

usage: analysis/pipeline_bound.py DIR... [--out DIR]   (DIR: a sweep folder with index.json, or a run folder)
"""
import argparse
import statistics
import sys
from pathlib import Path

from fd_runs import read_json, run_dirs, write_report
from fd_runs import read_jsonl_or_none as read_jsonl

KEYS = ("s_compute", "d2h", "h2d", "r_compute_max", "r_wait", "wire", "idle", "send")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", type=Path, nargs="+")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    rows = []
    for root in a.dirs:
        for name, d in run_dirs(root):
            d = Path(d)
            summ = read_json(d / "summary.json") or {}
            steps = [s for s in read_jsonl(d / "steps.jsonl")
                     if s.get("decode_tokens", 0) > 0 and s.get("prefill_tokens", 0) == 0 and "breakdown_ms" in s]
            if not steps:
                continue
            bd = lambda k: statistics.median(s["breakdown_ms"].get(k, 0.0) for s in steps)  # noqa: E731
            ratio = [s["step_ms"] / max(s["breakdown_ms"]["s_compute"], s["breakdown_ms"]["r_compute_max"]) for s in steps]
            point = "%s/%s" % (Path(root).name, name) if len(a.dirs) > 1 else name  # several folders: which one
            row = {"point": point, "dir": str(d), "layers": summ.get("model", {}).get("layers"),
                   "batch": statistics.mean(s["decode_tokens"] for s in steps), "steps": len(steps),
                   "step_ms": statistics.median(s["step_ms"] for s in steps), "ratio_median": statistics.median(ratio),
                   "ratio_max": max(ratio), "has_copy_fields": all("d2h" in s["breakdown_ms"] for s in steps)}
            row.update({k: bd(k) for k in KEYS})
            rows.append(row)
    if not rows:
        print("pipeline_bound: no decode steps under %s" % " ".join(map(str, a.dirs)), file=sys.stderr)
        return 1
    lines = ["# FastDecode's decode step against max(S-Part, busiest R-worker) (issue 18)", "",
             "From %s (analysis/pipeline_bound.py). Medians over the decode-only steps, ms; ratio = step / max(s_compute, "
             "r_compute_max) per step (median, max). d2h and h2d are inside s_compute; wire and r_wait overlap; idle = the "
             "decode's time outside the S-Part; send = handing the requests over (outside s_compute)." % ", ".join("`%s`" % d for d in a.dirs), "",
             "| run | layers | batch | step | s_compute | d2h | h2d | r_compute_max | r_wait | wire | idle | send | ratio (median) | ratio (max) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["layers"] or 0, r["point"])):
        lines.append("| %s | %s | %.0f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |" % (
            r["point"], r["layers"], r["batch"], r["step_ms"], r["s_compute"], r["d2h"], r["h2d"], r["r_compute_max"],
            r["r_wait"], r["wire"], r["idle"], r["send"], r["ratio_median"], r["ratio_max"]))
    deep = [r for r in rows if (r["layers"] or 0) >= 8]
    if deep:
        lines += ["", "At >= 8 layers: median ratio %.3f-%.3f (target <= 1.05: %s)." % (
            min(r["ratio_median"] for r in deep), max(r["ratio_median"] for r in deep),
            "met" if all(r["ratio_median"] <= 1.05 for r in deep) else "NOT met")]
    write_report(a.out or a.dirs[0], "pipeline_bound", lines, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
