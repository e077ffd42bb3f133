"""summary.json's steady-window and decode-only statistics (harness/step_stats.h), from outside:
recomputed here from steps.jsonl alone, for an fd-bench run all at once, one with fixed-interval
admission (the window then lies after the first finish), and fd-sim on the same shape, which must write
the same fields (and, all at once, the same window).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

N_REQ, GEN = 6, 12
TINY = {
    "name": "windows",
    "model": {"config": "MODELS/tiny-llama.json", "layers": 1, "weights": {"seed": 3, "dtype": "bf16"}},
    "workload": {"requests": N_REQ, "prompt_len": {"dist": "uniform", "min": 3, "max": 12}, "gen_len": GEN, "seed": 2},
    "engine": {"type": "reference", "threads": 1},
}
DIST_KEYS = {"mean", "p1", "p50", "p90", "p99", "max", "count"}


def read_jsonl(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def run(cmd):
    proc = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def bench(fd_bin, models_dir: Path, d: Path, cfg: dict) -> Path:
    path = d / "config.json"
    path.write_text(json.dumps(cfg).replace("MODELS", str(models_dir)))
    run([fd_bin("fd-bench"), "run", path, "--out", d / "run", "--quiet"])
    return d / "run"


def distribution(v):
    v = np.asarray(v, dtype=np.float64)
    if v.size == 0:
        return {"mean": 0.0, "p1": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0, "count": 0}
    d = {f"p{q}": float(np.percentile(v, q)) for q in (1, 50, 90, 99)}
    return {**d, "mean": float(v.mean()), "max": float(v.max()), "count": int(v.size)}


def is_decode(s):
    return s["prefill_tokens"] == 0 and s["decode_tokens"] > 0


def expected(steps):
    """decode_only and steady as docs/EXPERIMENTS.md defines them, from steps.jsonl."""
    dec = [s for s in steps if is_decode(s)]
    dec_ms = sum(s["step_ms"] for s in dec)
    decode_only = {"steps": len(dec), "tokens": sum(s["decode_tokens"] for s in dec),
                   "tokens_per_s": sum(s["decode_tokens"] for s in dec) / (dec_ms / 1e3) if dec_ms else 0.0,
                   "step_ms": distribution([s["step_ms"] for s in dec])}
    last_admit = max(s["step"] for s in steps if s["started"] > 0)
    first_finish = min(s["step"] for s in steps if s["finished"] > 0)
    lo, hi = sorted((last_admit, first_finish))
    win = [s for s in steps if lo < s["step"] < hi] or steps
    ms = sum(s["step_ms"] for s in win)
    steady = {"first_step": win[0]["step"], "last_step": win[-1]["step"], "steps": len(win),
              "tokens": sum(s["new_tokens"] for s in win),
              "tokens_per_s": sum(s["new_tokens"] for s in win) / (ms / 1e3),
              "step_ms": distribution([s["step_ms"] for s in win]),
              "decode_step_ms": distribution([s["step_ms"] for s in win if is_decode(s)]),
              "mean_batch": float(np.mean([s["decode_tokens"] for s in win])),
              "mean_total_context": float(np.mean([s["total_context"] for s in win]))}
    return decode_only, steady, (last_admit, first_finish)


def assert_matches(got, want, where):
    assert set(got) - {"rule"} == set(want), where
    for k, v in want.items():
        if isinstance(v, dict):
            assert set(got[k]) == DIST_KEYS, f"{where}.{k}"
            for q, x in v.items():
                assert got[k][q] == pytest.approx(x, rel=1e-9, abs=1e-12), f"{where}.{k}.{q}"
        else:
            assert got[k] == pytest.approx(v, rel=1e-9), f"{where}.{k}"


@pytest.fixture(scope="module")
def all_at_once(fd_bin, models_dir, tmp_path_factory):
    return bench(fd_bin, models_dir, tmp_path_factory.mktemp("aao"), TINY)


def test_all_at_once_window_and_decode_only(all_at_once):
    steps = read_jsonl(all_at_once / "steps.jsonl")
    res = json.loads((all_at_once / "summary.json").read_text())["results"]
    decode_only, steady, (last_admit, first_finish) = expected(steps)
    # Everyone starts at step 0 and finishes at step GEN-1: the window is the steps in between.
    assert (last_admit, first_finish) == (0, GEN - 1)
    assert (steady["first_step"], steady["last_step"]) == (1, GEN - 2)
    assert_matches(res["decode_only"], decode_only, "decode_only")
    assert_matches(res["steady"], steady, "steady")
    assert res["steady"]["rule"].startswith("after the last admission (step 0)")
    # The prefill step is out of decode_only, and it is in the whole-run step_ms.
    assert res["decode_only"]["steps"] == len(steps) - 1
    assert res["step_ms"]["count"] == len(steps) and "p1" in res["step_ms"]


def test_full_depth_equivalent(all_at_once):
    s = json.loads((all_at_once / "summary.json").read_text())
    res, f = s["results"], s["results"]["full_depth_equivalent"]
    assert (f["layers"], f["full_layers"]) == (1, 2) == (s["model"]["layers"], s["model"]["full_layers"])
    assert f["factor"] == 0.5
    assert f["output_throughput"] == pytest.approx(0.5 * res["output_throughput"], rel=1e-12)
    assert f["decode_tokens_per_s"] == pytest.approx(0.5 * res["decode_only"]["tokens_per_s"], rel=1e-12)
    assert f["steady_tokens_per_s"] == pytest.approx(0.5 * res["steady"]["tokens_per_s"], rel=1e-12)
    assert "linear" in f["basis"] and "lower bound" in f["basis"]


def test_fixed_interval_window_after_first_finish(fd_bin, models_dir, tmp_path):
    cfg = json.loads(json.dumps(TINY))
    cfg["model"].pop("layers")  # full depth: no full_depth_equivalent
    cfg["workload"].update(requests=8, gen_len=4)  # one request every 2 steps (B·F/S = 1), each 4 steps long
    cfg["schedule"] = {"mode": "fixed-interval", "batch": 4, "interval": 2, "seq": 8}
    d = bench(fd_bin, models_dir, tmp_path, cfg)
    steps = read_jsonl(d / "steps.jsonl")
    res = json.loads((d / "summary.json").read_text())["results"]
    decode_only, steady, (last_admit, first_finish) = expected(steps)
    assert first_finish < last_admit and steady["steps"] >= 2, (first_finish, last_admit)
    assert_matches(res["decode_only"], decode_only, "decode_only")
    assert_matches(res["steady"], steady, "steady")
    assert res["steady"]["rule"].startswith("after the first finish")
    assert "full_depth_equivalent" not in res


def test_fd_sim_same_fields_same_window(fd_bin, all_at_once, tmp_path):
    reqs = read_jsonl(all_at_once / "requests.jsonl")
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": 0, "prompt_len": r["prompt_len"], "gen_len": GEN}) + "\n" for r in reqs))
    out = tmp_path / "sim"
    proc = run([fd_bin("fd-sim"), "--mode", "all-at-once", "--batch", N_REQ, "--seq", GEN, "--trace", trace,
                "--t-ms-per-step-s-part", 3.0, "--out", out])
    assert "steady window: steps 1..%d" % (GEN - 2) in proc.stdout, proc.stdout
    sim_steps = read_jsonl(out / "steps.jsonl")
    sim = json.loads((out / "summary.json").read_text())["results"]
    bench_res = json.loads((all_at_once / "summary.json").read_text())["results"]
    for key in ("decode_only", "steady"):
        assert set(sim[key]) == set(bench_res[key]), key
    decode_only, steady, _ = expected(sim_steps)
    assert_matches(sim["decode_only"], decode_only, "fd-sim decode_only")
    assert_matches(sim["steady"], steady, "fd-sim steady")
    for k in ("first_step", "last_step", "steps", "tokens", "mean_batch", "rule"):
        assert sim["steady"][k] == bench_res["steady"][k], k
    # fd-sim's older fields agree with the window.
    w = sim["steady_window"]
    assert (w["first_step"], w["last_step"], w["steps"], w["rule"]) == tuple(sim["steady"][k] for k in ("first_step", "last_step", "steps", "rule"))
    assert sim["mean_total_context"] == pytest.approx(sim["steady"]["mean_total_context"], rel=1e-12)
    # Without a cost model the counts stay and the times are null.
    out2 = tmp_path / "sim-untimed"
    run([fd_bin("fd-sim"), "--mode", "all-at-once", "--batch", N_REQ, "--seq", GEN, "--requests", N_REQ, "--out", out2])
    un = json.loads((out2 / "summary.json").read_text())["results"]
    assert un["steady"]["steps"] == GEN - 2 and un["steady"]["tokens_per_s"] is None
    assert un["decode_only"]["step_ms"] is None and un["decode_only"]["steps"] == GEN - 1
