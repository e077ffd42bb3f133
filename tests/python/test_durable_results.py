"""Results survive a failed run (issue 16): steps.jsonl and requests.jsonl grow as the run goes, a run that
fails mid-way still writes summary.json with "status": "failed", the error and what finished, and an error
found before the first step leaves no run folder behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def read_jsonl(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def config(tmp_path: Path, gen_max: int = 400, **engine) -> Path:
    cfg = json.loads((REPO / "experiments" / "quickstart.json").read_text())
    cfg["model"]["config"] = str(REPO / "experiments" / "models" / "small-llama.json")
    cfg["workload"]["gen_len"] = {"dist": "uniform", "min": 4, "max": gen_max}
    cfg["engine"]["backend"] = "cpu"
    cfg["engine"]["rworkers"].update(engine)
    p = tmp_path / "cfg.json"
    p.write_text(json.dumps(cfg))
    return p


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def kill_a_worker_mid_run(fd_bin, cfg: Path, out: Path, sig=signal.SIGKILL):
    """Starts fd-bench run, sends `sig` to its first spawned R-worker once a request has finished, returns the
    process and the worker's pid."""
    p = subprocess.Popen([fd_bin("fd-bench"), "run", str(cfg), "--out", str(out), "--quiet"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120  # hang guard
    while time.monotonic() < deadline and p.poll() is None:
        reqs = out / "requests.jsonl"
        if reqs.exists() and reqs.read_text().count("\n") >= 1:
            break
        time.sleep(0.02)
    assert p.poll() is None, "the run ended before a request finished and a worker could be killed"
    victim = children(p.pid)[0]
    os.kill(victim, sig)
    return p, victim


def test_a_lost_worker_is_recovered_and_the_run_completes_with_the_same_tokens(fd_bin, tmp_path):
    """on_failure recover (the default): kill -9 or SIGSTOP of one of the two spawned workers mid-run; the run ends
    ok, every request whole and with the tokens of the same run without the fault; the recovering step says so in
    steps.jsonl."""
    cfg = config(tmp_path, gen_max=80, heartbeat_timeout_ms=1000)
    subprocess.run([fd_bin("fd-bench"), "run", str(cfg), "--out", str(tmp_path / "clean"), "--quiet"], check=True,
                   capture_output=True, timeout=300)
    clean = {r["id"]: r["tokens"] for r in read_jsonl(tmp_path / "clean" / "requests.jsonl")}
    for sig in (signal.SIGKILL, signal.SIGSTOP):
        out = tmp_path / sig.name
        p, victim = kill_a_worker_mid_run(fd_bin, cfg, out, sig)
        _, err = p.communicate(timeout=300)
        if sig == signal.SIGSTOP:
            try:
                os.kill(victim, signal.SIGKILL)  # the engine killed it at the end already
            except ProcessLookupError:
                pass
        assert p.returncode == 0, (sig, err)
        s = json.loads((out / "summary.json").read_text())
        assert s["status"] == "ok"
        got = {r["id"]: r["tokens"] for r in read_jsonl(out / "requests.jsonl")}
        assert got == clean, sig
        steps = read_jsonl(out / "steps.jsonl")
        recovered = [x for x in steps if x.get("counts", {}).get("rworkers_lost")]
        assert len(recovered) == 1 and recovered[0]["counts"]["sequences_rebuilt"] >= 1, recovered
        assert "recovery" in recovered[0]["breakdown_ms"]
        assert s["results"]["counts_total"]["rworkers_lost"] == 1
        assert "lost" in err and "recovering" in err


def test_a_run_that_loses_a_worker_keeps_what_it_did(fd_bin, tmp_path):
    """on_failure fail: the run ends (exit 1) naming the worker, and keeps everything it finished."""
    out = tmp_path / "run"
    p = subprocess.Popen([fd_bin("fd-bench"), "run", str(config(tmp_path, timeout_ms=3000, on_failure="fail")), "--out",
                          str(out), "--quiet"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120  # hang guard
    while time.monotonic() < deadline and p.poll() is None:
        reqs = out / "requests.jsonl"
        if reqs.exists() and reqs.read_text().count("\n") >= 1:
            break
        time.sleep(0.02)
    assert p.poll() is None, "the run ended before a request finished and a worker could be killed"
    victim = children(p.pid)[0]
    os.kill(victim, signal.SIGKILL)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1, (p.returncode, err)
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "failed"
    assert "R-worker" in s["error"] and ("is lost" in s["error"] or "deadline" in s["error"]), s["error"]  # names it
    finished = read_jsonl(out / "requests.jsonl")
    assert len(finished) == s["results"]["finished_requests"] >= 1
    assert all(r["output_len"] == len(r["tokens"]) >= 1 for r in finished)
    steps = read_jsonl(out / "steps.jsonl")  # every line whole
    assert len(steps) == s["results"]["steps"] > 0


def test_a_run_that_completes_says_so(fd_bin, tmp_path):
    out = tmp_path / "ok"
    subprocess.run([fd_bin("fd-bench"), "run", str(config(tmp_path)), "--out", str(out), "--quiet",
                    "--set", "workload.requests=2", "--set", "workload.gen_len=8"], check=True, capture_output=True, timeout=300)
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "ok"
    ids = [r["id"] for r in read_jsonl(out / "requests.jsonl")]
    assert ids == sorted(ids) and len(ids) == 2  # rewritten in id order at the end


def test_an_error_before_the_first_step_leaves_no_folder(fd_bin, tmp_path):
    out = tmp_path / "never"
    p = subprocess.run([fd_bin("fd-bench"), "run", str(config(tmp_path, binary="/nonexistent/fd-rworker")), "--out", str(out),
                        "--quiet"], capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    assert "/nonexistent/fd-rworker" in p.stderr, p.stderr
    assert not out.exists(), list(out.iterdir())


def test_a_failed_run_folder_can_be_run_again(fd_bin, tmp_path):
    out = tmp_path / "again"
    out.mkdir()
    (out / "summary.json").write_text(json.dumps({"status": "failed", "error": "R-worker 0 missed its deadline"}))
    subprocess.run([fd_bin("fd-bench"), "run", str(config(tmp_path)), "--out", str(out), "--quiet",
                    "--set", "workload.requests=1", "--set", "workload.gen_len=4"], check=True, capture_output=True, timeout=300)
    assert json.loads((out / "summary.json").read_text())["status"] == "ok"
    (out / "summary.json").write_text(json.dumps({"status": "ok"}))  # a finished one is still refused
    p = subprocess.run([fd_bin("fd-bench"), "run", str(config(tmp_path)), "--out", str(out), "--quiet"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "already holds a finished run" in p.stderr
