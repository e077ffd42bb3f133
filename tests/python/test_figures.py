"""analysis/figures.py from outside: the five PNGs from the committed artifacts (default --artifacts, run from
the repository root), fig11 from fd-sim output folders (--sim-dir), and "skipped figN: why" lines instead of
a crash when inputs are missing (exit 1 when nothing was written).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "analysis" / "figures.py"
ARTIFACTS = REPO_ROOT / "artifacts" / "sworker" / "gpu-machine"
PROFILE = ARTIFACTS / "profile_llama-2-7b_cuda_r12.json"
FIGS = {
    "fig3": "fig3_spart_vs_gemm.png",
    "fig9": "fig9_throughput.png",
    "fig15": "fig15_step_breakdown.png",
    "fig13": "fig13_rworker_scaling.png",
    "fig11": "fig11_per_step_latency.png",
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def figures(*args, cwd=REPO_ROOT):
    proc = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=cwd)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def check_png(path: Path):
    assert path.is_file(), f"{path} not written"
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert len(data) > 10_000, f"{path} is only {len(data)} bytes"


def written(proc):
    return [line[len("wrote "):] for line in proc.stdout.splitlines() if line.startswith("wrote ")]


def skipped(proc):
    return {line.split(":")[0][len("skipped "):] for line in proc.stdout.splitlines() if line.startswith("skipped ")}


def test_all_figures_from_committed_artifacts(tmp_path):
    out = tmp_path / "figs"
    proc = figures("--out", out)  # default --artifacts, relative to the repository root
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not skipped(proc), proc.stdout
    assert sorted(Path(p).name for p in written(proc)) == sorted(FIGS.values())
    for name in FIGS.values():
        check_png(out / name)


def test_fig11_from_fd_sim_folders(tmp_path, fd_bin):
    sim = tmp_path / "sim"
    sim.mkdir()
    common = ["--batch", 64, "--seq", 64, "--requests", 128, "--profile", PROFILE, "--rworkers", 1]
    for name, mode in (("all-at-once", ["--mode", "all-at-once"]), ("fixed-interval", ["--mode", "fixed-interval", "--interval", 8])):
        subprocess.run([fd_bin("fd-sim"), *map(str, mode + common), "--out", str(sim / name)], check=True,
                       capture_output=True, timeout=60)
    out = tmp_path / "figs"
    proc = figures("--artifacts", ARTIFACTS, "--sim-dir", sim, "--out", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not skipped(proc), proc.stdout
    for name in FIGS.values():
        check_png(out / name)

    # fd-sim without cost flags has no step times: fig11 is skipped with the reason, the rest still written.
    untimed = tmp_path / "untimed"
    untimed.mkdir()
    subprocess.run([fd_bin("fd-sim"), "--mode", "all-at-once", "--batch", "8", "--seq", "8", "--out", str(untimed / "a")],
                   check=True, capture_output=True, timeout=60)
    proc = figures("--artifacts", ARTIFACTS, "--sim-dir", untimed, "--out", tmp_path / "figs2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert skipped(proc) == {"fig11"}, proc.stdout
    assert "no step times" in proc.stdout
    assert len(written(proc)) == 4


def test_missing_inputs_are_skipped_not_a_crash(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "figs"
    proc = figures("--artifacts", empty, "--out", out)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert skipped(proc) == set(FIGS), proc.stdout
    assert not written(proc)
    assert not list(out.glob("*.png"))

    # Unusable inputs are skipped with the reason too.
    (empty / "e2e.json").write_text("[]")
    (empty / "validation.json").write_text("{not json")
    proc = figures("--artifacts", empty, "--sim-dir", tmp_path / "no-such-dir", "--out", out)
    assert proc.returncode == 1, proc.stdout
    assert "skipped fig9: e2e.json has no runs" in proc.stdout
    assert "skipped fig13: " in proc.stdout and "not valid JSON" in proc.stdout
    assert "skipped fig11: --sim-dir" in proc.stdout

    # Some inputs: the figures that have theirs are written, exit 0.
    (empty / "spart_llama-2-7b.json").write_bytes((ARTIFACTS / "spart_llama-2-7b.json").read_bytes())
    proc = figures("--artifacts", empty, "--out", out)
    assert proc.returncode == 0, proc.stdout
    assert skipped(proc) == set(FIGS) - {"fig3"}
    check_png(out / FIGS["fig3"])
