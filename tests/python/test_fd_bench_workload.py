"""`fd-bench workload`: a config's requests as JSONL, exactly as `fd-bench run` makes them.

The prompts, ids and lengths must equal what a reference-engine run of the same config records in its
requests.jsonl (random workload, Poisson arrivals, and a prompts file with a per-request sampling line);
"sampling" and "forced" appear only on the requests that have their own; bad input exits 2 as `run` does.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
MODELS = REPO_ROOT / "experiments" / "models"


@pytest.fixture(scope="module")
def fd_bench():
    """fd-bench only (this module needs no other program); the skip / FD_REQUIRE_BINARIES rule of conftest."""
    d = Path(os.environ.get("FD_BIN_DIR") or REPO_ROOT / "build" / "default" / "bin")
    p = d / "fd-bench"
    if not os.access(p, os.X_OK):
        reason = f"fd-bench not found in {d} (build it or set FD_BIN_DIR)"
        if os.environ.get("FD_REQUIRE_BINARIES", "") not in ("", "0"):
            pytest.fail(reason + " [FD_REQUIRE_BINARIES is set]", pytrace=False)
        pytest.skip(reason)
    return str(p)


def bench(fd_bench, *args, check=True):
    proc = subprocess.run([fd_bench, *map(str, args)], capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        pytest.fail(f"fd-bench {' '.join(map(str, args))} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def config(tmp_path, **workload):
    cfg = {"name": "wl", "model": {"config": str(MODELS / "tiny-llama-gqa.json"), "weights": {"seed": 2, "dtype": "bf16"}},
           "workload": {"requests": 6, "prompt_len": {"dist": "uniform", "min": 3, "max": 12},
                        "gen_len": {"dist": "uniform", "min": 2, "max": 7}, "seed": 5, **workload},
           "engine": {"type": "reference", "threads": 1}}
    p = tmp_path / "wl.json"
    p.write_text(json.dumps(cfg))
    return p


def compare_with_run(fd_bench, tmp_path, cfg, *sets):
    out = tmp_path / "requests.jsonl"
    bench(fd_bench, "workload", cfg, *sets, "-o", out)
    wl = jsonl(out)
    bench(fd_bench, "run", cfg, *sets, "--out", tmp_path / "run", "--quiet")
    ran = {r["id"]: r for r in jsonl(tmp_path / "run" / "requests.jsonl")}
    assert [r["id"] for r in wl] == sorted(ran) == list(range(len(ran)))
    for r in wl:
        assert r["prompt"] == ran[r["id"]]["prompt"], r["id"]
        assert r["gen_len"] == ran[r["id"]]["output_len"], r["id"]  # no stop_at_eos: every request runs its length
        # requests.jsonl keeps whole nanoseconds of the arrival
        assert abs(r["arrival_s"] * 1e3 - ran[r["id"]]["arrival_ms"]) < 1e-5, r["id"]
    return wl


def test_random_workload_equals_the_run(fd_bench, tmp_path):
    wl = compare_with_run(fd_bench, tmp_path, config(tmp_path))
    assert len({len(r["prompt"]) for r in wl}) > 1 and len({r["gen_len"] for r in wl}) > 1  # lengths drawn, not fixed
    for r in wl:
        assert set(r) == {"id", "arrival_s", "prompt", "gen_len", "stop_at_eos"}  # no sampling / forced of their own
        assert r["arrival_s"] == 0.0 and r["stop_at_eos"] is False


def test_poisson_arrivals_and_set_overrides(fd_bench, tmp_path):
    cfg = config(tmp_path, arrival="poisson", rate=2000.0)
    wl = compare_with_run(fd_bench, tmp_path, cfg, "--set", "workload.requests=4", "--set", "workload.seed=9")
    assert len(wl) == 4
    times = [r["arrival_s"] for r in wl]
    assert times == sorted(times) and times[-1] > 0


def test_prompts_file_sampling_and_forced(fd_bench, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": [5, 6, 7], "gen_len": 3}\n{"prompt": [8, 9], "gen_len": 2, "temperature": 0.7, "top_k": 5}\n')
    cfg = json.loads(config(tmp_path).read_text())
    cfg["workload"] = {"prompts": str(prompts)}
    cfg["sampling"] = {"seed": 3}
    p = tmp_path / "prompts.json"
    p.write_text(json.dumps(cfg))
    wl = compare_with_run(fd_bench, tmp_path, p)
    assert [r["prompt"] for r in wl] == [[5, 6, 7], [8, 9]]
    assert "sampling" not in wl[0]
    assert wl[1]["sampling"] == {"temperature": 0.7, "top_k": 5, "top_p": 1.0, "seed": 3}  # merged over the run's
    score = tmp_path / "s.jsonl"
    score.write_text('{"prompt": [5, 6, 7], "continuation": [11, 12]}\n')
    cfg["workload"] = {"score": str(score)}
    p.write_text(json.dumps(cfg))
    (r,) = [json.loads(line) for line in bench(fd_bench, "workload", p).stdout.splitlines()]
    assert r["forced"] == [11, 12] and r["gen_len"] == 2 and r["stop_at_eos"] is False


def test_stdout_equals_file(fd_bench, tmp_path):
    cfg = config(tmp_path)
    bench(fd_bench, "workload", cfg, "--out", tmp_path / "a.jsonl")
    assert bench(fd_bench, "workload", cfg).stdout == (tmp_path / "a.jsonl").read_text()


@pytest.mark.parametrize("sets, expect", [
    (["--set", "workload.requests=0"], "requests"),
    (["--set", "workload.requests.x=1"], "workload.requests is not an object"),
    (["--set", "workload.bogus=1"], "bogus"),
    (["--set", "noequals"], "="),
])
def test_bad_set_exits_2(fd_bench, tmp_path, sets, expect):
    out = tmp_path / "never.jsonl"
    proc = bench(fd_bench, "workload", config(tmp_path), *sets, "-o", out, check=False)
    assert proc.returncode == 2, proc.stderr
    assert expect in proc.stderr
    assert not out.exists()


def test_help_names_the_fields(fd_bench):
    text = bench(fd_bench, "workload", "--help").stdout
    for word in ('"arrival_s"', '"gen_len"', '"stop_at_eos"', '"sampling"', '"forced"', "--set", "--out"):
        assert word in text
