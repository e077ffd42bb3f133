"""The CPU demo of SLS (experiments/sls-cpu-demo/, docs/SCHEDULING.md "A CPU demo where the R-Part binds"), fd-sim's
side: fd-sim reads each point of the demo's sweep as fd-bench runs it (--experiment with the point's schedule) and,
with the CPU profile committed beside the demo's runs, must give the outcome the docs expect: fixed-interval and
load-control hold their steady-window decode p99 at no more than 0.70 of all-at-once's, and the paced load-control
admits exactly as fixed-interval does (F divides S and B*F/S is whole). The committed predictions are what fd-sim
gives now.
"""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "experiments" / "sls-cpu-demo"
SPEC = DEMO / "sls-cpu-demo.sweep.json"
PROFILE = REPO / "artifacts" / "sls-cpu-demo" / "profile_cpu.json"
PREDICTED = REPO / "artifacts" / "sls-cpu-demo" / "predicted"
LIMIT = 0.70  # docs/SCHEDULING.md: written before the demo's first run


def points():
    """{label: schedule object} of the demo's sweep (one axis, on "schedule")."""
    spec = json.loads(SPEC.read_text())
    (axis,) = spec["axes"]
    assert axis["key"] == "schedule"
    return dict(zip(axis["labels"], axis["values"]))


@pytest.fixture(scope="module")
def predicted(fd_bin_dir, tmp_path_factory):
    if not PROFILE.is_file():
        pytest.skip(f"{PROFILE} is not in this checkout")
    out = tmp_path_factory.mktemp("demo")
    res = {}
    for label, sched in points().items():
        d = out / label
        proc = subprocess.run([str(Path(fd_bin_dir) / "fd-sim"), "--experiment", str(DEMO / json.loads(SPEC.read_text())["base"]),
                               "--set", "schedule=" + json.dumps(sched), "--profile", str(PROFILE), "--out", str(d)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        res[label] = (json.loads((d / "summary.json").read_text()), [json.loads(l) for l in (d / "steps.jsonl").read_text().splitlines()])
    return res


def test_fd_sim_predicts_the_documented_outcome(predicted):
    p99 = {k: s["results"]["steady"]["decode_step_ms"]["p99"] for k, (s, _) in predicted.items()}
    assert set(p99) == {"all-at-once", "fixed-interval", "load-control"}
    # The R-Part binds at all-at-once's peak: its late steps cost more than its early ones.
    summary, steps = predicted["all-at-once"]
    dec = [s for s in steps if s["prefill_tokens"] == 0]
    assert dec[-1]["binds"] == "R" and dec[-1]["step_ms"] > 3 * dec[0]["step_ms"]
    for mode in ("fixed-interval", "load-control"):
        assert p99[mode] <= LIMIT * p99["all-at-once"], f"{mode}: {p99[mode]:.2f} ms against all-at-once's {p99['all-at-once']:.2f}"
    key = lambda steps: [(s["step"], s["admitted"], s["total_context"]) for s in steps]
    assert key(predicted["fixed-interval"][1]) == key(predicted["load-control"][1])


def test_committed_predictions_are_current(predicted):
    for label, (summary, steps) in predicted.items():
        committed = PREDICTED / f"sched-{label}"
        old = json.loads((committed / "summary.json").read_text())
        assert old["results"] == summary["results"], f"{committed} is stale: regenerate it (artifacts/sls-cpu-demo/README.md)"
        with gzip.open(committed / "steps.jsonl.gz", "rt") as f:
            assert [json.loads(l) for l in f] == steps
