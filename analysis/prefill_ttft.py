#!/usr/bin/env python3
"""Prefill into quantized caches side by side (issue 18): experiments/gpu/prefill-kv-dtype.sweep.json's runs (points
kv-fp16, kv-int8, kv-int4, interleaved repeats). Per KV dtype, medians over the repeats: TTFT p50 and mean (ms), the
prefill steps' total time (steps.jsonl, steps with prefill_tokens > 0) and the decode step median, each against fp16's
in the same sweep. Target: int8 / int4 TTFT <= 1.2x fp16's. Writes OUT/prefill_ttft.md, .json.

usage: analysis/prefill_ttft.py SWEEP_DIR [--out DIR]
"""
import argparse
import statistics
import sys
from pathlib import Path

from fd_runs import read_json, write_report
from fd_runs import read_jsonl_or_none as read_jsonl


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    out = a.out or a.root
    per = {}
    for pt in (read_json(a.root / "index.json") or {}).get("points", []):
        kv = dict(x.split("-", 1) for x in pt["name"].split("_")).get("kv", pt["name"])
        for run in pt.get("runs", []):
            if run.get("status") != "ok":
                continue
            d = a.root / run["dir"]
            res = (read_json(d / "summary.json") or {}).get("results", {})
            steps = read_jsonl(d / "steps.jsonl")
            pre = [s["step_ms"] for s in steps if s.get("prefill_tokens", 0) > 0]
            dec = [s["step_ms"] for s in steps if s.get("prefill_tokens", 0) == 0 and s.get("decode_tokens", 0) > 0]
            per.setdefault(kv, []).append({"ttft_p50": res.get("ttft_ms", {}).get("p50"), "ttft_mean": res.get("ttft_ms", {}).get("mean"),
                                           "prefill_ms": sum(pre), "prefill_steps": len(pre),
                                           "decode_step_ms": statistics.median(dec) if dec else None, "dir": str(d)})
    if "fp16" not in per:
        print("prefill_ttft: no fp16 run under %s" % a.root, file=sys.stderr)
        return 1
    med = lambda k, key: statistics.median(r[key] for r in per[k] if r[key] is not None)  # noqa: E731
    rows = []
    for kv in ("fp16", "int8", "int4"):
        if kv not in per:
            continue
        row = {"kv_dtype": kv, "repeats": len(per[kv]), "runs": per[kv]}
        for key in ("ttft_p50", "ttft_mean", "prefill_ms", "decode_step_ms"):
            row[key] = med(kv, key)
            row[key + "_vs_fp16"] = row[key] / med("fp16", key)
        rows.append(row)
    lines = ["# Prefill into quantized caches (issue 18)", "",
             f"From `{a.root}` (experiments/gpu/prefill-kv-dtype.sweep.json; analysis/prefill_ttft.py): medians over the "
             "repeats; x fp16: against the fp16 run of the same sweep. Target: int8 / int4 TTFT <= 1.2x fp16.", "",
             "| KV | TTFT p50 ms (x fp16) | TTFT mean ms (x fp16) | prefill steps ms (x fp16) | decode step ms (x fp16) | repeats |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %s | %.1f (%.2f) | %.1f (%.2f) | %.1f (%.2f) | %.3f (%.2f) | %d |" % (
            r["kv_dtype"], r["ttft_p50"], r["ttft_p50_vs_fp16"], r["ttft_mean"], r["ttft_mean_vs_fp16"], r["prefill_ms"],
            r["prefill_ms_vs_fp16"], r["decode_step_ms"], r["decode_step_ms_vs_fp16"], r["repeats"]))
    met = all(r["ttft_mean_vs_fp16"] <= 1.2 for r in rows)
    lines += ["", "int8 / int4 TTFT (mean) <= 1.2x fp16: %s." % ("met" if met else "NOT met")]
    write_report(out, "prefill_ttft", lines, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
