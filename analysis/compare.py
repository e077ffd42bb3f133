#!/usr/bin/env python3
"""Side-by-side table of fd-bench run folders (markdown on stdout, and --json FILE).

usage: analysis/compare.py RUN_DIR|SWEEP_DIR... [--group-by-config] [--base NAME] [--ratio NUM:DEN ...]
                           [--slo ttft:MS,tpot:MS,e2e:MS] [--x NAME|KEY] [--attainment FRAC] [--plot-slo FILE.png]
                           [--json FILE] [--out FILE.md]

Each argument is a run folder (summary.json + steps.jsonl[.gz]), a sweep folder (index.json of `fd-bench sweep`:
each point one row, its repeats <point>/rep<k>/ reduced to median with min–max), or a folder of run folders
(its immediate subfolders that have a summary.json). With --group-by-config, run folders whose resolved
configs (summary.json "config" without "output") are identical are one row, as repeats.

Columns: name, engine, balance (hardware.gpu memory_gb / sm_count: "full" = no cap), layers run / full depth,
B (mean decode tokens per step: the steady window's, else the decode-only steps'), decode-only tok/s, steady
tok/s, whole-run tok/s (output_throughput), decode-only step p50 / p99, the steady window's decode step p99, the
busiest R-worker's KV over the mean (steady p50, engines with R-workers), TTFT p50, the SLO attainment and goodput
(the good requests' output tokens / duration: runs given workload.slo or --slo; docs/EXPERIMENTS.md, "Goodput"), and
the full-depth
equivalent of each rate, "full-depth equiv. (×L/N)": the rate × N/L (N layers run of L; the step taken as
L/N times the measured one, which assumes the step linear in layers with no fixed part, as Fig. 8 measures).

Numbers come from summary.json results.decode_only / results.steady / results.full_depth_equivalent when the
run recorded them; otherwise decode-only is computed from steps.jsonl (analysis/fd_runs.py: no prompt tokens
that step), steady is "-" (only fd-bench defines that window), and the depth factor is model.layers /
model.full_layers (else the model config's num_hidden_layers).

--base NAME: the ratio of every row's rates (and decode-only p99) to row NAME's (a row's name, its run folder, or a prefix
of its name that only it has); --ratio NUM:DEN (repeatable):
the ratio of row NUM to row DEN. With repeats, the ratio is taken per repeat, pairing rep k with rep k (the
runs a sweep interleaves side by side) when both rows have the same repeat numbers, else every pair; the
median is reported with min–max.

--slo ttft:MS,tpot:MS,e2e:MS (any of them; the syntax of fd-bench run --slo): every run is judged from its requests.jsonl
against these limits, as harness/step_stats.cpp slo_stats judges a run given workload.slo (a request is good when every
limit given holds; TPOT = (e2e - TTFT) / (output tokens - 1), 0 for one token), so runs made without an SLO can be judged
after the fact; a run whose results.slo has the same limits and disagrees is reported on stderr. Without --slo the SLO
columns are the runs' own results.slo. Then a "throughput at SLO" table follows (and "slo" in --json): the rows form
one series per config name and engine (and, for a sweep's points, the values of its other axes) over a load axis, --x:
a sweep axis's name or a resolved-config key (summary.json "config": workload.rate, schedule.batch, workload.requests,
...), by default the axis of a one-axis sweep; a series' throughput at SLO is the highest whole-run tok/s among its
points whose attainment (median over repeats) is at least --attainment (default 0.9: the 90 % attainment goal of
DistServe's goodput; 0.99 for a stricter one). --plot-slo FILE.png draws it: goodput and throughput (tok/s) vs the load
axis, the throughput at SLO starred, and SLO attainment vs the load axis with the target line. E.g.
`analysis/compare.py artifacts/baselines/run1-a40a146/full/llama-2-7b/steady --slo ttft:1000,tpot:50
--x workload.requests --plot-slo slo.png`.

SLS (Figs. 11/12) is judged by one metric for every schedule (analysis/fig_paper.py): steady tok/s and the steady
window's decode step p99, e.g. `analysis/compare.py artifacts/paper/runs/fig11-sls-s1024 --base sched-all-at-once`:
the ratios' steady p99 column is each schedule's latency over all-at-once's peak (all-at-once's steady window over
several batches is its whole run), the steady tok/s column its throughput ratio.
"""
import argparse
import json
import os
import statistics
import sys

import numpy as np

from fd_runs import decode_steps, decode_tokens_per_s, full_layers, jsonl_path, read_jsonl

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METRICS = (  # key, column header, format
    ("B", "B", "%.0f"),
    ("decode_tps", "decode-only tok/s", "%.0f"),
    ("steady_tps", "steady tok/s", "%.0f"),
    ("run_tps", "whole-run tok/s", "%.0f"),
    ("decode_p50_ms", "decode step p50 (ms)", "%.2f"),
    ("decode_p99_ms", "decode step p99 (ms)", "%.2f"),
    ("steady_p99_ms", "steady decode step p99 (ms)", "%.2f"),
    ("kv_imbalance", "busiest / mean worker KV (steady p50)", "%.3f"),
    ("ttft_p50_ms", "TTFT p50 (ms)", "%.1f"),
    ("slo_attainment", "SLO attainment", "%.3f"),
    ("goodput_tps", "goodput tok/s (SLO met)", "%.0f"),
    ("fd_decode_tps", "full-depth equiv. (×L/N) decode-only tok/s", "%.0f"),
    ("fd_steady_tps", "full-depth equiv. (×L/N) steady tok/s", "%.0f"),
    ("fd_run_tps", "full-depth equiv. (×L/N) whole-run tok/s", "%.0f"),
)
RATIO_METRICS = ("decode_tps", "steady_tps", "run_tps", "decode_p99_ms", "steady_p99_ms", "goodput_tps")


from compare_slo import CompareError, cell, common_limits, parse_slo, plot_slo, run_slo, slo_markdown, slo_section


def model_full_layers(summary):
    return full_layers(summary)


def balance(summary):
    gpu = ((summary.get("config") or {}).get("hardware") or {}).get("gpu") or {}
    mem, sms = gpu.get("memory_gb") or 0, gpu.get("sm_count") or 0
    if not mem and not sms:
        return "full"
    return " / ".join((["%g GB" % mem] if mem else []) + (["%d SMs" % sms] if sms else []))


def run_metrics(d, slo=None):
    """The columns of one run folder (None for a rate the run does not have); slo: --slo's limits, the run judged
    against them (run_slo), else its own results.slo."""
    sp = os.path.join(d, "summary.json")
    if not os.path.isfile(sp):
        raise CompareError("%s: no summary.json" % d)
    try:
        s = json.load(open(sp))
    except ValueError as e:
        raise CompareError("%s: summary.json is not valid JSON (%s)" % (sp, e))
    res = s.get("results") or {}
    eng = s.get("engine")
    eng = eng.get("type") if isinstance(eng, dict) else eng
    layers = (s.get("model") or {}).get("layers") or ((s.get("config") or {}).get("model") or {}).get("layers")
    full = model_full_layers(s)
    fde = res.get("full_depth_equivalent") or {}
    m = {"B": None, "decode_tps": None, "steady_tps": None, "run_tps": res.get("output_throughput"),
         "decode_p50_ms": None, "decode_p99_ms": None, "ttft_p50_ms": (res.get("ttft_ms") or {}).get("p50"),
         "steady_p99_ms": None, "kv_imbalance": ((res.get("worker_kv_imbalance") or {}).get("steady") or {}).get("p50"),
         "slo_attainment": None, "goodput_tps": None}
    slo_res = run_slo(d, res, slo) if slo else (res.get("slo") if isinstance(res.get("slo"), dict) else None)
    if slo_res:
        m["slo_attainment"], m["goodput_tps"] = slo_res.get("attainment"), slo_res.get("goodput_tokens_per_s")
    do, st = res.get("decode_only"), res.get("steady")
    source = "summary.json"
    if do:
        m["decode_tps"] = do.get("tokens_per_s")
        m["decode_p50_ms"] = (do.get("step_ms") or {}).get("p50")
        m["decode_p99_ms"] = (do.get("step_ms") or {}).get("p99")
    elif jsonl_path(d, "steps.jsonl"):
        dec = decode_steps(read_jsonl(d, "steps.jsonl"))
        source = "steps.jsonl"
        if dec:
            lat = [x["step_ms"] for x in dec]
            m["decode_tps"] = decode_tokens_per_s(dec)
            m["decode_p50_ms"] = float(np.percentile(lat, 50))
            m["decode_p99_ms"] = float(np.percentile(lat, 99))
            m["B"] = sum(x["decode_tokens"] for x in dec) / len(dec)
    if st:
        m["steady_tps"] = st.get("tokens_per_s")
        m["steady_p99_ms"] = (st.get("decode_step_ms") or {}).get("p99")
        if st.get("mean_batch") is not None:
            m["B"] = st["mean_batch"]
    if m["B"] is None and do and do.get("steps"):
        m["B"] = do.get("tokens", 0) / do["steps"]
    if fde.get("factor"):
        factor = float(fde["factor"])
    elif layers and full and int(layers) < full:
        factor = float(layers) / float(full)
    else:
        factor = None
    for k in ("decode_tps", "steady_tps", "run_tps"):
        m["fd_" + k] = m[k] * factor if (factor and m[k] is not None) else None
    if fde.get("layers"):
        layers, full = fde["layers"], fde.get("full_layers", full)
    return {"name": s.get("name") or os.path.basename(os.path.normpath(d)), "dir": d, "engine": eng or "?",
            "balance": balance(s), "layers": layers, "full_layers": full, "factor": factor, "source": source,
            "config": {k: v for k, v in (s.get("config") or {}).items() if k != "output"}, "metrics": m, "slo": slo_res,
            "provenance": s.get("provenance")}


def reduce(values):
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": float(statistics.median(vals)), "min": float(min(vals)), "max": float(max(vals)), "n": len(vals)}


def make_row(name, runs, reps=None):
    """One table row from the runs of one point (reps: their repeat numbers, for pairing ratios)."""
    first = runs[0]
    for key in ("engine", "balance", "layers", "full_layers"):
        if len({str(r[key]) for r in runs}) > 1:
            print("compare: %s: runs differ in %s (%s); the first run's is shown" % (name, key, ", ".join(sorted({str(r[key]) for r in runs}))),
                  file=sys.stderr)
    return {"name": name, "engine": first["engine"], "balance": first["balance"], "layers": first["layers"],
            "full_layers": first["full_layers"], "factor": first["factor"], "repeats": len(runs),
            "reps": list(reps) if reps else list(range(1, len(runs) + 1)), "dirs": [r["dir"] for r in runs],
            "sources": sorted({r["source"] for r in runs}),
            "runs": [r["metrics"] for r in runs], "slo": [r["slo"] for r in runs],
            "metrics": {k: reduce([r["metrics"][k] for r in runs]) for k, _, _ in METRICS},
            # for the SLO section and figure (left out of --json): the config name, resolved config and provenance of
            # the first run, and the sweep point the row is (read_sweep)
            "_run_name": first["name"], "_config": first["config"], "_provenance": first["provenance"], "_sweep": None}


def sweep_axes(idx):
    """The axes of a sweep's index.json: [{"name", "keys", "labels"}] (an axis's name defaults to its key's last part)."""
    out = []
    for a in ((idx.get("spec") or {}).get("axes") or []):
        keys = [a["key"]] if a.get("key") else list(a.get("keys") or [])
        name = a.get("name") or "-".join(k.split(".")[-1] for k in keys)
        out.append({"name": name, "keys": keys, "values": a.get("values") or [], "labels": a.get("labels")})
    return out


def read_sweep(d, slo=None):
    """Rows of a sweep folder's index.json: one per point, its runs that have a summary.json."""
    try:
        idx = json.load(open(os.path.join(d, "index.json")))
    except ValueError as e:
        raise CompareError("%s/index.json is not valid JSON (%s)" % (d, e))
    axes = sweep_axes(idx)
    rows = []
    for p in idx.get("points") or []:
        runs, reps = [], []
        for r in p.get("runs") or []:
            rd = r.get("dir") or ""
            rd = rd if os.path.isabs(rd) else os.path.join(d, rd)
            if not os.path.isfile(os.path.join(rd, "summary.json")):
                # index.json may name dirs relative to the sweep's --out as given when run: try <point>/rep<k>
                alt = os.path.join(d, p.get("name", ""), "rep%s" % r.get("rep"))
                rd = alt if os.path.isfile(os.path.join(alt, "summary.json")) else rd
            if r.get("status") in ("failed", "incomplete") or not os.path.isfile(os.path.join(rd, "summary.json")):
                print("compare: %s rep %s: %s, left out" % (p.get("name"), r.get("rep"),
                                                           r.get("error") or r.get("status") or "no summary.json"), file=sys.stderr)
                continue
            runs.append(run_metrics(rd, slo))
            reps.append(r.get("rep"))
        if runs:
            rows.append(make_row(p.get("name", "?"), runs, reps))
            rows[-1]["_sweep"] = {"dir": d, "name": idx.get("sweep"), "axes": axes, "values": p.get("values") or {}}
        else:
            print("compare: point %s has no finished run, left out" % p.get("name"), file=sys.stderr)
    return rows


def collect(paths, group_by_config=False, slo=None):
    rows, singles = [], []
    for path in paths:
        if os.path.isfile(os.path.join(path, "index.json")):
            rows += read_sweep(path, slo)
        elif os.path.isfile(os.path.join(path, "summary.json")):
            singles.append(run_metrics(path, slo))
        elif os.path.isdir(path):
            subs = sorted(os.path.join(path, n) for n in os.listdir(path) if os.path.isfile(os.path.join(path, n, "summary.json")))
            if not subs:
                raise CompareError("%s: neither a run folder (summary.json), a sweep (index.json) nor a folder of run folders" % path)
            singles += [run_metrics(s, slo) for s in subs]
        else:
            raise CompareError("%s: not a folder" % path)
    if group_by_config:
        groups = {}
        for r in singles:
            groups.setdefault(json.dumps(r["config"], sort_keys=True), []).append(r)
        rows += [make_row(g[0]["name"], g) for g in groups.values()]
    else:
        rows += [make_row(r["name"], [r]) for r in singles]
    names = [r["name"] for r in rows]
    for r in rows:  # equal names (the same config run twice, ungrouped): tell them apart by folder
        if names.count(r["name"]) > 1:
            r["name"] = "%s (%s)" % (r["name"], os.path.relpath(r["dirs"][0]))
    if not rows:
        raise CompareError("no run to compare")
    return rows


def ratio(num, den, key):
    """{median, min, max, n, paired} of num/den per repeat (paired by rep number when both have the same), or None."""
    a = [(rep, m[key]) for rep, m in zip(num["reps"], num["runs"]) if m[key] is not None]
    b = [(rep, m[key]) for rep, m in zip(den["reps"], den["runs"]) if m[key] is not None and m[key] != 0]
    if not a or not b:
        return None
    paired = len(a) > 1 and sorted(r for r, _ in a) == sorted(r for r, _ in b)
    if paired:
        bd = dict(b)
        vals = [v / bd[rep] for rep, v in a]
    else:
        vals = [x / y for _, x in a for _, y in b]
    out = reduce(vals)
    out["paired"] = paired
    return out


def find_row(rows, name):
    """The row NAME names: its name, else the row whose run folder (or one of its repeats') is NAME as a path, else the
    one row whose name starts with NAME. Ambiguous or absent: an error listing the rows."""
    hit = [r for r in rows if r["name"] == name]
    if not hit and os.path.exists(name):
        p = os.path.realpath(name)
        hit = [r for r in rows if any(os.path.realpath(d) == p or os.path.realpath(os.path.dirname(d)) == p for d in r["dirs"])]
    if not hit:
        hit = [r for r in rows if r["name"].startswith(name)]
    if len(hit) != 1:
        raise CompareError("%s %r (rows: %s; a row is named by its name, its run folder, or a prefix of its name that "
                           "only it has)" % ("no row named" if not hit else "more than one row matches", name,
                                            ", ".join(r["name"] for r in rows)))
    return hit[0]


def ratios(rows, base=None, pairs=()):
    out = []
    if base:
        b = find_row(rows, base)
        out += [(r, b) for r in rows if r is not b]
    for spec in pairs:
        if ":" not in spec:
            raise CompareError("--ratio %s: expected NUM:DEN (two row names)" % spec)
        n, d = spec.split(":", 1)
        out.append((find_row(rows, n), find_row(rows, d)))
    return [{"num": n["name"], "den": d["name"], "ratios": {k: ratio(n, d, k) for k in RATIO_METRICS}} for n, d in out]


def markdown(rows, rats):
    reps = any(r["repeats"] > 1 for r in rows)
    head = ["name", "engine", "balance", "layers run / full"] + [h for _, h, _ in METRICS] + ["runs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        depth = "%s / %s" % (r["layers"] or "?", r["full_layers"] or "?")
        lines.append("| " + " | ".join([r["name"], r["engine"], r["balance"], depth] + [cell(r["metrics"][k], f) for k, _, f in METRICS]
                                       + [str(r["repeats"])]) + " |")
    notes = ["", "decode-only: steps with no prompt tokens; steady: summary.json results.steady (the steps between the last "
             "admission and the first finish, else the whole run, as fd-bench and fd-sim define it; '-' when the run "
             "did not record it); full-depth equiv. (×L/N): the rate × N/L, N of L layers run (assumes the step linear in layers, "
             "no fixed part: Fig. 8)."]
    if reps:
        notes.append("Repeats: median (min–max) over the runs counted in the last column.")
    if any("steps.jsonl" in r["sources"] for r in rows):
        notes.append("Rows from runs without results.decode_only: decode-only numbers computed from steps.jsonl (analysis/fd_runs.py).")
    lines += notes
    if rats:
        hdr = ["ratio"] + ["%s" % h for k in RATIO_METRICS for kk, h, _ in METRICS if kk == k]
        lines += ["", "| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
        for x in rats:
            vals = []
            for k in RATIO_METRICS:
                v = x["ratios"][k]
                vals.append("-" if v is None else "%.3f" % v["median"] + (" (%.3f–%.3f%s)" % (v["min"], v["max"], ", paired by repeat" if v["paired"] else "")
                                                                          if v["n"] > 1 else ""))
            lines.append("| %s / %s | %s |" % (x["num"], x["den"], " | ".join(vals)))
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", help="run folders, sweep folders (index.json) or folders of run folders")
    ap.add_argument("--group-by-config", action="store_true", help="runs with identical resolved configs are repeats of one row")
    ap.add_argument("--base", help="row name: every other row's ratio to it")
    ap.add_argument("--ratio", action="append", default=[], metavar="NUM:DEN", help="ratio of row NUM to row DEN (repeatable)")
    ap.add_argument("--slo", metavar="ttft:MS,tpot:MS,e2e:MS",
                    help="judge every run's requests.jsonl against these limits (any of them; fd-bench run --slo's syntax): the "
                         "SLO attainment and goodput columns, and the throughput-at-SLO table")
    ap.add_argument("--x", metavar="NAME|KEY",
                    help="the load axis of the throughput-at-SLO table and figure: a sweep axis's name or a resolved-config key "
                         "(e.g. workload.rate, schedule.batch); default: the sweep's axis when every row is a point of a one-axis sweep")
    ap.add_argument("--attainment", type=float, default=0.9, metavar="FRAC",
                    help="the SLO attainment a point must reach to count for throughput at SLO (default 0.9, as DistServe's 90%% target)")
    ap.add_argument("--plot-slo", metavar="FILE.png",
                    help="draw throughput at an SLO here (the format from the extension: png, pdf, svg): goodput and throughput "
                         "vs the load axis, and SLO attainment vs it with the target")
    ap.add_argument("--json", help="also write the table as JSON here")
    ap.add_argument("--out", help="write the markdown here instead of stdout")
    a = ap.parse_args(argv)
    try:
        limits = parse_slo(a.slo) if a.slo is not None else None
        if not 0 < a.attainment <= 1:
            raise CompareError("--attainment %g: expected a fraction in (0, 1]" % a.attainment)
        rows = collect(a.paths, a.group_by_config, limits)
        rats = ratios(rows, a.base, a.ratio)
        sec, why = None, None
        if a.slo is not None or a.x or a.plot_slo:
            lim = limits or common_limits(rows)
            if lim is None:
                why = "no --slo, and the runs' results.slo limits are not all the same (or none has any): give --slo"
            else:
                try:
                    sec = slo_section(rows, lim, a.x, a.attainment)
                except CompareError as e:
                    if a.x:
                        raise
                    why = str(e)
            if why and a.plot_slo:
                raise CompareError("--plot-slo: %s" % why)
        if sec and a.plot_slo:
            plot_slo(sec, rows, a.plot_slo)
            print("compare: wrote %s" % a.plot_slo, file=sys.stderr)
    except (CompareError, OSError, ValueError) as e:
        print("compare: %s" % e, file=sys.stderr)
        return 2
    md = markdown(rows, rats)
    if sec:
        md += slo_markdown(sec)
    elif why:
        md += "\nThroughput at SLO: not shown (%s).\n" % why
    if a.out:
        with open(a.out, "w") as f:
            f.write(md)
    else:
        sys.stdout.write(md)
    if a.json:
        doc = {"rows": [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows], "ratios": rats,
               "metrics": {k: h for k, h, _ in METRICS}, "slo": sec}
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
