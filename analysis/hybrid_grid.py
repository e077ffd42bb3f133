#!/usr/bin/env python3
"""The hybrid grid side by side (issue 17; docs/HYBRID.md): for each cell (GPU memory cap x context x R-worker cores)
of scripts/hybrid-grid.sh's three sweeps (ROOT/gpu-only, ROOT/hybrid, ROOT/fastdecode), the decode tokens/s of each
engine (decode-only, as summary.json's headline), their mean running batch, the split the hybrid's controller chose
(sequences on the CPUs in its decode steps), its modelled step against the measured one, and the ratio of hybrid to
the better of the other two (the issue's goal: >= 0.98 in every cell, above both where GPU memory caps gpu-only's
batch). Writes OUT/hybrid_grid.md and OUT/hybrid_grid.json.

Usage: analysis/hybrid_grid.py ROOT [--out DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path

ENGINES = ("gpu-only", "fastdecode", "hybrid")


def read_json(p: Path):
    if p.exists():
        return json.loads(p.read_text())
    gz = Path(str(p) + ".gz")
    return json.loads(gzip.decompress(gz.read_bytes())) if gz.exists() else None


def read_jsonl(p: Path):
    if p.exists():
        text = p.read_text()
    elif Path(str(p) + ".gz").exists():
        text = gzip.decompress(Path(str(p) + ".gz").read_bytes()).decode()
    else:
        return []
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def points(root: Path, engine: str) -> dict:
    """{cell name: (headline, run folder)} of one engine's sweep (the first repeat that finished ok)."""
    index = read_json(root / engine / "index.json")
    out = {}
    for pt in (index or {}).get("points", []):
        for run in pt.get("runs", []):
            if run.get("status") == "ok":
                out[pt["name"]] = (run.get("headline", {}), root / engine / run["dir"])
                break
    return out


def hybrid_split(run: Path) -> dict:
    """The hybrid run's decode steps: sequences on the CPUs and on the GPU, the modelled and measured step."""
    steps = [s for s in read_jsonl(run / "steps.jsonl") if s.get("decode_tokens", 0) > 0 and s.get("prefill_tokens", 0) == 0]
    if not steps:
        return {}
    cpu = [s.get("counts", {}).get("cpu_seqs", 0) for s in steps]
    gpu = [s.get("counts", {}).get("gpu_seqs", 0) for s in steps]
    modelled = [s["breakdown_ms"].get("modelled_step") for s in steps if "modelled_step" in s.get("breakdown_ms", {})]
    measured = [s["step_ms"] for s in steps if "step_ms" in s]
    return {"cpu_seqs_max": max(cpu), "cpu_seqs_mean": statistics.mean(cpu), "gpu_seqs_mean": statistics.mean(gpu),
            "modelled_step_ms_median": statistics.median(modelled) if modelled else None,
            "measured_step_ms_median": statistics.median(measured) if measured else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    out = a.out or a.root
    runs = {e: points(a.root, e) for e in ENGINES}
    cells = sorted(set().union(*[set(r) for r in runs.values()]))
    if not cells:
        print(f"hybrid_grid: no finished runs under {a.root}", file=sys.stderr)
        return 1
    rows = []
    for c in cells:
        row = {"cell": c}
        for e in ENGINES:
            h = runs[e].get(c, ({}, None))[0]
            row[e] = {"tokens_per_s": h.get("decode_only.tokens_per_s"), "mean_batch": h.get("steady.mean_batch")}
        if c in runs["hybrid"]:
            row["hybrid"].update(hybrid_split(runs["hybrid"][c][1]))
        best = max([row[e]["tokens_per_s"] or 0 for e in ("gpu-only", "fastdecode")])
        hy = row["hybrid"]["tokens_per_s"]
        row["hybrid_vs_best"] = hy / best if hy and best else None
        row["meets_0.98"] = row["hybrid_vs_best"] is not None and row["hybrid_vs_best"] >= 0.98
        rows.append(row)
    fmt = lambda x, f="%.0f": "—" if x is None else f % x  # noqa: E731
    lines = ["# The hybrid grid (issue 17): decode tokens/s side by side", "",
             f"From `{a.root}` (scripts/hybrid-grid.sh; analysis/hybrid_grid.py). Cells: GPU memory cap (GB) x context "
             "x R-worker cores. Decode-only tokens/s (summary.json's headline); batch: the steady window's mean running "
             "sequences; CPU seqs: the hybrid's sequences on the R-workers in its decode steps (mean, max); modelled / "
             "measured: the controller's modelled step against the measured one (median, ms).", "",
             "| cell | gpu-only tok/s (batch) | FastDecode tok/s (batch) | hybrid tok/s (batch) | hybrid / best | CPU seqs mean (max) | modelled / measured ms |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        hy = r["hybrid"]
        lines.append("| %s | %s (%s) | %s (%s) | %s (%s) | %s%s | %s (%s) | %s / %s |" % (
            r["cell"], fmt(r["gpu-only"]["tokens_per_s"]), fmt(r["gpu-only"]["mean_batch"]),
            fmt(r["fastdecode"]["tokens_per_s"]), fmt(r["fastdecode"]["mean_batch"]),
            fmt(hy["tokens_per_s"]), fmt(hy["mean_batch"]), fmt(r["hybrid_vs_best"], "%.3f"),
            "" if r["meets_0.98"] else " (below 0.98)", fmt(hy.get("cpu_seqs_mean"), "%.1f"), fmt(hy.get("cpu_seqs_max")),
            fmt(hy.get("modelled_step_ms_median"), "%.2f"), fmt(hy.get("measured_step_ms_median"), "%.2f")))
    met = sum(1 for r in rows if r["meets_0.98"])
    lines += ["", f"hybrid >= 0.98 x max(gpu-only, FastDecode) in {met} of {len(rows)} cells."]
    out.mkdir(parents=True, exist_ok=True)
    (out / "hybrid_grid.md").write_text("\n".join(lines) + "\n")
    (out / "hybrid_grid.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
