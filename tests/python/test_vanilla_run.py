"""The vanilla baseline driven by fd-bench as a user runs it (CPU, fp32, Debian's LibTorch): the run folder's
tokens equal the fp32 reference engine's on the same workload, its static batches show in steps.jsonl (a
batch's prefill step starts only after every member of the previous batch finished), and summary.json says
how its batch is bounded. Skipped, visibly, when this build has no LibTorch (scripts/setup.sh installs it).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

CFG = {
    "name": "vanilla-cpu",
    "model": {"config": "MODELS/tiny-llama-gqa.json", "weights": {"seed": 3, "dtype": "fp16"}},
    "workload": {"requests": 7, "prompt_len": {"dist": "uniform", "min": 2, "max": 14},
                 "gen_len": {"dist": "uniform", "min": 3, "max": 11}, "seed": 5},
    "engine": {"type": "vanilla", "device": "cpu", "batch_size": 3, "threads": 1},
}


def read_jsonl(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def run(fd_bin, models_dir, d: Path, engine: dict, name: str):
    cfg = dict(CFG, engine=engine, name=name)
    path = d / f"{name}.json"
    path.write_text(json.dumps(cfg).replace("MODELS", str(models_dir)))
    return subprocess.run([fd_bin("fd-bench"), "run", str(path), "--out", str(d / name), "--quiet"],
                          capture_output=True, text=True, timeout=300)


def test_vanilla_run_matches_reference(fd_bin, models_dir, tmp_path):
    v = run(fd_bin, models_dir, tmp_path, CFG["engine"], "vanilla")
    if v.returncode != 0 and "built without LibTorch" in v.stderr:
        pytest.skip("this build has no LibTorch (libtorch-dev): the vanilla engine is not built")
    assert v.returncode == 0, v.stdout + v.stderr
    r = run(fd_bin, models_dir, tmp_path, {"type": "reference", "threads": 1}, "reference")
    assert r.returncode == 0, r.stdout + r.stderr

    want = {q["id"]: q["tokens"] for q in read_jsonl(tmp_path / "reference" / "requests.jsonl")}
    got = {q["id"]: q["tokens"] for q in read_jsonl(tmp_path / "vanilla" / "requests.jsonl")}
    assert got == want

    # Static batches of 3 in arrival (id) order: requests 0-2, 3-5, 6. A batch is prefilled in one step
    # and decodes until its longest member is done; the next batch's prefill comes after.
    steps = read_jsonl(tmp_path / "vanilla" / "steps.jsonl")
    prefill_steps = [s for s in steps if s["prefill_tokens"] > 0]
    assert len(prefill_steps) == 3
    gens = {q["id"]: len(q["tokens"]) for q in read_jsonl(tmp_path / "vanilla" / "requests.jsonl")}
    batches = [[0, 1, 2], [3, 4, 5], [6]]
    # Steps per batch: one prefill step (its first token) + the longest member's remaining tokens.
    assert len(steps) == sum(max(gens[i] for i in b) for b in batches)
    assert max(s["running"] for s in steps) <= 3

    summary = json.loads((tmp_path / "vanilla" / "summary.json").read_text())
    info = summary["engine_info"]
    assert info["device"] == "cpu" and info["dtype"] == "fp32" and info["batch_size"] == 3
    assert info["memory_bound"].startswith("none")
