"""analysis/rworker_service.py (issue 43): the verdict of a service row against its kernel alone, from synthetic
profiles with hand-computed expectations (both outcomes, and the boundary), and the committed report regenerated from
its committed profiles byte for byte.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "analysis"))
import rworker_service as rs  # noqa: E402

COMMITTED = ROOT / "artifacts" / "rworker" / "service"
HUGE_PAGES = ROOT / "artifacts" / "rworker" / "devvm-hugepages"  # the dev VM's huge-page A/B (its ABOUT.md)
STREAM = ROOT / "artifacts" / "rworker" / "gpu-machine-stream-append-e885ccc"  # streaming-store appends (its ABOUT.md)


def profile(rows, workers=5, threads=3):
    return {"provenance": {"command": "fd-bench profile --model experiments/models/llama-2-7b.json --service",
                           "cpu_model": "X", "cpu_cores": 16, "gpus": [], "git_commit": "abc", "date_utc": "d"},
            "r_service": {"workers": workers, "threads": threads, "pinned": True, "shm": True, "rows": rows}}


def row(compute_ms, alone_ms, kernel_ms=None, round_ms=None, b=256, s=1024):
    kernel_ms = compute_ms if kernel_ms is None else kernel_ms
    parts = {"prepare": 0.0, "append": 0.0, "query": 0.0, "kernel": kernel_ms / 1e3, "output": 0.0,
             "compute": compute_ms / 1e3, "loop_wait": 0.0, "loop_receive": 0.0, "loop_handle": compute_ms / 1e3,
             "loop_send": 0.0}
    parts["append"] = (compute_ms - kernel_ms) / 1e3
    return {"kv_dtype": "fp16", "batch": b, "context": s, "round_s_per_layer": (round_ms or compute_ms) / 1e3,
            "busiest_compute_s_per_layer": compute_ms / 1e3, "busiest_parts_s_per_layer": parts,
            "kernel_alone_s_per_layer": alone_ms / 1e3 if alone_ms is not None else None}


def test_verdicts_from_hand_computed_ratios():
    recs = rs.records(profile([row(10.0, 10.0), row(11.0, 10.0), row(11.2, 10.0, kernel_ms=10.1, round_ms=14.0),
                               row(5.0, None)]), "p.json")
    assert [r["verdict"] for r in recs] == ["meets", "meets", "misses", "no kernel-alone replay"]
    assert recs[2]["compute_over_kernel_alone"] == pytest.approx(1.12)
    assert recs[2]["kernel_in_service_over_alone"] == pytest.approx(1.01)
    assert recs[2]["round_over_kernel_alone"] == pytest.approx(1.4)
    assert recs[2]["parts_ms"]["append"] == pytest.approx(1.1)
    assert recs[0]["model"] == "llama-2-7b" and recs[0]["workers"] == 5


def test_report_counts_and_names_the_worst_row():
    md, data = rs.report([("a.json", profile([row(10.0, 10.0, b=16, s=128), row(13.0, 10.0, b=64, s=4096)]))])
    assert data["rows_meeting"] == 1 and data["rows_judged"] == 2
    assert "**1 of 2 rows meet it**" in md and "B = 64, S = 4096: 1.30×" in md
    assert data["criterion_compute_over_kernel_alone_max"] == rs.CRITERION == 1.10


def test_a_profile_without_a_service_section_is_refused(tmp_path):
    p = tmp_path / "plain.json"
    p.write_text(json.dumps({"t_b": []}))
    r = subprocess.run([sys.executable, str(ROOT / "analysis" / "rworker_service.py"), str(p)], capture_output=True,
                       text=True)
    assert r.returncode == 2 and "no r_service section" in r.stderr


@pytest.mark.parametrize("committed", [COMMITTED, HUGE_PAGES, STREAM], ids=["service", "devvm-hugepages", "stream-append"])
def test_the_committed_report_is_current(tmp_path, committed):
    profiles = sorted((committed / "profiles").glob("*.json"))
    assert profiles, f"{committed}/profiles/ holds the profiles the report is made from"
    subprocess.run([sys.executable, str(ROOT / "analysis" / "rworker_service.py"), *map(str, profiles), "--out-dir",
                    str(tmp_path)], check=True)
    for name in ("README.md", "service.json"):
        assert (tmp_path / name).read_text() == (committed / name).read_text(), name
