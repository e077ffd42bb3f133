"""fd-bench sweep end to end on the CPU with the tiny model (reference engine).

A 2x2 product x 2 repeats makes 8 run folders whose summaries match index.json; runs go in interleaved
order (rep 1 of every point, then rep 2); a resumed sweep reruns only the run whose summary.json is gone;
a bad value in any point is refused before anything runs; a point that fails at run time is recorded and
the others run; --dry-run writes nothing; finished runs made with other overrides are refused; --quick runs
the spec's quick variant.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

BASE = {
    "name": "tiny-sweep",
    "model": {"config": "MODELS/tiny-llama-gqa.json", "weights": {"seed": 2, "dtype": "bf16"}},
    "workload": {"requests": 3, "prompt_len": 4, "gen_len": 3, "seed": 4},
    "engine": {"type": "reference", "threads": 1},
}

# model.layers x the reference engine's KV dtype; tiny-llama-gqa has 3 layers.
SPEC = {
    "name": "tiny-grid",
    "base": "base.json",
    "set": ["workload.requests=2"],
    "axes": [
        {"key": "model.layers", "values": [1, 2]},
        {"key": "engine.kv_dtype", "values": ["fp32", "fp16"], "name": "kv"},
    ],
    "repeats": 2,
}
POINTS = ["layers-1_kv-fp32", "layers-1_kv-fp16", "layers-2_kv-fp32", "layers-2_kv-fp16"]

PROGRESS = re.compile(r"^\[(\d+)/(\d+)\] (\S+) rep (\d+)/(\d+): (.*); elapsed \S+, ETA \S+$")


def write_sweep(d: Path, models_dir: Path, spec: dict, base: dict = BASE) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "base.json").write_text(json.dumps(base).replace("MODELS", str(models_dir)))
    (d / "spec.json").write_text(json.dumps(spec))
    return d / "spec.json"


def sweep(fd_bin, *args):
    return subprocess.run([fd_bin("fd-bench"), "sweep", *map(str, args)], capture_output=True, text=True, timeout=300)


def progress(stderr: str):
    """(point, rep, what) per progress line, in order."""
    out = []
    for line in stderr.splitlines():
        m = PROGRESS.match(line)
        if m:
            out.append((m.group(3), int(m.group(4)), m.group(6)))
    return out


@pytest.fixture(scope="module")
def grid(fd_bin, models_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")
    spec = write_sweep(d, models_dir, SPEC)
    proc = sweep(fd_bin, spec, "--out", d / "out")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return d, proc


def test_product_times_repeats_makes_every_folder(grid):
    d, _ = grid
    out = d / "out"
    folders = sorted(str(p.parent.relative_to(out)) for p in out.glob("*/rep*/summary.json"))
    assert folders == sorted(f"{p}/rep{r}" for p in POINTS for r in (1, 2))
    assert sorted(p.name for p in out.iterdir()) == sorted(POINTS + ["index.json"])


def test_index_agrees_with_the_summaries(grid):
    d, proc = grid
    out = d / "out"
    index = json.loads((out / "index.json").read_text())
    assert index["sweep"] == "tiny-grid"
    assert index["spec"]["base"] == str(d / "base.json")
    assert index["spec"]["repeats"] == 2 and index["spec"]["order"] == "interleaved"
    assert index["spec_file"] == str(d / "spec.json")
    assert "sweep" in index["command"] and "git_commit" in index["provenance"]
    assert [p["name"] for p in index["points"]] == POINTS
    for p in index["points"]:
        layers, kv = p["values"]["layers"], p["values"]["kv"]
        assert p["overrides"] == ["workload.requests=2", f"model.layers={layers}", f'engine.kv_dtype="{kv}"']
        assert [r["rep"] for r in p["runs"]] == [1, 2]
        for r in p["runs"]:
            assert r["status"] == "ok" and r["dir"] == f"{p['name']}/rep{r['rep']}"
            s = json.loads((out / r["dir"] / "summary.json").read_text())
            # The point's overrides made this run: echoed by the run and seen in its resolved config.
            assert s["overrides"] == p["overrides"]
            assert s["config"]["model"]["layers"] == layers == s["model"]["layers"]
            assert s["config"]["engine"]["kv_dtype"] == kv
            assert s["results"]["num_requests"] == 2
            res = s["results"]
            h = r["headline"]
            assert r["wall_s"] >= res["duration_s"] > 0  # the run's wall time includes its engine's steps
            assert h["output_throughput"] == res["output_throughput"]
            assert h["step_ms.p99"] == res["step_ms"]["p99"]
            assert h["ttft_ms.p50"] == res["ttft_ms"]["p50"]
            if "decode_only" in res:
                assert h["decode_only.tokens_per_s"] == res["decode_only"]["tokens_per_s"]
                assert h["decode_only.step_ms.p99"] == res["decode_only"]["step_ms"]["p99"]
            if "steady" in res:
                assert h["steady.tokens_per_s"] == res["steady"]["tokens_per_s"]
                assert h["steady.mean_batch"] == res["steady"]["mean_batch"]


def test_runs_are_interleaved(grid):
    _, proc = grid
    lines = progress(proc.stderr)
    assert [(p, r) for p, r, _ in lines] == [(p, r) for r in (1, 2) for p in POINTS]
    assert all("tokens/s" in what for _, _, what in lines)


def test_grouped_order(fd_bin, models_dir, tmp_path):
    spec = write_sweep(tmp_path, models_dir, {**SPEC, "axes": SPEC["axes"][:1], "order": "grouped"})
    proc = sweep(fd_bin, spec, "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert [(p, r) for p, r, _ in progress(proc.stderr)] == [("layers-1", 1), ("layers-1", 2), ("layers-2", 1), ("layers-2", 2)]


def test_resume_reruns_only_the_unfinished_run(fd_bin, models_dir, tmp_path):
    spec = write_sweep(tmp_path, models_dir, SPEC)
    out = tmp_path / "out"
    assert sweep(fd_bin, spec, "--out", out, "--quiet").returncode == 0
    before = {p: p.read_text() for p in out.glob("*/rep*/summary.json")}
    killed = out / "layers-2_kv-fp32" / "rep1"
    (killed / "summary.json").unlink()  # as a run killed before it wrote its summary
    proc = sweep(fd_bin, spec, "--out", out)
    assert proc.returncode == 0, proc.stderr
    lines = progress(proc.stderr)
    ran = [(p, r) for p, r, what in lines if not what.startswith("skipped")]
    assert ran == [("layers-2_kv-fp32", 1)]
    assert len(lines) == 8
    # The cut-short folder was kept aside; the other runs are untouched.
    assert (out / "layers-2_kv-fp32" / "rep1.incomplete-1" / "steps.jsonl").exists()
    assert (killed / "summary.json").exists()
    for p, text in before.items():
        if p.parent != killed:
            assert p.read_text() == text
    index = json.loads((out / "index.json").read_text())
    status = {(p["name"], r["rep"]): r["status"] for p in index["points"] for r in p["runs"]}
    assert status.pop(("layers-2_kv-fp32", 1)) == "ok"
    assert set(status.values()) == {"skipped-existing"} and len(status) == 7
    # Skipped runs still carry their numbers (and no wall time of this invocation).
    for p in index["points"]:
        for r in p["runs"]:
            assert ("wall_s" in r) == (r["status"] == "ok")
            s = json.loads((out / r["dir"] / "summary.json").read_text())
            assert r["headline"]["output_throughput"] == s["results"]["output_throughput"]


def test_bad_value_in_a_point_is_refused_before_anything_runs(fd_bin, models_dir, tmp_path):
    bad = {**SPEC, "axes": [{"key": "model.layers", "values": [1, 2, 7]}, SPEC["axes"][1]]}  # 7 > 3 layers
    spec = write_sweep(tmp_path, models_dir, bad)
    proc = sweep(fd_bin, spec, "--out", tmp_path / "out")
    assert proc.returncode == 2
    assert "point layers-7_kv-fp32" in proc.stderr and "model.layers" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_failing_point_is_recorded_and_the_others_run(fd_bin, models_dir, tmp_path):
    # A FastDecode engine whose R-worker program does not exist: parsed fine, fails when the run starts it.
    broken = {"type": "fastdecode", "backend": "cpu", "rworkers": {"spawn": 1, "binary": str(tmp_path / "no-rworker")}}
    spec_d = {**SPEC, "repeats": 1, "axes": [{"key": "engine", "values": [broken, BASE["engine"]], "name": "eng"}]}
    spec = write_sweep(tmp_path, models_dir, spec_d)
    proc = sweep(fd_bin, spec, "--out", tmp_path / "out")
    assert proc.returncode == 1, proc.stderr
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    first, second = index["points"]
    assert first["runs"][0]["status"] == "failed"
    assert "no-rworker" in first["runs"][0]["error"]
    assert "headline" not in first["runs"][0]
    assert second["runs"][0]["status"] == "ok"
    assert (tmp_path / "out" / second["runs"][0]["dir"] / "summary.json").exists()
    # Run again: the failed run (its folder empty) is run again, not kept aside; the finished one is skipped.
    proc = sweep(fd_bin, spec, "--out", tmp_path / "out")
    assert proc.returncode == 1
    assert [what.split(" ")[0] for _, _, what in progress(proc.stderr)] == ["FAILED", "skipped,"]
    # an error before the run's first step leaves no run folder (the failure is in index.json)
    assert sorted(x.name for x in (tmp_path / "out" / first["name"]).iterdir()) == []
    # --fail-fast stops at the failure (the finished second point would be skipped, not run, anyway).
    proc = sweep(fd_bin, spec, "--out", tmp_path / "ff", "--fail-fast")
    assert proc.returncode == 1
    assert len(progress(proc.stderr)) == 1 and "fail-fast" in proc.stderr
    index = json.loads((tmp_path / "ff" / "index.json").read_text())
    assert [len(p["runs"]) for p in index["points"]] == [1, 0]


def test_dry_run_writes_nothing(fd_bin, models_dir, tmp_path):
    spec = write_sweep(tmp_path, models_dir, SPEC)
    proc = sweep(fd_bin, spec, "--out", tmp_path / "out", "--dry-run", "--set", "workload.seed=9")
    assert proc.returncode == 0, proc.stderr
    assert "4 points x 2 repeats = 8 runs" in proc.stdout
    for p in POINTS:
        assert p + ":" in proc.stdout
    assert "--set workload.requests=2 --set model.layers=1 --set engine.kv_dtype=\"fp32\" --set workload.seed=9" in proc.stdout
    assert not (tmp_path / "out").exists()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["base.json", "spec.json"]


def test_finished_runs_made_with_other_overrides_are_refused(fd_bin, models_dir, tmp_path):
    spec = write_sweep(tmp_path, models_dir, {**SPEC, "repeats": 1})
    out = tmp_path / "out"
    assert sweep(fd_bin, spec, "--out", out, "--quiet").returncode == 0
    index = (out / "index.json").read_text()
    # The same folder names with another "set": resuming would mix two experiments in one index.
    spec = write_sweep(tmp_path, models_dir, {**SPEC, "repeats": 1, "set": ["workload.requests=3"]})
    proc = sweep(fd_bin, spec, "--out", out)
    assert proc.returncode == 2
    assert "layers-1_kv-fp32/rep1 holds a finished run made with other overrides" in proc.stderr
    assert (out / "index.json").read_text() == index  # nothing run, nothing rewritten
    # So is a command-line --set that the finished runs were not made with.
    spec = write_sweep(tmp_path, models_dir, {**SPEC, "repeats": 1})
    assert sweep(fd_bin, spec, "--out", out, "--set", "workload.seed=5").returncode == 2
    assert sweep(fd_bin, spec, "--out", out, "--quiet").returncode == 0


def test_quick_variant(fd_bin, models_dir, tmp_path):
    spec_d = {**SPEC, "repeats": 1, "quick": {"set": ["workload.requests=1"], "values": {"kv": ["fp16"]}}}
    spec = write_sweep(tmp_path, models_dir, spec_d)
    out = tmp_path / "out"
    proc = sweep(fd_bin, spec, "--out", out, "--quick")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["index.json", "layers-1_kv-fp16", "layers-2_kv-fp16"]
    index = json.loads((out / "index.json").read_text())
    assert index["spec"]["variant"] == "quick"
    for p in index["points"]:
        assert p["overrides"][:2] == ["workload.requests=2", "workload.requests=1"]  # the quick "set" after the spec's
        s = json.loads((out / p["runs"][0]["dir"] / "summary.json").read_text())
        assert s["results"]["num_requests"] == 1
    # The full variant's same-named points are other runs: not resumed from the quick ones.
    proc = sweep(fd_bin, spec, "--out", out)
    assert proc.returncode == 2 and "made with other overrides" in proc.stderr
