"""fd-bench profile --service end to end on the CPU (spawned R-workers, real ATTEND rounds): every grid row says where
the busiest worker's ATTEND time goes (its STATS attend_parts_s over the measured steps) and sets it beside the kernel
alone on the same bytes and cores (issue 43: a replay in the profiling process, pinned as the workers are): the parts
add up to the worker's compute, and the ratios are those numbers'.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

MODEL = Path(__file__).resolve().parents[2] / "experiments" / "models" / "tiny-llama.json"
PARTS = ("prepare", "append", "query", "kernel", "output")
LOOP = ("wait", "receive", "handle", "send")


@pytest.fixture(scope="module")
def profile(fd_bin_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("svc") / "profile.json"
    cmd = [str(Path(fd_bin_dir) / "fd-bench"), "profile", "--backend", "cpu", "--model", str(MODEL), "--kv-dtypes", "fp16",
           "--r-threads", "1", "--batches", "1", "4", "--service", "--rworkers", "2", "--rworker-threads", "1", "--no-pin",
           "--service-batches", "4", "8", "--contexts", "64", "128", "--reps", "2", "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(out.read_text())


def test_each_row_splits_the_busiest_workers_time(profile):
    svc = profile["r_service"]
    assert len(svc["rows"]) == 4 and "busiest_parts_s_per_layer" in svc["method"]
    r = profile["r_s_per_token_layer"]["fp16"]
    for row in svc["rows"]:
        parts = row["busiest_parts_s_per_layer"]
        assert set(parts) == set(PARTS) | {"compute"} | {"loop_" + k for k in LOOP}
        assert all(parts[k] >= 0 for k in PARTS + tuple("loop_" + k for k in LOOP)) and parts["kernel"] > 0
        assert sum(parts[k] for k in PARTS) == pytest.approx(parts["compute"], rel=1e-6)
        # The loop's handling holds the handler's compute (measured inside it), and the lane's work besides.
        assert parts["loop_handle"] >= parts["compute"]
        # The busiest worker holds ceil(B / 2) sequences; their mean context over the 2 measured steps is S + 3.
        assert row["busiest_worker_tokens"] == -(-row["batch"] // 2) * (row["context"] + 3)
        # The model's view: the profile's kernel R (per CPU, one context) x the worker's tokens / its threads.
        assert row["r_kernel_s_per_layer"] == pytest.approx(r / 1 * row["busiest_worker_tokens"], rel=1e-12)
        # The replay's kernel alone: its busiest worker at least its mean, and the ratios are those numbers'.
        alone = row["kernel_alone_s_per_layer"]
        assert alone > 0 and alone >= row["kernel_alone_mean_s_per_layer"] > 0
        assert row["kernel_in_service_over_alone"] == pytest.approx(parts["kernel"] / alone, rel=1e-12)
        assert row["compute_over_kernel_alone"] == pytest.approx(parts["compute"] / alone, rel=1e-12)
        assert row["round_over_kernel_alone"] == pytest.approx(row["round_s_per_layer"] / alone, rel=1e-12)
    # The replay holds the row's bytes: the busiest worker's ceil(B / 2) sequences of context + 2 + reps tokens (the
    # mean over the measured steps), a replay of other shapes (e.g. always the first row's) fails this.
    for row in svc["rows"]:
        assert row["kernel_alone_busiest_tokens"] == -(-row["batch"] // 2) * (row["context"] + 2 + 2)


def test_one_context_keeps_its_rows_without_a_fit(fd_bin_dir, tmp_path):
    # One context: B·S is proportional to B, so the fit is undetermined. The rows measured are kept and the fit says
    # why it is missing (it once threw after the whole grid had run, and nothing was written).
    out = tmp_path / "p.json"
    cmd = [str(Path(fd_bin_dir) / "fd-bench"), "profile", "--backend", "cpu", "--model", str(MODEL), "--kv-dtypes", "fp16",
           "--r-threads", "1", "--batches", "1", "--service", "--rworkers", "2", "--rworker-threads", "1", "--no-pin",
           "--service-batches", "4", "8", "16", "--contexts", "64", "--reps", "1", "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    svc = json.loads(out.read_text())["r_service"]
    assert [r["batch"] for r in svc["rows"]] == [4, 8, 16]
    assert "do not determine the fit" in svc["fit"]["fp16"]["error"]
