"""Multi-host emulation (issue 16, hardware.network): each spawned R-worker on an emulated host of its own (a network
namespace behind a veth link shaped with tc). Needs root, iproute2 and the kernel's veth and tbf: where namespaces are
refused the tests skip, saying why (CI may not lend them; this is not a tool scripts/setup.sh installs)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def namespaces_refused() -> str:
    if os.geteuid() != 0:
        return "not root"
    name = f"fdprobe{os.getpid()}"
    try:
        p = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return "no `ip` tool (iproute2)"
    if p.returncode != 0:
        return "ip netns add refused: " + p.stderr.strip()
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
    return ""


REFUSED = namespaces_refused()
needs_netns = pytest.mark.skipif(bool(REFUSED), reason=f"network namespaces unavailable here: {REFUSED}")


def run(fd_bin, out: Path, *sets, check=True):
    args = [fd_bin("fd-bench"), "run", str(REPO / "experiments" / "quickstart.json"), "--out", str(out), "--quiet",
            "--set", "engine.backend=cpu", "--set", "workload.requests=4", "--set", "workload.gen_len=24"]
    for s in sets:
        args += ["--set", s]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def orphaned_namespaces() -> list[str]:
    """Namespaces named fd<pid>h<i> (EmulatedHosts') whose process is gone: left behind."""
    out = []
    for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split():
        pid = n[2:].split("h")[0] if n.startswith("fd") and "h" in n else ""
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            out.append(n)
    return out


@needs_netns
def test_workers_on_emulated_hosts_run_the_same_run(fd_bin, tmp_path):
    run(fd_bin, tmp_path / "lo")
    run(fd_bin, tmp_path / "link", 'hardware.network={"rate_gbit": 1}')
    s = json.loads((tmp_path / "link" / "summary.json").read_text())
    endpoints = [w["endpoint"] for w in s["engine_info"]["rworkers"]]
    assert all(e.startswith("tcp://10.") for e in endpoints), endpoints  # each on its namespace's address
    assert len({e.rsplit(":", 1)[0] for e in endpoints}) == 2  # two hosts
    # no shared-memory lane to a worker on another host: every tensor crosses the shaped link
    assert [w["shm"]["state"] for w in s["engine_info"]["rworkers"]] == ["off", "off"], s["engine_info"]["rworkers"]
    assert any("network namespaces behind custom (1 Gbit/s each way, tc tbf)" in n for n in s["notes"]), s["notes"]
    assert s["config"]["hardware"]["network"] == {"rate_gbit": 1.0, "delay_ms": 0.0}
    tok = lambda d: [json.loads(x)["tokens"] for x in (tmp_path / d / "requests.jsonl").read_text().splitlines()]  # noqa: E731
    assert tok("link") == tok("lo")
    assert not orphaned_namespaces(), "namespaces left behind by a finished run"


def link_of(pid: int, host: int) -> str:
    """The S-worker's end of emulated host `host`'s veth in fd-bench process `pid` (fastdecode/sworker/netemu.cpp)."""
    return f"fdv{pid % 16384}a{host}"


@needs_netns
def test_a_cut_link_is_recovered_with_the_same_tokens(fd_bin, tmp_path):
    """Issue 47: one worker's link taken down mid-run (its veth set down: the process lives, nothing answers its
    heartbeats), the run recovers per docs/RELIABILITY.md (on_failure "recover") and gives the loopback run's tokens."""
    fast = ["engine.rworkers.heartbeat_ms=200", "engine.rworkers.heartbeat_timeout_ms=1000", "workload.gen_len=64"]
    run(fd_bin, tmp_path / "lo", *fast)
    args = [fd_bin("fd-bench"), "run", str(REPO / "experiments" / "quickstart.json"), "--out", str(tmp_path / "cut"),
            "--quiet", "--set", "engine.backend=cpu", "--set", "workload.requests=4",
            "--set", 'hardware.network={"rate_gbit": 1}', "--set", "engine.rworkers.on_failure=recover"]
    for s in fast:
        args += ["--set", s]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        steps, deadline = tmp_path / "cut" / "steps.jsonl", time.monotonic() + 120
        while not (steps.exists() and len(steps.read_text().splitlines()) >= 4):  # decoding, a few steps in
            assert p.poll() is None and time.monotonic() < deadline, "the run ended before its link could be cut"
            time.sleep(0.02)
        cut = subprocess.run(["ip", "link", "set", link_of(p.pid, 1), "down"], capture_output=True, text=True)
        assert cut.returncode == 0, cut.stderr  # the veth is named as netemu.cpp names it
        _, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    s = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert s["status"] == "ok"
    assert s["results"]["counts_total"].get("rworkers_lost") == 1, s["results"]["counts_total"]
    assert s["results"]["counts_total"].get("sequences_rebuilt", 0) >= 1, s["results"]["counts_total"]
    lost = s["engine_info"]["rworkers"][1]["endpoint"]
    assert f"R-worker 1 ({lost}) lost" in err, err  # stderr names the lost worker
    tok = lambda d: [json.loads(x)["tokens"] for x in (tmp_path / d / "requests.jsonl").read_text().splitlines()]  # noqa: E731
    assert len(tok("cut")) == 4 and tok("cut") == tok("lo")
    assert not orphaned_namespaces(), "namespaces left behind by a finished run"


@needs_netns
def test_a_delay_needs_netem(fd_bin, tmp_path):
    p = run(fd_bin, tmp_path / "delay", 'hardware.network={"rate_gbit": 10, "delay_ms": 0.5}', check=False)
    if p.returncode == 0:  # this kernel has sch_netem
        assert json.loads((tmp_path / "delay" / "summary.json").read_text())["status"] == "ok"
    else:
        assert p.returncode == 2 and "netem" in p.stderr, p.stderr
        assert not (tmp_path / "delay").exists()


@pytest.mark.parametrize("value,what", [('"5gbe"', "hardware.network"), ('{"rate": 1}', "hardware.network.rate"),
                                        ('{"rate_gbit": -1}', "hardware.network.rate_gbit")])
def test_bad_network_settings_exit_2(fd_bin, tmp_path, value, what):
    p = run(fd_bin, tmp_path / "bad", "hardware.network=" + value, check=False)
    assert p.returncode == 2 and what in p.stderr, p.stderr
