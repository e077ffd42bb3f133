"""fd-bench's outputs and error handling, checked from outside as a user sees them.

A run folder must hold one steps.jsonl line per step, a trace.json in Chrome Trace Event format with
events, a summary.json whose numbers agree with steps.jsonl and requests.jsonl, and bad configs must
exit with code 2 before any work, naming the file and the key.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

TINY = {
    "name": "tiny",
    "model": {"config": "MODELS/tiny-llama-gqa.json", "weights": {"seed": 2, "dtype": "bf16"}},
    "workload": {"requests": 5, "prompt_len": {"dist": "uniform", "min": 3, "max": 12}, "gen_len": {"dist": "uniform", "min": 2, "max": 9}, "seed": 4},
    "engine": {"type": "reference", "threads": 1},
}


def write_config(path: Path, models_dir: Path, cfg: dict) -> Path:
    text = json.dumps(cfg).replace("MODELS", str(models_dir))
    path.write_text(text)
    return path


def bench(fd_bin, *args, check=True):
    proc = subprocess.run([fd_bin("fd-bench"), *map(str, args)], capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        pytest.fail(f"fd-bench {' '.join(map(str, args))} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def run_dir(fd_bin, models_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    cfg = write_config(d / "tiny.json", models_dir, TINY)
    bench(fd_bin, "run", cfg, "--out", d / "run", "--quiet")
    return d / "run"


def read_jsonl(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_steps_jsonl_one_line_per_step(run_dir):
    steps = read_jsonl(run_dir / "steps.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    res = summary["results"]
    assert len(steps) == res["steps"] > 0
    assert [s["step"] for s in steps] == list(range(len(steps)))
    starts = [s["start_ms"] for s in steps]
    assert starts == sorted(starts)
    # The first step prefills every prompt; the longest generation sets the step count.
    reqs = read_jsonl(run_dir / "requests.jsonl")
    assert steps[0]["prefill_tokens"] == sum(r["prompt_len"] for r in reqs) == res["prompt_tokens"]
    assert len(steps) == max(r["output_len"] for r in reqs)


def test_summary_consistent_with_steps(run_dir):
    steps = read_jsonl(run_dir / "steps.jsonl")
    reqs = read_jsonl(run_dir / "requests.jsonl")
    s = json.loads((run_dir / "summary.json").read_text())
    res = s["results"]
    assert res["output_tokens"] == sum(x["new_tokens"] for x in steps) == sum(r["output_len"] for r in reqs)
    assert res["num_requests"] == len(reqs) == TINY["workload"]["requests"]
    assert sum(x["finished"] for x in steps) == len(reqs)
    ms = np.array([x["step_ms"] for x in steps])
    for q in (50, 90, 99):
        assert res["step_ms"][f"p{q}"] == pytest.approx(np.percentile(ms, q), rel=1e-9)
    assert res["step_ms"]["max"] == pytest.approx(ms.max())
    assert res["step_ms"]["mean"] == pytest.approx(ms.mean())
    assert res["duration_s"] * 1e3 >= ms.sum() * (1 - 1e-9)
    assert res["output_throughput"] == pytest.approx(res["output_tokens"] / res["duration_s"])
    ttft = np.array([r["ttft_ms"] for r in reqs])
    assert res["ttft_ms"]["p50"] == pytest.approx(np.percentile(ttft, 50))
    # Offline: everyone's first token comes from step 0.
    assert ttft.max() == pytest.approx(steps[0]["start_ms"] + steps[0]["step_ms"], abs=0.5)
    for r in reqs:
        assert len(r["tokens"]) == r["output_len"]
        assert 2 <= r["output_len"] <= 9 and 3 <= r["prompt_len"] <= 12
    prov = s["provenance"]
    for key in ("git_commit", "host", "cpu_model", "cpu_cores", "gpus", "date_utc", "command"):
        assert key in prov
    assert s["config"]["workload"]["requests"] == 5
    assert s["model"]["name"] == "tiny-llama-gqa"


def test_trace_is_chrome_trace_format(run_dir):
    trace = json.loads((run_dir / "trace.json").read_text())
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    steps = read_jsonl(run_dir / "steps.jsonl")
    assert len([e for e in complete if e["name"].startswith("step ")]) == len(steps)
    assert {e["name"] for e in complete} >= {"prefill", "decode"}
    for e in complete:
        assert e["dur"] >= 0 and e["ts"] >= 0 and isinstance(e["tid"], int)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"harness", "reference"} <= names


def test_same_config_same_tokens(run_dir, fd_bin, models_dir, tmp_path):
    cfg = write_config(tmp_path / "tiny.json", models_dir, TINY)
    bench(fd_bin, "run", cfg, "--out", tmp_path / "again", "--quiet")
    a = [r["tokens"] for r in read_jsonl(run_dir / "requests.jsonl")]
    b = [r["tokens"] for r in read_jsonl(tmp_path / "again" / "requests.jsonl")]
    assert a == b


def test_refuses_to_overwrite_a_finished_run(run_dir, fd_bin, models_dir, tmp_path):
    cfg = write_config(tmp_path / "tiny.json", models_dir, TINY)
    before = (run_dir / "summary.json").read_bytes()
    p = bench(fd_bin, "run", cfg, "--out", run_dir, "--quiet", check=False)
    assert p.returncode == 2
    assert "already holds a finished run" in p.stderr
    assert (run_dir / "summary.json").read_bytes() == before


@pytest.mark.parametrize(
    "mutate, expect",
    [
        (lambda c: c.update(extra=1), "extra: unknown key"),
        (lambda c: c["workload"].update(requests="5"), "workload.requests: expected an integer"),
        (lambda c: c["workload"].update(requests=0), "workload.requests: value 0 out of range"),
        (lambda c: c["engine"].update(type="warp"), "engine.type"),
        (lambda c: c["model"].update(layers=9), "model.layers"),
        (lambda c: c["model"]["weights"].update(dtype="fp8"), "model.weights.dtype"),
    ],
)
def test_bad_config_exit_2_before_any_work(fd_bin, models_dir, tmp_path, mutate, expect):
    cfg = json.loads(json.dumps(TINY))
    mutate(cfg)
    path = write_config(tmp_path / "bad.json", models_dir, cfg)
    out = tmp_path / "out"
    p = bench(fd_bin, "run", path, "--out", out, check=False)
    assert p.returncode == 2, p.stderr
    assert str(path) in p.stderr and expect in p.stderr, p.stderr
    assert not out.exists()


def test_invalid_json_and_missing_file(fd_bin, tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text('{"name": ')
    p = bench(fd_bin, "run", bad, check=False)
    assert p.returncode == 2 and "broken.json: invalid JSON" in p.stderr
    p = bench(fd_bin, "run", tmp_path / "absent.json", check=False)
    assert p.returncode == 2 and "cannot open" in p.stderr


def test_check_prints_resolved_config(fd_bin, repo_root):
    p = bench(fd_bin, "run", repo_root / "experiments" / "quickstart.json", "--check")
    cfg = json.loads(p.stdout)
    assert cfg["engine"]["type"] == "fastdecode" and cfg["engine"]["rworkers"]["spawn"] >= 2
    assert cfg["model"]["layers"] >= 1


@pytest.mark.parametrize("prog", ["fd-bench", "fd-weights", "fd-generate"])
def test_every_program_has_help(fd_bin, prog):
    p = subprocess.run([fd_bin(prog), "--help"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and "Usage" in p.stdout


@pytest.mark.parametrize("args", [["run"], ["frobnicate"], ["run", "x.json", "--bogus"]])
def test_usage_errors_exit_2(fd_bin, args):
    p = bench(fd_bin, *args, check=False)
    assert p.returncode == 2


def test_experiment_configs_in_repo_are_valid(fd_bin, repo_root, tmp_path):
    """Every run config of experiments/ and experiments/gpu/ passes `run --check`; every sweep spec under
    experiments/ (each of its points) passes `sweep --dry-run`."""
    files = sorted([*(repo_root / "experiments").glob("*.json"), *(repo_root / "experiments" / "gpu").glob("*.json")])
    configs = [f for f in files if not f.name.endswith(".sweep.json")]
    assert configs
    for cfg in configs:
        p = bench(fd_bin, "run", cfg, "--check", check=False)
        assert p.returncode == 0, f"{cfg}: {p.stderr}"
    sweeps = sorted((repo_root / "experiments").rglob("*.sweep.json"))
    assert len(sweeps) >= 20
    for spec in sweeps:
        p = bench(fd_bin, "sweep", spec, "--out", tmp_path / spec.stem, "--dry-run", check=False)
        assert p.returncode == 0, f"{spec}: {p.stderr}"


def test_weights_dir_equals_seeded_weights(run_dir, fd_bin, models_dir, tmp_path):
    """A config naming a folder written by fd-weights gives the tokens of the same seed given inline."""
    subprocess.run([fd_bin("fd-weights"), "random", "--model", models_dir / "tiny-llama-gqa.json", "--seed", "2",
                    "--dtype", "bf16", "--out", tmp_path / "w", "--quiet"], check=True, capture_output=True)
    cfg = json.loads(json.dumps(TINY))
    cfg["model"] = {"weights": {"dir": str(tmp_path / "w")}}  # model config taken from the folder
    path = write_config(tmp_path / "dir.json", models_dir, cfg)
    bench(fd_bin, "run", path, "--out", tmp_path / "run", "--quiet")
    a = [r["tokens"] for r in read_jsonl(run_dir / "requests.jsonl")]
    b = [r["tokens"] for r in read_jsonl(tmp_path / "run" / "requests.jsonl")]
    assert a == b
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["model"]["weights"].endswith("model.safetensors")


@pytest.mark.skipif(shutil.which("script") is None, reason="needs script(1) for a pseudo-terminal")
def test_progress_line_on_a_terminal(fd_bin, models_dir, tmp_path):
    path = write_config(tmp_path / "tiny.json", models_dir, TINY)
    cmd = f"{fd_bin('fd-bench')} run {path} --out {tmp_path / 'run'}"
    p = subprocess.run(["script", "-qec", cmd, "/dev/null"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout
    assert "tok/s" in p.stdout and "ETA" in p.stdout and "step" in p.stdout


def test_fastdecode_engine_run_folder(fd_bin, models_dir, tmp_path):
    """fd-bench with the FastDecode engine (CPU S-Part, 2 spawned R-workers): the reference's tokens,
    a per-step breakdown, and R-worker tracks in the trace."""
    cfg = json.loads(json.dumps(TINY))
    cfg["engine"] = {"type": "fastdecode", "backend": "cpu", "threads": 1,
                     "rworkers": {"spawn": 2, "threads": 1, "kv_dtype": "fp16", "memory_gb": 0.1, "pin": True}}
    bench(fd_bin, "run", write_config(tmp_path / "fd.json", models_dir, cfg), "--out", tmp_path / "fd", "--quiet")
    ref = json.loads(json.dumps(TINY))
    ref["engine"] = {"type": "reference", "threads": 1, "kv_dtype": "fp16"}
    bench(fd_bin, "run", write_config(tmp_path / "ref.json", models_dir, ref), "--out", tmp_path / "ref", "--quiet")
    a = [r["tokens"] for r in read_jsonl(tmp_path / "fd" / "requests.jsonl")]
    b = [r["tokens"] for r in read_jsonl(tmp_path / "ref" / "requests.jsonl")]
    assert a == b
    steps = read_jsonl(tmp_path / "fd" / "steps.jsonl")
    assert all({"s_compute", "r_wait", "r_compute_max"} <= set(s["breakdown_ms"]) for s in steps)
    # Decode steps split the S side: the CPU S-Part copies nothing (d2h = h2d = 0); the wire and idle are
    # measured (idle: the decode's time outside the S-Part, which holds the waits for replies).
    dec = [s for s in steps if s["decode_tokens"] > 0]
    assert dec and all({"d2h", "h2d", "wire", "idle", "send"} <= set(s["breakdown_ms"]) for s in dec)
    assert all(0 < s["breakdown_ms"]["send"] <= s["step_ms"] for s in dec)
    assert all(s["breakdown_ms"]["d2h"] == 0 and s["breakdown_ms"]["h2d"] == 0 for s in dec)
    assert all(0 <= s["breakdown_ms"]["wire"] <= s["step_ms"] for s in dec)
    assert all(0 < s["breakdown_ms"]["idle"] <= s["step_ms"] for s in dec)
    assert sum(s["breakdown_ms"]["wire"] for s in dec) > 0
    # The rank's recorder: the wire is a share of the waits; each decode step's busiest worker computed; every step
    # ran the S-Part.
    assert all(s["breakdown_ms"]["wire"] <= s["breakdown_ms"]["r_wait"] for s in dec)
    assert all(s["breakdown_ms"]["r_compute_max"] > 0 for s in dec)
    assert all(s["breakdown_ms"]["s_compute"] > 0 for s in steps)
    summary = json.loads((tmp_path / "fd" / "summary.json").read_text())
    assert summary["engine"] == "fastdecode"
    assert summary["config"]["engine"]["rworkers"]["spawn"] == 2
    mean = summary["results"]["step_breakdown_ms_mean"]
    assert mean["s_compute"] == pytest.approx(sum(s["breakdown_ms"]["s_compute"] for s in steps) / len(steps))
    # Per decode step the busiest R-worker's KV tokens over the mean (>= 1, <= the worker count), and its distribution
    # over the decode-only steps in the summary.
    imb = [s["worker_kv_imbalance"] for s in dec]
    assert all(1 <= v <= 2 for v in imb)
    only = [s["worker_kv_imbalance"] for s in dec if s["prefill_tokens"] == 0]
    got = summary["results"]["worker_kv_imbalance"]
    assert got["decode_only"]["count"] == len(only) and got["decode_only"]["max"] == pytest.approx(max(only))
    assert 0 < got["steady"]["count"] <= len(only)
    trace = json.loads((tmp_path / "fd" / "trace.json").read_text())
    tracks = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"s-part", "s-worker", "rworker 0", "rworker 1"} <= tracks
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"decode step", "prefill", "L0 mb0 attention input", "L1 mb1 output+MLP", "L0 mb0"} <= names, sorted(names)[:20]


def test_fastdecode_rworker_options_are_strict(fd_bin, models_dir, tmp_path):
    cfg = json.loads(json.dumps(TINY))
    cfg["engine"] = {"type": "fastdecode", "rworkers": {"endpoints": ["tcp://127.0.0.1:9"], "spawn": 2}}
    p = bench(fd_bin, "run", write_config(tmp_path / "bad.json", models_dir, cfg), check=False)
    assert p.returncode == 2 and "engine.rworkers.spawn" in p.stderr
    cfg["engine"] = {"type": "fastdecode", "rworkers": {"kv_dtype": "int3"}}
    p = bench(fd_bin, "run", write_config(tmp_path / "bad2.json", models_dir, cfg), check=False)
    assert p.returncode == 2 and "engine.rworkers.kv_dtype" in p.stderr


def test_schedule_changes_timing_not_tokens(run_dir, fd_bin, models_dir, tmp_path):
    """Fixed-interval SLS admission and Poisson arrivals change when requests start, never their
    greedy tokens; steps.jsonl says what was admitted when, requests.jsonl the queueing delay."""
    cfg = json.loads(json.dumps(TINY))
    cfg["workload"]["requests"] = 5
    cfg["schedule"] = {"mode": "fixed-interval", "batch": 4, "interval": 2, "seq": 8}
    bench(fd_bin, "run", write_config(tmp_path / "fi.json", models_dir, cfg), "--out", tmp_path / "fi", "--quiet")
    steps = read_jsonl(tmp_path / "fi" / "steps.jsonl")
    admitted = [(s["sched_step"], s["admitted"]) for s in steps if s["admitted"]]
    assert admitted[0][0] == 0 and all(st % 2 == 0 for st, _ in admitted), admitted
    assert sum(n for _, n in admitted) == 5 and len(admitted) >= 2
    assert all(n <= 1 for _, n in admitted)  # M = B·F/S = 4·2/8 = 1 per slot
    a = [r["tokens"] for r in read_jsonl(run_dir / "requests.jsonl")]
    b = [r["tokens"] for r in read_jsonl(tmp_path / "fi" / "requests.jsonl")]
    assert a == b
    reqs = read_jsonl(tmp_path / "fi" / "requests.jsonl")
    assert reqs[0]["queue_ms"] < reqs[-1]["queue_ms"]  # later slots wait longer
    cfg = json.loads(json.dumps(TINY))
    cfg["workload"].update(arrival="poisson", rate=200.0)
    bench(fd_bin, "run", write_config(tmp_path / "po.json", models_dir, cfg), "--out", tmp_path / "po", "--quiet")
    reqs = read_jsonl(tmp_path / "po" / "requests.jsonl")
    assert [r["tokens"] for r in reqs] == a
    arrivals = [r["arrival_ms"] for r in reqs]
    assert arrivals == sorted(arrivals) and arrivals[-1] > 0
    summary = json.loads((tmp_path / "po" / "summary.json").read_text())
    assert summary["results"]["ttft_ms"]["max"] >= 0 and "queue_ms" in summary["results"]


def test_plan_follows_the_formulas(fd_bin, models_dir, tmp_path):
    """fd-bench plan: B by the latency bound, P = B·S·R/(2·T(B)), S-bound B/(N·T), R-bound 2P/(N·S·R)."""
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({"t_b": [[1, 1e-4], [256, 2e-4], [1024, 5e-4]], "r_s_per_token_layer": {"fp16": 2e-6}}))
    out = tmp_path / "plan.json"
    p = bench(fd_bin, "plan", "--profile", prof, "--model", models_dir / "llama-2-7b.json", "--seq", 1024,
              "--latency-ms", 20000, "--cpus-available", 16, "--json", out)
    assert "MODELLED" in p.stdout
    plan = json.loads(out.read_text())
    N, S, R = 32, 1024, 2e-6
    B, T = plan["batch"], plan["t_b_s"]
    assert plan["modelled"] is True and plan["batch_rule"] == "latency"
    assert 2 * N * S * T <= 20.0 + 1e-9
    assert plan["cpus_needed"] == pytest.approx(B * S * R / (2 * T))
    assert plan["tokens_per_s_s_bound"] == pytest.approx(B / (N * T))
    assert plan["tokens_per_s_r_bound"] == pytest.approx(2 * 16 / (N * S * R))
    assert plan["tokens_per_s"] == pytest.approx(min(plan["tokens_per_s_s_bound"], plan["tokens_per_s_r_bound"]))
    bad = bench(fd_bin, "plan", "--profile", prof, "--model", models_dir / "llama-2-7b.json", "--seq", 1024,
                "--kv-dtype", "int4", check=False)
    assert bad.returncode == 2 and "int4" in bad.stderr


def test_plan_hybrid_line_from_a_runs_prior(fd_bin, models_dir, tmp_path):
    """fd-bench plan --hybrid-prior (no profile): the hybrid line alone, every rate from a hybrid run's
    engine_info.prior; the split follows step = N·max(T(b) + (a·c + a_s)·(b−k), e + f + (r·c + o)·k) with the
    workers as one CPU side; a file that is no hybrid summary is a config error before anything is printed."""
    prior = {"s_part_per_layer": [[1, 1e-3], [4096, 1e-3]], "gpu_s_per_token": 10e-9, "gpu_s_per_seq": 0,
             "engage_s": 100e-6, "move_s_per_token": 1e-9,
             "workers": [{"s_per_token": 40e-9, "s_per_seq": 0, "s_per_call": 50e-6}] * 2}
    run = tmp_path / "summary.json"
    run.write_text(json.dumps({"engine": "hybrid", "engine_info": {"prior": prior}}))
    out = tmp_path / "plan.json"
    args = ["plan", "--model", models_dir / "llama-2-7b.json", "--layers", 2, "--seq", 1024, "--context", 1000,
            "--hybrid-prior", run, "--hybrid-batch", 64, "--json", out]
    p = bench(fd_bin, *args)
    assert "MODELLED" in p.stdout and "hybrid (MODELLED)" in p.stdout
    h = json.loads(out.read_text())["hybrid"]
    r = h["inputs"]["rates"]
    assert r["cpu_s_per_token"] == pytest.approx(20e-9) and r["cpu_s_per_call"] == pytest.approx(50e-6)
    N, c, b, k = 2, 1000, 64, h["hybrid"]["cpu_seqs"]
    step = N * max(1e-3 + 10e-9 * c * (b - k), 150e-6 + 20e-9 * c * k)
    assert k in (49, 50) and h["hybrid"]["batch"] == b  # the sides balance at k = 49.7
    assert h["hybrid"]["tokens_per_s"] == pytest.approx(b / step)
    assert h["hybrid"]["tokens_per_s"] > h["gpu_only"]["tokens_per_s"]
    # Engaging dearer than the GPU's whole layer: nothing goes to the CPUs.
    prior["engage_s"] = 5e-3
    run.write_text(json.dumps({"engine_info": {"prior": prior}}))
    h = json.loads((bench(fd_bin, *args), out.read_text())[1])["hybrid"]
    assert h["hybrid"]["cpu_seqs"] == 0 and h["hybrid"]["tokens_per_s"] == h["gpu_only"]["tokens_per_s"]
    # Bad input: not a hybrid run, no batch without a profile, neither a profile nor a prior.
    run.write_text(json.dumps({"engine": "gpu-only", "engine_info": {"slots": 4}}))
    bad = bench(fd_bin, *args, check=False)
    assert bad.returncode == 2 and "s_part_per_layer" in bad.stderr and "MODELLED" not in bad.stdout
    bad = bench(fd_bin, "plan", "--model", models_dir / "llama-2-7b.json", "--seq", 8, "--hybrid-prior", run, check=False)
    assert bad.returncode == 2 and "--hybrid-batch" in bad.stderr
    bad = bench(fd_bin, "plan", "--model", models_dir / "llama-2-7b.json", "--seq", 8, check=False)
    assert bad.returncode == 2 and "--profile" in bad.stderr


def test_profile_then_plan(fd_bin, models_dir, tmp_path):
    """fd-bench profile measures T(B) and R on this machine and writes a profile plan accepts."""
    prof = tmp_path / "profile.json"
    bench(fd_bin, "profile", "--model", models_dir / "tiny-llama.json", "--batches", 1, 4, "--kv-dtypes", "fp16", "int4",
          "--context", 256, "--reps", 2, "--out", prof)
    p = json.loads(prof.read_text())
    assert [b for b, _ in p["t_b"]] == [1, 4] and all(t > 0 for _, t in p["t_b"])
    assert set(p["r_s_per_token_layer"]) == {"fp16", "int4"} and all(r > 0 for r in p["r_s_per_token_layer"].values())
    assert p["layers"] == 2 and "git_commit" in p["provenance"]
    out = bench(fd_bin, "plan", "--profile", prof, "--model", models_dir / "tiny-llama.json", "--seq", 32)
    assert "MODELLED" in out.stdout and "binds" in out.stdout


def test_trace_arrivals(fd_bin, models_dir, tmp_path):
    """workload.arrival "trace": requests, arrival times and lengths from a JSONL trace; bad lines are
    config errors naming the trace file and line."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"arrival_s": 0.0, "prompt_len": 5, "gen_len": 6}\n'
                     '{"arrival_s": 0.01, "prompt_len": 3, "gen_len": 4, "max_gen_len": 9}\n'
                     '{"arrival_s": 0.02, "prompt_len": 8, "gen_len": 7}\n')
    cfg = json.loads(json.dumps(TINY))
    cfg["workload"] = {"arrival": "trace", "trace": str(trace), "seed": 4}
    bench(fd_bin, "run", write_config(tmp_path / "t.json", models_dir, cfg), "--out", tmp_path / "run", "--quiet")
    reqs = read_jsonl(tmp_path / "run" / "requests.jsonl")
    assert [(r["prompt_len"], r["output_len"]) for r in reqs] == [(5, 6), (3, 4), (8, 7)]
    assert [r["arrival_ms"] for r in reqs] == pytest.approx([0.0, 10.0, 20.0])
    trace.write_text('{"arrival_s": 0.0, "prompt_len": 5, "gen_len": 6}\n{"arrival_s": 0.1, "prompt_len": 5}\n')
    p = bench(fd_bin, "run", tmp_path / "t.json", "--out", tmp_path / "bad", check=False)
    assert p.returncode == 2 and f"{trace}:2" in p.stderr, p.stderr
    cfg["workload"]["requests"] = 3
    p = bench(fd_bin, "run", write_config(tmp_path / "t2.json", models_dir, cfg), check=False)
    assert p.returncode == 2 and "workload.requests: not allowed" in p.stderr


def test_kv_capacity_derived_from_rworker_memory(fd_bin, models_dir, tmp_path):
    """schedule.kv_capacity_tokens left at 0 is derived from the R-workers' memory: 16 requests that
    do not all fit the workers' 1 MB run without an out-of-memory error, fewer at a time; the same run
    with the cap forced off fails naming the worker's error; a request larger than the memory is a
    config error (exit 2) before any work."""
    cfg = json.loads(json.dumps(TINY))
    cfg["workload"] = {"requests": 16, "prompt_len": 100, "gen_len": 100, "seed": 1}
    cfg["engine"] = {"type": "fastdecode", "backend": "cpu", "threads": 1,
                     "rworkers": {"spawn": 2, "threads": 1, "kv_dtype": "fp16", "memory_gb": 0.001}}
    bench(fd_bin, "run", write_config(tmp_path / "cap.json", models_dir, cfg), "--out", tmp_path / "cap", "--quiet")
    summary = json.loads((tmp_path / "cap" / "summary.json").read_text())
    cap = summary["results"]["kv_capacity_tokens"]
    assert 0 < cap < 16 * 200
    assert any("derived from the R-workers' memory" in n for n in summary["notes"])
    steps = read_jsonl(tmp_path / "cap" / "steps.jsonl")
    assert max(s["running"] for s in steps) < 16
    assert all(s["total_context"] <= cap for s in steps)
    assert all(len(r["tokens"]) == 100 for r in read_jsonl(tmp_path / "cap" / "requests.jsonl"))
    cfg["schedule"] = {"mode": "all-at-once", "kv_capacity_tokens": 10 ** 9}
    p = bench(fd_bin, "run", write_config(tmp_path / "nocap.json", models_dir, cfg), "--out", tmp_path / "nocap",
              "--quiet", check=False)
    assert p.returncode == 1 and "out-of-memory" in p.stderr and "R-worker" in p.stderr
    big = json.loads(json.dumps(cfg))
    del big["schedule"]
    big["model"]["config"] = "MODELS/small-llama.json"
    big["workload"] = {"requests": 2, "prompt_len": 200, "gen_len": 10, "seed": 1}
    p = bench(fd_bin, "run", write_config(tmp_path / "big.json", models_dir, big), "--out", tmp_path / "big",
              "--quiet", check=False)
    assert p.returncode == 2 and "engine.rworkers.memory_gb" in p.stderr
