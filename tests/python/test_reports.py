"""The committed GPU-machine reports are reproduced exactly by the analysis scripts from the committed
run data (no number in artifacts/ that a command in the repo does not reproduce)."""
import subprocess
import sys
from pathlib import Path

import pytest


def _artifacts(repo_root: Path) -> Path:
    d = repo_root / "artifacts" / "sworker" / "gpu-machine"
    if not (d / "e2e").is_dir():
        pytest.fail(f"{d}/e2e missing: the committed results are part of the repository")
    return d


def test_e2e_report_reproduces_the_committed_one(repo_root, tmp_path):
    d = _artifacts(repo_root)
    runs = sorted(str(p) for p in (d / "e2e").iterdir())
    subprocess.run([sys.executable, str(repo_root / "analysis" / "e2e_report.py"), *runs, "--out", str(tmp_path)],
                   check=True, capture_output=True, text=True, timeout=120)
    assert (tmp_path / "E2E_REPORT.md").read_text() == (d / "E2E_REPORT.md").read_text()


def test_validation_table_reproduces_the_committed_one(repo_root, tmp_path):
    d = _artifacts(repo_root)
    runs = sorted(str(p) for p in (d / "e2e").iterdir())
    profiles = [a for p in sorted(d.glob("profile_*_cuda_r*.json")) for a in ("--profile", str(p))]
    assert profiles, "no committed profiles"
    subprocess.run([sys.executable, str(repo_root / "analysis" / "perf_model_validation.py"), *profiles, "--out",
                    str(tmp_path), *runs], check=True, capture_output=True, text=True, timeout=120)
    assert (tmp_path / "VALIDATION.md").read_text() == (d / "VALIDATION.md").read_text()


def test_committed_profiles_load_in_the_planner(repo_root, fd_bin):
    """fd-bench plan reads every committed GPU profile (strict keys) and labels its numbers MODELLED."""
    d = _artifacts(repo_root)
    for p in sorted(d.glob("profile_*_cuda_r*.json")):
        model = "llama-3-8b" if "llama-3-8b" in p.name else "llama-2-7b"
        r = subprocess.run([fd_bin("fd-bench"), "plan", "--profile", str(p), "--model",
                            str(repo_root / "experiments" / "models" / f"{model}.json"), "--seq", "1024"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("MODELLED") and "CPUs needed" in r.stdout


def test_paper_validation_reproduces_the_committed_one(repo_root, tmp_path):
    """artifacts/paper/validation/: the model against every committed FastDecode run, with the profiles' R and with
    each run's own R plus the fill and the intercept sweep's fixed term (the command in artifacts/paper/README.md)."""
    prof = ["artifacts/sworker/gpu-machine/profile_llama-2-7b_cuda_r12.json", "artifacts/paper/runs/profile_r12_ctx528.json",
            "artifacts/sworker/gpu-machine/profile_llama-3-8b_cuda_r12.json"]
    subprocess.run([sys.executable, str(repo_root / "analysis" / "perf_model_validation.py"), "--r-from-run",
                    "--fixed-from", "artifacts/paper/runs/fig8-intercept-llama-2-7b", *[a for p in prof for a in ("--profile", p)], "--out", str(tmp_path), "--runs-under",
                    "artifacts/sworker/gpu-machine/e2e", "artifacts/baselines", "artifacts/paper/runs"],
                   check=True, capture_output=True, text=True, timeout=300, cwd=repo_root)
    committed = repo_root / "artifacts" / "paper" / "validation" / "VALIDATION.md"
    assert (tmp_path / "VALIDATION.md").read_text() == committed.read_text(), "regenerate it (artifacts/paper/README.md)"


def test_fixed_per_step_term_from_the_intercept_sweep(repo_root, tmp_path):
    """--fixed-from: a(B) = 2 * step(1 layer) - step(2 layers) per model and B of the sweep, linear in B between, held
    at the ends and at 0 from below, and added to the run-R predictions of that model only."""
    import importlib.util
    import json
    spec = importlib.util.spec_from_file_location("pmv", repo_root / "analysis" / "perf_model_validation.py")
    pmv = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(repo_root / "analysis"))
    spec.loader.exec_module(pmv)
    # a(16) = 3 ms, a(64) = 5 ms, a(256) = 2 * 40 - 82 < 0 -> 0
    for B, ms in ((16, {1: 5.0, 2: 7.0}), (64, {1: 9.0, 2: 13.0}), (256, {1: 40.0, 2: 82.0})):
        for L, step in ms.items():
            d = tmp_path / "sweep" / f"B-{B}_layers-{L}" / "rep1"
            d.mkdir(parents=True)
            (d / "summary.json").write_text(json.dumps({"config": {"workload": {"requests": B}}, "model": {"layers": L, "name": "m"}}))
            (d / "steps.jsonl").write_text("".join(json.dumps({"step": i, "step_ms": step, "prefill_tokens": 0, "decode_tokens": B}) + "\n"
                                                   for i in range(3)))
    table = pmv.fixed_table(str(tmp_path / "sweep"))
    assert list(table) == ["m"]
    pts = table["m"]
    assert [p[0] for p in pts] == [16, 64, 256] and [p[1] for p in pts] == pytest.approx([0.003, 0.005, 0.0])
    assert [pmv.fixed_at(pts, b) for b in (8, 40, 160, 1024)] == pytest.approx([0.003, 0.004, 0.0025, 0.0])
