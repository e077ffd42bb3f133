"""fd-bench run with tensor and pipeline parallelism (experiments/parallel/tiny-llama-tp2-pp2.json), as a user
runs it: the run folder names every rank and its R-worker group, the trace has a track per rank and per group's
worker, the breakdown carries the hand-off time, the tokens are the same greedy tokens as the same config at
T = P = 1 (tiny-llama: no near-tie flips at this length, test_fastdecode_parallel.cpp judges them in general),
and bad parallel settings exit 2 naming the key before anything is spawned."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "experiments" / "parallel" / "tiny-llama-tp2-pp2.json"


def bench(fd_bin, *args, check=True):
    proc = subprocess.run([fd_bin("fd-bench"), *map(str, args)], capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        pytest.fail(f"fd-bench {' '.join(map(str, args))} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def read_jsonl(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_tp2_pp2_run_folder(fd_bin, tmp_path):
    p = bench(fd_bin, "run", CONFIG, "--out", tmp_path / "tp", "--quiet", check=False)
    if p.returncode == 2 and "this build has no Gloo communicator" in p.stderr:
        if os.environ.get("FD_REQUIRE_BINARIES", "") not in ("", "0"):
            pytest.fail("fd-bench was built without Gloo (libgloo-dev) and FD_REQUIRE_BINARIES is set")
        pytest.skip("fd-bench was built without Gloo (libgloo-dev): tensor parallelism is refused")
    assert p.returncode == 0, p.stderr
    bench(fd_bin, "run", CONFIG, "--out", tmp_path / "one", "--quiet", "--set", "engine.parallel.tensor=1",
          "--set", "engine.parallel.pipeline=1")
    s = json.loads((tmp_path / "tp" / "summary.json").read_text())
    info = s["engine_info"]
    assert info["parallel"]["tensor"] == 2 and info["parallel"]["pipeline"] == 2
    assert info["parallel"]["comm"]["tensor"].startswith("gloo")
    ranks = info["ranks"]
    assert sorted((r["t"], r["p"]) for r in ranks) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in ranks:
        assert r["heads"] == 1 and r["kv_heads"] == 1 and r["layers"] == [r["p"], r["p"] + 1]
        assert len(r["rworkers"]) == 2
    # Each group's workers hold one KV head's bytes per token and layer: half of the whole model's.
    whole = json.loads((tmp_path / "one" / "summary.json").read_text())["engine_info"]["rworkers"][0]["hello"]
    for r in ranks:
        assert all(2 * w["hello"]["kv_bytes_per_token_per_layer"] == whole["kv_bytes_per_token_per_layer"]
                   for w in r["rworkers"]), r["rworkers"]
    assert len({w["endpoint"] for r in ranks for w in r["rworkers"]}) == 8  # no group shares a worker
    steps = read_jsonl(tmp_path / "tp" / "steps.jsonl")
    assert all("comm" in x["breakdown_ms"] for x in steps)
    trace = json.loads((tmp_path / "tp" / "trace.json").read_text())
    tracks = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"s-part t0 p0", "s-part t1 p0", "s-part t0 p1", "s-part t1 p1", "comm t0 p1"} <= tracks, tracks
    assert {"rworker g%d.%d" % (g, w) for g in range(4) for w in range(2)} <= tracks, tracks
    tok = lambda d: [r["tokens"] for r in read_jsonl(tmp_path / d / "requests.jsonl")]  # noqa: E731
    assert tok("tp") == tok("one")
    assert "ranks" not in json.loads((tmp_path / "one" / "summary.json").read_text())["engine_info"]


@pytest.mark.parametrize("sets,key", [
    (["engine.parallel.tensor=3"], "engine.parallel.tensor"),            # 2 heads: 3 does not divide them
    (["engine.parallel.pipeline=3"], "engine.parallel.pipeline"),        # 2 layers
    (["engine.parallel.layers=[2,1]"], "engine.parallel.layers"),        # 3 layers for a 2-layer model
    (["engine.parallel.sideways=1"], "engine.parallel.sideways"),        # unknown key
    (["engine.parallel.devices=[0,0,0,0]"], "engine.parallel.devices"),  # GPUs of the ranks: cuda only
    (["engine.parallel.comm=nccl"], "engine.parallel.comm"),             # NCCL moves GPU buffers
    (["engine.parallel.waves=8"], "engine.parallel.waves"),              # 8 x 2 mini-batches: more than 15 slots
    (["engine.rworkers.groups=[{}]"], "engine.rworkers.groups"),         # 4 ranks, 1 group
    (['engine.rworkers.groups=[{},{},{},{"endpoints":["tcp://127.0.0.1:9"]}]'], "engine.rworkers.groups"),  # 2, 2, 2, 1
    (['engine.rworkers.groups=[{},{},{},{"endpoints":["tcp://127.0.0.1:9"],"threads":2}]'],
     "engine.rworkers.groups[3].threads"),                               # threads of a listed group
])
def test_bad_parallel_settings_exit_2(fd_bin, tmp_path, sets, key):
    args = []
    for s in sets:
        args += ["--set", s]
    p = bench(fd_bin, "run", CONFIG, "--out", tmp_path / "bad", "--quiet", *args, check=False)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert key in p.stderr, p.stderr
    assert "listening" not in p.stderr  # refused before any R-worker was spawned
