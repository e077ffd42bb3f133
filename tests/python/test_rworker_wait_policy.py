"""fd-rworker chooses its OpenMP wait policy itself (issue 43): with OMP_WAIT_POLICY unset it runs PASSIVE (set in its
own environment before the OpenMP runtime loads, by starting again), and one the user set is kept and reported."""

from __future__ import annotations

import os
import signal
import subprocess


def start(fd_bin, env):
    p = subprocess.Popen([str(fd_bin("fd-rworker")), "--listen", "tcp://127.0.0.1:*", "--memory-gb", "0.05",
                          "--threads", "1", "--print-endpoint"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    endpoint = p.stdout.readline().strip()  # printed once listening
    assert endpoint.startswith("tcp://"), p.stderr.read()
    environ = open(f"/proc/{p.pid}/environ", "rb").read().split(b"\0")
    comm = open(f"/proc/{p.pid}/comm").read().strip()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    return environ, err, comm


def test_unset_policy_becomes_passive_in_the_workers_own_environment(fd_bin):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "FD_OMP_WAIT_POLICY_SET_BY")}
    environ, err, comm = start(fd_bin, env)
    # The running process (after its exec) was loaded with the variable: libgomp read PASSIVE.
    assert b"OMP_WAIT_POLICY=PASSIVE" in environ, environ
    assert "OpenMP wait PASSIVE," in err, err
    # Started again by its own path, not /proc/self/exe: ps and pkill still know it as fd-rworker.
    assert comm == "fd-rworker", comm


def test_a_policy_the_user_set_is_kept(fd_bin):
    env = {k: v for k, v in os.environ.items() if k != "FD_OMP_WAIT_POLICY_SET_BY"}
    env["OMP_WAIT_POLICY"] = "ACTIVE"
    environ, err, comm = start(fd_bin, env)
    assert b"OMP_WAIT_POLICY=ACTIVE" in environ
    assert comm == "fd-rworker", comm
    assert "OpenMP wait ACTIVE (from the environment)" in err, err
