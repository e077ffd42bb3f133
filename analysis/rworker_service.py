#!/usr/bin/env python3
"""R-workers in service against their kernel alone (issue 43): a report from `fd-bench profile --service` files.

    analysis/rworker_service.py PROFILE.json [PROFILE.json ...] --out-dir artifacts/rworker/service

Each profile's `r_service.rows` holds, per (KV dtype, B, context), the busiest worker's ATTEND time by part (its STATS
over the measured steps), its socket loop's, the layer's steady round, and the kernel alone on the same bytes and cores
(a replay in the profiling process, pinned as the workers are; docs/SCHEDULING.md). This writes:

* `service.json`: one record per row with the ratios the criterion reads, the criterion itself and each row's verdict;
  and, for profiles named NAME_before.json / NAME_after.json (scripts/rworker-ab.sh: the same grid with the worker
  before and after a change, one profiler), the pairs row by row;
* `README.md`: the tables, generated (nothing typed in), with each profile's provenance.

The criterion, written before the numbers were read (issue 43, "Done when"): the busiest worker's compute per visit is
at most CRITERION x the kernel alone on the same bytes and cores. Each row also says where the rest of the layer's
round goes (round - kernel alone): the worker's non-kernel compute, its socket loop outside the handler, and the time it
sat idle waiting for the next ATTEND (the client, the wire and the other mini-batch).
"""
from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

CRITERION = 1.10  # compute / kernel alone, at most (issue 43)
PARTS = ("prepare", "append", "query", "kernel", "output")
LOOP = ("receive", "send", "wait")


def model_of(profile: dict) -> str:
    """The --model of the command that wrote the profile (its file name, without .json)."""
    argv = shlex.split(profile.get("provenance", {}).get("command", ""))
    for i, a in enumerate(argv[:-1]):
        if a == "--model":
            return Path(argv[i + 1]).stem
    return "?"


def verdict(compute_over_alone: float | None) -> str:
    if compute_over_alone is None:
        return "no kernel-alone replay"
    return "meets" if compute_over_alone <= CRITERION else "misses"


def records(profile: dict, source: str) -> list[dict]:
    svc = profile["r_service"]
    out = []
    for r in svc["rows"]:
        parts = r.get("busiest_parts_s_per_layer", {})
        alone = r.get("kernel_alone_s_per_layer")
        compute = parts.get("compute", r["busiest_compute_s_per_layer"])
        ratio = compute / alone if alone else None
        rec = {
            "source": source, "model": model_of(profile), "workers": svc["workers"], "threads": svc["threads"],
            "pinned": svc["pinned"], "shm": svc["shm"], "kv_dtype": r["kv_dtype"], "batch": r["batch"],
            "context": r["context"], "round_ms": 1e3 * r["round_s_per_layer"], "compute_ms": 1e3 * compute,
            "kernel_alone_ms": 1e3 * alone if alone else None,
            "parts_ms": {k: 1e3 * parts.get(k, 0.0) for k in PARTS},
            "loop_ms": {k: 1e3 * parts.get("loop_" + k, 0.0) for k in LOOP + ("handle",)},
            "compute_over_kernel_alone": ratio,
            "kernel_in_service_over_alone": parts["kernel"] / alone if alone and "kernel" in parts else None,
            "round_over_kernel_alone": r["round_s_per_layer"] / alone if alone else None,
            "verdict": verdict(ratio),
        }
        out.append(rec)
    return out


def fmt(x, spec=".2f"):
    return "–" if x is None else format(x, spec)


def pairs(profiles: list[tuple[str, dict]]) -> list[dict]:
    """Rows of NAME_before.json against the same (KV, B, context) of NAME_after.json."""
    by = {name: p for name, p in profiles}
    out = []
    for name, p in profiles:
        if not name.endswith("_before.json") or name.replace("_before.json", "_after.json") not in by:
            continue
        after = {(r["kv_dtype"], r["batch"], r["context"]): r for r in records(by[name.replace("_before", "_after")], "")}
        for b in records(p, name):
            a = after.get((b["kv_dtype"], b["batch"], b["context"]))
            if a is None:
                continue
            out.append({"pair": name[: -len("_before.json")], "model": b["model"], "kv_dtype": b["kv_dtype"],
                        "batch": b["batch"], "context": b["context"], "round_ms_before": b["round_ms"],
                        "round_ms_after": a["round_ms"], "round_after_over_before": a["round_ms"] / b["round_ms"],
                        "compute_over_kernel_alone_before": b["compute_over_kernel_alone"],
                        "compute_over_kernel_alone_after": a["compute_over_kernel_alone"],
                        "verdict_after": a["verdict"]})
    return out


def report(profiles: list[tuple[str, dict]]) -> tuple[str, dict]:
    recs = [rec for name, p in profiles for rec in records(p, name)]
    judged = [r for r in recs if r["compute_over_kernel_alone"] is not None]
    meets = sum(r["verdict"] == "meets" for r in judged)
    worst = max(judged, key=lambda r: r["compute_over_kernel_alone"], default=None)
    lines = ["# R-workers in service against their kernel alone (issue 43)", "",
             "Generated by `analysis/rworker_service.py` from the `fd-bench profile --service` files below; do not edit.",
             "", f"Criterion (written before the numbers): the busiest worker's compute per visit ≤ {CRITERION:.2f} × the "
             "kernel alone on the same bytes and cores (a replay pinned as the workers are). "
             f"**{meets} of {len(judged)} rows meet it**" +
             (f"; the worst is {worst['model']} {worst['kv_dtype']} B = {worst['batch']}, S = {worst['context']}: "
              f"{worst['compute_over_kernel_alone']:.2f}×." if worst else "."), "",
             "Per row, ms a visit (a layer's two mini-batches) of the busiest worker: its compute by part, its socket "
             "loop around the handler (receive, send) and its idle time before each ATTEND came (wait), the layer's "
             "steady round as the client sees it, and the kernel alone. Ratios over the kernel alone.", ""]
    ab = pairs(profiles)
    if ab:
        after_rows = [x for x in ab if x["compute_over_kernel_alone_after"] is not None]
        lines += ["## Before and after (the same grid, the same profiler, one call)", "",
                  f"{sum(x['verdict_after'] == 'meets' for x in after_rows)} of {len(after_rows)} rows meet the criterion "
                  "after the change, " + f"{sum((x['compute_over_kernel_alone_before'] or 99) <= CRITERION for x in ab)} "
                  "before it; a layer's round after / before: "
                  f"{min(x['round_after_over_before'] for x in ab):.2f}–{max(x['round_after_over_before'] for x in ab):.2f}.",
                  "", "| profiles | KV | B | S | round before (ms) | round after (ms) | after / before | compute / kernel alone "
                  "before | after | verdict after |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for x in ab:
            lines.append(f"| {x['pair']} | {x['kv_dtype']} | {x['batch']} | {x['context']} | {x['round_ms_before']:.3f} | "
                         f"{x['round_ms_after']:.3f} | {x['round_after_over_before']:.2f} | "
                         f"{fmt(x['compute_over_kernel_alone_before'])} | {fmt(x['compute_over_kernel_alone_after'])} | "
                         f"{x['verdict_after']} |")
        lines.append("")
    for name, p in profiles:
        prov = p.get("provenance", {})
        svc = p["r_service"]
        gpus = ", ".join(g.get("name", "?") if isinstance(g, dict) else str(g) for g in prov.get("gpus", [])) or "none"
        lines += [f"## `{name}`: {model_of(p)}, {svc['workers']} workers × {svc['threads']} threads"
                  f"{', pinned' if svc['pinned'] else ''}{', shared-memory lane' if svc['shm'] else ''}", "",
                  f"fd-rworker `{svc.get('rworker_binary', '?')}`; {prov.get('cpu_model', '?')} "
                  f"({prov.get('cpu_cores', '?')} cores), GPU {gpus}, commit "
                  f"{str(prov.get('git_commit', '?'))[:12]}{' (dirty)' if prov.get('git_dirty') else ''}, "
                  f"{prov.get('date_utc', '?')}", "",
                  "| KV | B | S | round | compute | kernel | append | query | output | prepare | receive | send | wait | "
                  "kernel alone | compute / alone | kernel / alone | round / alone | verdict |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
                  "---: | ---: | --- |"]
        for r in records(p, name):
            pm, lm = r["parts_ms"], r["loop_ms"]
            lines.append(
                f"| {r['kv_dtype']} | {r['batch']} | {r['context']} | {r['round_ms']:.3f} | {r['compute_ms']:.3f} | "
                f"{pm['kernel']:.3f} | {pm['append']:.3f} | {pm['query']:.3f} | {pm['output']:.3f} | {pm['prepare']:.3f} | "
                f"{lm['receive']:.3f} | {lm['send']:.3f} | {lm['wait']:.3f} | {fmt(r['kernel_alone_ms'], '.3f')} | "
                f"{fmt(r['compute_over_kernel_alone'])} | {fmt(r['kernel_in_service_over_alone'])} | "
                f"{fmt(r['round_over_kernel_alone'])} | {r['verdict']} |")
        lines.append("")
    data = {"criterion_compute_over_kernel_alone_max": CRITERION, "rows_meeting": meets, "rows_judged": len(judged),
            "rows": recs, "before_after": ab}
    return "\n".join(lines), data


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("profiles", nargs="+", type=Path, help="fd-bench profile --service JSON files")
    ap.add_argument("--out-dir", type=Path, help="write README.md and service.json here (else markdown on stdout)")
    args = ap.parse_args(argv)
    profiles = []
    for p in args.profiles:
        j = json.loads(p.read_text())
        if "r_service" not in j:
            ap.error(f"{p}: no r_service section (was it written by fd-bench profile --service?)")
        profiles.append((p.name, j))
    md, data = report(profiles)
    if args.out_dir is None:
        print(md)
        return 0
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "README.md").write_text(md)
    (args.out_dir / "service.json").write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
