"""Spawned R-workers die with their parent (issue 16): fd-bench passes --parent-pid to every fd-rworker it
spawns, and a worker whose parent is gone (here: SIGKILL of fd-bench mid-run, which runs no destructor)
exits by itself instead of listening forever. Also: a worker given a --parent-pid that is not its parent
refuses to start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out.update(int(c) for c in text)
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (not yet reaped by its new parent) is gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_killed_fd_bench_leaves_no_rworker(fd_bin, tmp_path):
    cfg = REPO / "experiments" / "quickstart.json"
    p = subprocess.Popen([fd_bin("fd-bench"), "run", str(cfg), "--out", str(tmp_path / "run"), "--quiet",
                          "--set", "engine.backend=cpu", "--set", "workload.gen_len=400"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    listening = 0
    deadline = time.monotonic() + 120  # a hang guard, not a speed limit
    while listening < 2 and time.monotonic() < deadline:
        line = p.stderr.readline()
        if not line:
            break
        listening += "listening on" in line
    assert listening == 2, "fd-bench did not start its 2 R-workers"
    workers = children(p.pid)
    assert len(workers) == 2, workers
    while not (tmp_path / "run" / "steps.jsonl").exists() and time.monotonic() < deadline:  # its run loop started
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.wait()
    deadline = time.monotonic() + 30  # the workers poll their parent every 100 ms; 30 s only guards a hang
    while any(alive(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [w for w in workers if alive(w)]
    for w in left:  # do not leave them behind even when the test fails
        os.kill(w, signal.SIGKILL)
    assert not left, f"R-workers {left} outlived their killed parent"
    # The folder says what happened: the run started and did not end (no destructor ran to write more).
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["status"] == "incomplete" and s["pid"] == p.pid, s
    assert all(json.loads(line) for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()[:-1])


def test_a_wrong_parent_pid_is_refused(fd_bin):
    r = subprocess.run([fd_bin("fd-rworker"), "--parent-pid", "1", "--listen", "tcp://127.0.0.1:*"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--parent-pid 1" in r.stderr, (r.returncode, r.stderr)
