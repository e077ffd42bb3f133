"""analysis/compare.py: the side-by-side table of run folders, sweeps (index.json) and repeats.

Synthetic run folders in tmp_path: numbers are read from summary.json's results.decode_only / steady /
full_depth_equivalent when present (the folder's steps.jsonl then says something else, so a fallback read
would show), else computed from steps.jsonl (plain or .gz); a sweep's points are rows, their repeats median
with min–max; --group-by-config groups identical configs; --base / --ratio pair repeats by number. Every
expected value is computed here from what the test wrote, not with compare.py's helpers.
"""

from __future__ import annotations

import gzip
import json
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "analysis" / "compare.py"


def write_run(d: Path, decode_ms, B=8, name="run", engine="fastdecode", layers=2, full=32, hw=None, results=None,
              gz=False, config_extra=None):
    """A run folder: one prefill step, then decode-only steps of B tokens taking decode_ms[i] ms."""
    d.mkdir(parents=True)
    steps = [{"step": 0, "step_ms": 500.0, "prefill_tokens": 64 * B, "decode_tokens": 0}]
    steps += [{"step": i + 1, "step_ms": ms, "prefill_tokens": 0, "decode_tokens": B} for i, ms in enumerate(decode_ms)]
    text = "".join(json.dumps(s) + "\n" for s in steps)
    if gz:
        with gzip.open(d / "steps.jsonl.gz", "wt") as f:
            f.write(text)
    else:
        (d / "steps.jsonl").write_text(text)
    cfg = {"name": name, "output": {"dir": str(d)}, "engine": {"type": engine},
           "hardware": {"gpu": hw or {"memory_gb": 0.0, "sm_count": 0}}, "model": {"layers": layers}}
    cfg.update(config_extra or {})
    res = {"output_throughput": 1000.0 * B * len(decode_ms) / (500.0 + sum(decode_ms)), "ttft_ms": {"p50": 500.0}}
    res.update(results or {})
    (d / "summary.json").write_text(json.dumps({"name": name, "engine": engine, "config": cfg,
                                                "model": {"name": "llama-2-7b", "layers": layers, "full_layers": full},
                                                "results": res}))
    return res


def compare(*args):
    proc = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def table(tmp_path, *args):
    out = tmp_path / "cmp.json"
    proc = compare(*args, "--json", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    return proc.stdout, doc, {r["name"]: r for r in doc["rows"]}


def md_row(md, name):
    hit = [l for l in md.splitlines() if l.startswith("| %s |" % name)]
    assert len(hit) == 1, md
    return [c.strip() for c in hit[0].strip("|").split("|")]


def test_runs_from_steps_and_from_summary(tmp_path):
    ms = [10.0, 12.0, 11.0, 30.0, 10.5]
    write_run(tmp_path / "a", ms, B=8, name="from-steps", gz=True, hw={"memory_gb": 24.0, "sm_count": 16})
    summary = {"decode_only": {"steps": 5, "tokens": 40, "tokens_per_s": 777.0, "step_ms": {"p50": 9.0, "p99": 29.0}},
               "steady": {"first_step": 2, "last_step": 4, "tokens_per_s": 555.0, "mean_batch": 7.5},
               "full_depth_equivalent": {"layers": 4, "full_layers": 40, "factor": 0.1},
               "slo": {"attainment": 0.75, "goodput_tokens_per_s": 333.0}}
    write_run(tmp_path / "b", ms, B=8, name="from-summary", results=summary)
    md, doc, rows = table(tmp_path, tmp_path / "a", tmp_path / "b")
    a = rows["from-steps"]["metrics"]
    tps = 8 * len(ms) / (sum(ms) / 1e3)
    assert a["decode_tps"]["median"] == pytest.approx(tps, rel=1e-12)
    assert a["decode_p50_ms"]["median"] == pytest.approx(np.percentile(ms, 50), rel=1e-12)
    assert a["decode_p99_ms"]["median"] == pytest.approx(np.percentile(ms, 99), rel=1e-12)
    assert a["B"]["median"] == 8 and a["steady_tps"] is None  # no steady window recorded: not guessed
    assert a["fd_decode_tps"]["median"] == pytest.approx(tps * 2 / 32, rel=1e-12)
    run_tps = 1000.0 * 8 * len(ms) / (500.0 + sum(ms))
    assert a["fd_run_tps"]["median"] == pytest.approx(run_tps * 2 / 32, rel=1e-12)
    assert rows["from-steps"]["balance"] == "24 GB / 16 SMs" and rows["from-steps"]["sources"] == ["steps.jsonl"]
    b = rows["from-summary"]["metrics"]
    assert (b["decode_tps"]["median"], b["decode_p50_ms"]["median"], b["decode_p99_ms"]["median"]) == (777.0, 9.0, 29.0)
    assert (b["steady_tps"]["median"], b["B"]["median"]) == (555.0, 7.5)
    assert (b["fd_decode_tps"]["median"], b["fd_steady_tps"]["median"]) == (pytest.approx(77.7), pytest.approx(55.5))
    assert (rows["from-summary"]["layers"], rows["from-summary"]["full_layers"], rows["from-summary"]["balance"]) == (4, 40, "full")
    assert (b["slo_attainment"]["median"], b["goodput_tps"]["median"]) == (0.75, 333.0)  # results.slo, when the run had one
    assert a["slo_attainment"] is None and a["goodput_tps"] is None
    cells = md_row(md, "from-steps")
    assert cells[1:4] == ["fastdecode", "24 GB / 16 SMs", "2 / 32"]
    assert cells[5] == "%.0f" % tps and cells[6] == "-"
    assert "full-depth equiv. (×L/N)" in md.splitlines()[0]
    assert md_row(md, "from-summary")[5:7] == ["777", "555"]


def write_sweep(root: Path, points, failed=()):
    """A sweep folder: points {name: [decode_ms per rep]}; index.json as fd-bench sweep writes it."""
    idx = {"sweep": "s", "points": []}
    for name, reps in points.items():
        runs = []
        for k, ms in enumerate(reps, 1):
            d = root / name / ("rep%d" % k)
            status = "failed" if (name, k) in failed else "ok"
            if status == "ok":
                write_run(d, ms, name="s", config_extra={"point": name})
            runs.append({"rep": k, "dir": "%s/rep%d" % (name, k), "status": status, "headline": {}}
                        | ({"error": "boom"} if status == "failed" else {}))
        idx["points"].append({"name": name, "values": {}, "runs": runs})
    (root / "index.json").write_text(json.dumps(idx))


def tps(ms, B=8):
    return B * len(ms) / (sum(ms) / 1e3)


def test_sweep_repeats_and_paired_ratios(tmp_path):
    A = [[10.0] * 4, [12.0] * 4, [11.0] * 4]
    B_ = [[20.0] * 4, [21.0] * 4, [30.0] * 4]
    C = [[5.0] * 4, [6.0] * 4, [7.0] * 4]
    write_sweep(tmp_path / "sw", {"A": A, "B": B_, "C": C}, failed={("C", 3)})
    md, doc, rows = table(tmp_path, tmp_path / "sw", "--base", "B", "--ratio", "A:C")
    for name, reps in (("A", A), ("B", B_), ("C", C[:2])):
        vals = [tps(ms) for ms in reps]
        m = rows[name]["metrics"]["decode_tps"]
        assert (m["median"], m["min"], m["max"], m["n"]) == (pytest.approx(statistics.median(vals)), pytest.approx(min(vals)),
                                                            pytest.approx(max(vals)), len(vals))
        assert rows[name]["repeats"] == len(reps)
    assert rows["C"]["reps"] == [1, 2]  # the failed repeat is left out
    cell = md_row(md, "A")[5]
    assert cell == "%.0f (%.0f–%.0f)" % (statistics.median([tps(x) for x in A]), min(tps(x) for x in A), max(tps(x) for x in A))
    rat = {(r["num"], r["den"]): r["ratios"]["decode_tps"] for r in doc["ratios"]}
    per_rep = [tps(a) / tps(b) for a, b in zip(A, B_)]  # rep k against rep k
    got = rat[("A", "B")]
    assert got["paired"] and (got["median"], got["min"], got["max"]) == (
        pytest.approx(statistics.median(per_rep)), pytest.approx(min(per_rep)), pytest.approx(max(per_rep)))
    # C lacks rep 3: every pair of A's and C's repeats
    every = [tps(a) / tps(c) for a in A for c in C[:2]]
    got = rat[("A", "C")]
    assert not got["paired"] and got["n"] == len(every) and got["median"] == pytest.approx(statistics.median(every))
    assert ("B", "B") not in rat and ("C", "B") in rat
    assert "| A / B | %.3f (%.3f–%.3f, paired by repeat)" % (statistics.median(per_rep), min(per_rep), max(per_rep)) in md


def test_group_by_config(tmp_path):
    for k, ms in enumerate(([10.0] * 3, [14.0] * 3)):
        write_run(tmp_path / "runs" / ("x%d" % k), ms, name="x")
    write_run(tmp_path / "runs" / "y", [8.0] * 3, name="y", engine="gpu-only")
    _, _, rows = table(tmp_path, tmp_path / "runs", "--group-by-config")
    assert sorted(rows) == ["x", "y"]
    assert rows["x"]["repeats"] == 2 and rows["x"]["metrics"]["decode_tps"]["min"] == pytest.approx(tps([14.0] * 3))
    _, _, rows = table(tmp_path, tmp_path / "runs")  # ungrouped: two rows named x, told apart by folder
    assert len(rows) == 3 and all(r["repeats"] == 1 for r in rows.values())
    # --base names a row by its run folder, or a prefix only it has (was: only the "x (runs/x0)" label it was given).
    _, doc, _ = table(tmp_path, tmp_path / "runs", "--base", tmp_path / "runs" / "x1")
    assert {x["den"] for x in doc["ratios"]} == {next(n for n in rows if "x1" in n)}
    _, doc, _ = table(tmp_path, tmp_path / "runs", "--base", "y")
    assert {x["den"] for x in doc["ratios"]} == {"y"} and len(doc["ratios"]) == 2
    proc = compare(tmp_path / "runs", "--base", "x")  # two rows start with x (and none is named x)
    assert proc.returncode == 2 and "more than one row matches 'x'" in proc.stderr


def test_bad_input_is_an_error_naming_it(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = compare(tmp_path / "empty")
    assert proc.returncode == 2 and "empty: neither a run folder" in proc.stderr
    write_run(tmp_path / "r", [10.0], name="r")
    proc = compare(tmp_path / "r", "--base", "nope")
    assert proc.returncode == 2 and "no row named 'nope'" in proc.stderr
