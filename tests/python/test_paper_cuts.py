"""Paper cuts a new user hit (issue 45), each as the user met it: the message must name what is wrong and where it
came from, and the exit status must be the documented one (2: an error before the first step)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "experiments" / "quickstart.json"


def run(fd_bin, tmp_path, *sets):
    args = [fd_bin("fd-bench"), "run", str(QUICKSTART), "--out", str(tmp_path / "run"), "--quiet"]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def test_a_bad_value_from_set_names_the_key_and_the_override(fd_bin, tmp_path):
    # Was: "schedule.mode: required key is missing" (the override made a schedule object without a mode).
    p = run(fd_bin, tmp_path, "schedule.batch=-4")
    assert p.returncode == 2, p.stderr
    assert "schedule.batch: value -4 out of range" in p.stderr and "(from --set schedule.batch=-4)" in p.stderr, p.stderr


def test_a_misspelt_key_gets_a_suggestion(fd_bin, tmp_path):
    p = run(fd_bin, tmp_path, "workload.requestz=4")
    assert p.returncode == 2
    assert "workload.requestz: unknown key (did you mean 'requests'?)" in p.stderr, p.stderr
    assert "(from --set workload.requestz=4)" in p.stderr
    # Far from every key: no suggestion.
    p = run(fd_bin, tmp_path, "workload.colour=4")
    assert p.returncode == 2 and "unknown key" in p.stderr and "did you mean" not in p.stderr, p.stderr


def test_integer_ranges_are_printed_exactly(fd_bin, tmp_path):
    # Was: "out of range [1, 1.04858e+06]".
    p = run(fd_bin, tmp_path, "workload.requests=99999999999")
    assert p.returncode == 2 and "out of range [1, 1048576]" in p.stderr, p.stderr


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0,
                    reason="a GPU answers here: the cuda backend runs")
def test_the_cuda_backend_without_a_gpu_is_a_config_error_with_the_way_out(fd_bin, tmp_path):
    # Was: exit 1, "CUDA S-Part: no CUDA device answers".
    p = run(fd_bin, tmp_path, "engine.backend=cuda")
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "engine.backend is cuda, but no CUDA device answers" in p.stderr and "cpu" in p.stderr, p.stderr
    assert not (tmp_path / "run").exists()


def test_accuracy_study_takes_every_option_its_help_names(tmp_path):
    script = REPO / "scripts" / "accuracy-study.sh"
    usage = subprocess.run([str(script), "-h"], capture_output=True, text=True, timeout=30).stdout
    opts = re.findall(r"\[(--[a-z-]+)( [A-Z]+)?\]", usage.splitlines()[2])
    assert {o for o, _ in opts} >= {"--model", "--weights-seed", "--out", "--bin-dir", "--gpu"}, usage
    values = {"CONFIG": str(REPO / "experiments" / "models" / "tiny-llama.json"), "N": "3", "DIR": str(tmp_path / "d")}
    for opt, arg in opts:
        args = [opt] + ([values[arg.strip()]] if arg else [])
        # A missing fd-bench stops the study right after its options are read.
        p = subprocess.run([str(script), *args, "--bin-dir", str(tmp_path / "no-bin"), "--out", str(tmp_path / "o")],
                           capture_output=True, text=True, timeout=60)
        assert "unknown option" not in p.stderr, (opt, p.stderr)
        assert "no-bin/fd-bench" in p.stderr, (opt, p.stderr)
    p = subprocess.run([str(script), "--model", "/nonexistent.json"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "--model /nonexistent.json: no such file" in p.stderr


def test_progress_shows_when_stderr_is_a_file(fd_bin, tmp_path):
    # Was: a progress line only on a terminal; a run logged to a file showed nothing until it ended.
    import os
    env = {**os.environ, "FD_PROGRESS_INTERVAL_S": "0"}  # a line every step (default: every 10 s)
    args = [fd_bin("fd-bench"), "run", str(QUICKSTART), "--set", "workload.requests=4", "--set", "workload.gen_len=16", "--out",
            str(tmp_path / "run")]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    lines = [l for l in p.stderr.splitlines() if re.match(r"^\s+step\s+\d+ \| running\s+\d+ \| tokens\s+\d+ / \d+ \|", l)]
    assert len(lines) >= 2 and "\r" not in p.stderr, p.stderr[-2000:]
    q = subprocess.run(args[:-1] + [str(tmp_path / "quiet"), "--quiet", "--set", "workload.requests=2", "--set", "workload.gen_len=8"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert q.returncode == 0 and not re.search(r"\| tokens\s+\d+ /", q.stderr)


def test_every_bad_line_of_a_workload_file_is_reported(fd_bin, tmp_path):
    # Was: the first bad line only.
    import json
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": [5, 6], "gen_len": 2}\n{"prompt": [], "gen_len": 2}\n{"prompt": [5], "gen_len": 2}\n'
                       '{"prompt": [5], "gen_len": -1}\nnot json\n')
    cfg = json.loads(QUICKSTART.read_text())
    cfg["model"]["config"] = str(REPO / "experiments" / "models" / "small-llama.json")
    cfg["workload"] = {"prompts": str(prompts)}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    p = subprocess.run([fd_bin("fd-bench"), "run", str(tmp_path / "c.json"), "--out", str(tmp_path / "run"), "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    for n, what in ((2, "'prompt' is empty"), (4, "'gen_len' = -1"), (5, "not JSON")):
        assert f"p.jsonl:{n}: {what}" in p.stderr, p.stderr
    assert "p.jsonl: 3 bad line(s) in all" in p.stderr and "p.jsonl:1:" not in p.stderr and "p.jsonl:3:" not in p.stderr


def test_the_benchmark_librarys_debug_warning_is_explained(fd_bin):
    # Was: Google Benchmark's "Library was built as DEBUG" (Debian's libbenchmark) with nothing saying what it is about.
    p = subprocess.run([fd_bin("fd-attn-bench"), "--batch", "1", "--context", "64", "--benchmark_filter=fp16",
                        "--benchmark_min_time=0.01"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = p.stdout + p.stderr
    assert "fd_build: " in out, out[:2000]
    if "Library was built as DEBUG" in out:
        assert "fd_build: Release (a 'Library was built as DEBUG' warning below is about the Google Benchmark library" in out


def test_random_tied_embedding_models_repeat_the_last_prompt_token(fd_bin, tmp_path):
    # docs/WEIGHTS.md says so (it was undocumented): the note must go when this stops being true.
    import json
    cfg = {"name": "tied", "model": {"config": str(REPO / "experiments" / "models" / "qwen2.5-0.5b.json"), "layers": 2,
                                     "weights": {"seed": 1, "dtype": "fp16"}},
           "workload": {"requests": 2, "prompt_len": 8, "gen_len": 4, "seed": 0}, "sampling": {"temperature": 0},
           "engine": {"type": "reference"}}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    p = subprocess.run([fd_bin("fd-bench"), "run", str(tmp_path / "c.json"), "--out", str(tmp_path / "run"), "--quiet"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    for line in (tmp_path / "run" / "requests.jsonl").read_text().splitlines():
        r = json.loads(line)
        assert r["tokens"] == [r["prompt"][-1]] * 4, r


def test_goodput_and_slo_attainment_in_the_summary(fd_bin, tmp_path):
    # Was: no goodput and no SLO attainment. The run's numbers recomputed here from its requests.jsonl with vLLM's
    # definitions (a request is good when every given limit holds; TPOT = (e2e - ttft) / (n - 1), 0 for one token).
    import json
    short = ["--set", "workload.requests=4", "--set", "workload.gen_len=16"]
    p = run(fd_bin, tmp_path, "workload.requests=4", "workload.gen_len=16")
    args = [fd_bin("fd-bench"), "run", str(QUICKSTART), "--out", str(tmp_path / "slo"), "--quiet", *short, "--slo", "ttft:1e9,tpot:1e9"]
    assert subprocess.run(args, capture_output=True, text=True, timeout=300).returncode == 0
    reqs = [json.loads(l) for l in (tmp_path / "slo" / "requests.jsonl").read_text().splitlines()]
    res = json.loads((tmp_path / "slo" / "summary.json").read_text())["results"]
    # Limits from this run's own latencies: the median TTFT and the median TPOT, so some requests pass and some fail.
    tpot = lambda r: (r["e2e_ms"] - r["ttft_ms"]) / (r["output_len"] - 1) if r["output_len"] > 1 else 0.0
    ttft_lim = sorted(r["ttft_ms"] for r in reqs)[len(reqs) // 2]
    good = [r for r in reqs if r["ttft_ms"] <= 1e9 and tpot(r) <= 1e9]
    assert res["slo"]["good_requests"] == len(good) == len(reqs) and res["slo"]["attainment"] == 1.0
    assert res["slo"]["goodput_requests_per_s"] == pytest.approx(len(good) / res["duration_s"], rel=1e-12)
    assert res["slo"]["goodput_tokens_per_s"] == pytest.approx(sum(r["output_len"] for r in good) / res["duration_s"], rel=1e-12)
    # A second run, judged by the config key with the first run's median TTFT as its limit.
    cfg = json.loads(QUICKSTART.read_text())
    cfg["model"]["config"] = str(REPO / "experiments" / "models" / "small-llama.json")
    cfg["workload"].update(slo={"ttft_ms": ttft_lim}, requests=4, gen_len=16)
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    q = subprocess.run([fd_bin("fd-bench"), "run", str(tmp_path / "c.json"), "--out", str(tmp_path / "slo2"), "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert q.returncode == 0, q.stderr
    reqs = [json.loads(l) for l in (tmp_path / "slo2" / "requests.jsonl").read_text().splitlines()]
    res = json.loads((tmp_path / "slo2" / "summary.json").read_text())["results"]
    good = [r for r in reqs if r["ttft_ms"] <= ttft_lim]
    assert res["slo"]["limits"] == {"ttft_ms": ttft_lim, "tpot_ms": None, "e2e_ms": None}
    assert res["slo"]["good_requests"] == len(good) and res["slo"]["attainment"] == pytest.approx(len(good) / len(reqs))
    # Without limits the fields are there and null; a bad --slo is a config error.
    assert p.returncode == 0
    plain = json.loads((tmp_path / "run" / "summary.json").read_text())["results"]["slo"]
    assert plain["limits"] is None and plain["goodput_requests_per_s"] is None
    bad = subprocess.run(args[:-1] + ["ttft=5"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--slo ttft=5: expected ttft:MS" in bad.stderr
