"""R-workers started by any launcher join a waiting S-worker (issue 16): fd-bench run with engine.rworkers.register and
expect N waits for N `fd-rworker --register ENDPOINT`; the run is the same run as with spawned workers, and workers
started with --serve-once exit when the run closes its session. Nobody registering in time is a config error (exit 2)
naming the endpoint, before any work, leaving no run folder."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(tmp_path: Path, rworkers: dict) -> Path:
    cfg = json.loads((REPO / "experiments" / "quickstart.json").read_text())
    cfg["model"]["config"] = str(REPO / "experiments" / "models" / "small-llama.json")
    cfg["engine"]["backend"] = "cpu"
    cfg["engine"]["rworkers"] = rworkers
    cfg["workload"]["requests"] = 4
    p = tmp_path / f"cfg{len(list(tmp_path.glob('cfg*')))}.json"
    p.write_text(json.dumps(cfg))
    return p


def tokens(run: Path):
    return [json.loads(line)["tokens"] for line in (run / "requests.jsonl").read_text().splitlines()]


def test_registered_workers_run_the_same_run(fd_bin, tmp_path):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    cfg = config(tmp_path, {"register": endpoint, "expect": 2, "register_timeout_ms": 120000})
    run = subprocess.Popen([fd_bin("fd-bench"), "run", str(cfg), "--out", str(tmp_path / "reg"), "--quiet"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    workers = [subprocess.Popen([fd_bin("fd-rworker"), "--listen", "tcp://127.0.0.1:*", "--register", endpoint,
                                 "--serve-once", "--threads", "1", "--memory-gb", "0.2", "--name", f"launched{i}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for i in range(2)]
    try:
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
        assert "2 of 2 R-workers registered" in err
        for w in workers:  # --serve-once: gone once the run closed its session
            _, werr = w.communicate(timeout=60)
            assert w.returncode == 0 and "registered tcp://127.0.0.1:" in werr, werr
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
    s = json.loads((tmp_path / "reg" / "summary.json").read_text())
    assert s["status"] == "ok" and not s["engine_info"]["rworkers_spawned"]
    assert len(s["engine_info"]["rworkers"]) == 2
    spawned = config(tmp_path, {"spawn": 2, "threads": 1, "memory_gb": 0.2})
    subprocess.run([fd_bin("fd-bench"), "run", str(spawned), "--out", str(tmp_path / "spawned"), "--quiet"], check=True,
                   capture_output=True, timeout=300)
    assert tokens(tmp_path / "reg") == tokens(tmp_path / "spawned")


def test_nobody_registering_is_a_config_error(fd_bin, tmp_path):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    cfg = config(tmp_path, {"register": endpoint, "expect": 1, "register_timeout_ms": 300})
    p = subprocess.run([fd_bin("fd-bench"), "run", str(cfg), "--out", str(tmp_path / "none"), "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "0 R-worker(s) registered at " + endpoint in p.stderr and "fd-rworker --register" in p.stderr
    assert not (tmp_path / "none").exists()


def test_the_launcher_examples_are_well_formed(fd_bin):
    """examples/: the registered-workers experiment passes --check; the Slurm script parses (bash -n); the Kubernetes
    manifest parses when PyYAML is installed. test_cluster_launchers.py runs the Slurm script under a real Slurm and
    examples/mpi under mpirun; the Kubernetes manifest has not run on a cluster (docs/CLUSTER.md)."""
    p = subprocess.run([fd_bin("fd-bench"), "run", str(REPO / "examples" / "registered.json"), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    cfg = json.loads(p.stdout)
    assert cfg["engine"]["rworkers"]["register"] == "tcp://0.0.0.0:5600" and cfg["engine"]["rworkers"]["expect"] == 4
    subprocess.run(["bash", "-n", str(REPO / "examples" / "slurm" / "fastdecode.sbatch")], check=True)
    yaml = pytest.importorskip("yaml")
    docs = list(yaml.safe_load_all((REPO / "examples" / "kubernetes" / "fastdecode.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["Service", "Job", "Job"]
    worker = docs[2]["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert "--register tcp://fastdecode-sworker:5600" in worker and "--serve-once" in worker
