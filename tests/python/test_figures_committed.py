"""CI regenerates the figures from the committed artifacts: analysis/figures.py --strict on the inputs it
uses by default (artifacts/sworker/gpu-machine) plus the committed baseline grids, into tmp_path. Every
expected figure must be written as PNG and PDF; a missing or unusable input makes figures.py exit 1 (with
--strict) and so fails this test, it is not skipped. Needs matplotlib, no binaries.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REQUIRE = os.environ.get("FD_REQUIRE_BINARIES", "") not in ("", "0")
try:
    import matplotlib  # noqa: F401
except ImportError as e:  # same rule as test_figures.py
    if not REQUIRE:
        pytest.skip(f"matplotlib cannot be imported ({e}): the committed figures are not regenerated", allow_module_level=True)
    raise

REPO_ROOT = Path(__file__).resolve().parents[2]
BASELINES = ["artifacts/baselines/run1-a40a146", "artifacts/baselines/run3-4bf4e28"]
PAPER = "artifacts/paper/runs"  # the GPU machine's runs (its README: which call measured which folder)
EXPECTED = ["fig1_kv_memory", "spart_vs_gemm", "e2e_throughput", "fig15_step_breakdown", "rworker_scaling_model",
            "per_step_latency", "fig9_baselines_throughput", "fig10_token_latency",
            "fig3_dilemma", "fig8_layers", "fig11_sls_measured", "fig13_scaling"]
MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "pdf": b"%PDF-"}


def figures(*args):
    return subprocess.run([sys.executable, str(REPO_ROOT / "analysis" / "figures.py"), *map(str, args)], capture_output=True,
                          text=True, timeout=300, cwd=REPO_ROOT)


def test_every_figure_regenerates_from_committed_artifacts(tmp_path):
    for b in BASELINES + [PAPER]:
        assert (REPO_ROOT / b).is_dir(), f"committed input {b} is missing"
    # default --artifacts and --format png,pdf; --paper also gives fig15 its timeline (the sweep's trace.json)
    proc = figures("--out", tmp_path, "--strict", "--baselines", *BASELINES, "--paper", PAPER)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wrote = sorted(Path(l[len("wrote "):]).name for l in proc.stdout.splitlines() if l.startswith("wrote "))
    assert wrote == sorted(f"{n}.{fmt}" for n in EXPECTED for fmt in MAGIC), proc.stdout
    for n in EXPECTED:
        for fmt, magic in MAGIC.items():
            data = (tmp_path / f"{n}.{fmt}").read_bytes()
            assert data.startswith(magic) and len(data) > 10_000, f"{n}.{fmt}"


def test_a_missing_input_fails_with_strict(tmp_path):
    """What makes the test above fail rather than skip: --strict exits 1 naming the figure and its input."""
    empty = tmp_path / "empty-artifacts"
    empty.mkdir()
    proc = figures("--out", tmp_path / "out", "--strict", "--artifacts", empty, "--format", "png")
    assert proc.returncode == 1, proc.stdout
    missing = {l.split(":")[0][len("missing "):] for l in proc.stdout.splitlines() if l.startswith("missing ")}
    assert missing == {"fig3", "fig9", "fig15", "fig13", "fig11"}, proc.stdout
    assert f"missing fig13: {empty}/validation.json not found" in proc.stdout
    # without --strict the same run exits 0: fig1 (computed from experiments/models) was written
    assert figures("--out", tmp_path / "out2", "--artifacts", empty, "--format", "png").returncode == 0
