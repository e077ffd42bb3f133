"""R-workers started by the launchers clusters run (issue 47, docs/CLUSTER.md), for real, on this one host:

* **Slurm**: munged, slurmctld and three slurmd (nodes n1-n3 of this host, each on its own port) started by the test
  as root with a slurm.conf it writes into a temporary folder; `sbatch examples/slurm/fastdecode.sbatch` itself (the
  example is the file submitted, parameterised by its environment variables) runs fd-bench on the first node and
  `fd-rworker --register` on the two others. The run finishes with the tokens of the same config with spawned
  workers, each worker on the port its task rank gives it. A job whose S-worker expects more workers than it starts
  fails with exit 2 naming the registration endpoint. At the end everything is shut down and no process of this
  cluster is left (checked by pgrep and by each process's command line and environment).
* **MPI**: `mpirun -np 2 examples/mpi/rworker.sh tcp://...` (Open MPI): rank r listens on RWORKER_PORT + r; the same
  token check. Workers sent to the wrong run's endpoint leave the right run failing with exit 2 naming its endpoint
  (and are taken by the wrong run: a registration names no run); too few ranks fail the same way.
* **Kubernetes**: the manifest's numbers agree with each other (no kubectl check: its client-side dry run needs an API
  server, docs/CLUSTER.md).

The tools come from scripts/setup.sh; where one is missing the tests skip naming it, and fail instead under
FD_REQUIRE_BINARIES=1 (CI). Slurm's daemons need root: not root is a skip.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SBATCH = REPO / "examples" / "slurm" / "fastdecode.sbatch"
MPI_WRAPPER = REPO / "examples" / "mpi" / "rworker.sh"
K8S = REPO / "examples" / "kubernetes" / "fastdecode.yaml"
SLURM_TOOLS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel", "sinfo", "srun")
NODES = ("n1", "n2", "n3")  # n1 runs fd-bench, n2 and n3 an R-worker each
JOB_END = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
           "PREEMPTED"}


def require(tools: tuple[str, ...], what: str) -> None:
    """Skip (fail under FD_REQUIRE_BINARIES=1) naming the tools scripts/setup.sh installs that are missing."""
    missing = [t for t in tools if not shutil.which(t, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")]
    if missing:
        reason = f"{what}: {', '.join(missing)} not installed (scripts/setup.sh installs them)"
        if os.environ.get("FD_REQUIRE_BINARIES", "") not in ("", "0"):
            pytest.fail(reason + " [FD_REQUIRE_BINARIES=1]", pytrace=False)
        pytest.skip(reason)


def tool(name: str) -> str:
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") or name


def free_ports(n: int) -> int:
    """A base port with base .. base+n-1 all free on 127.0.0.1 and 0.0.0.0 (the rank-to-port rule needs a run)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        try:
            for p in range(base, base + n):
                with socket.socket() as t:
                    t.bind(("0.0.0.0", p))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no run of {n} free ports")


def processes_mentioning(*markers: str) -> dict[int, str]:
    """pid -> command line of every live process (this one aside) whose command line or environment holds
    each of `markers`."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            env = (d / "environ").read_bytes()
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and all(m in cmd or m.encode() in env for m in markers):
            out[int(d.name)] = cmd
    return out


def stop(procs: list[subprocess.Popen], timeout: float = 20) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=timeout)


def config(path: Path, rworkers: dict) -> Path:
    """The small run of every test here: tiny-llama on the CPU backend, 4 requests of 16 tokens."""
    cfg = json.loads((REPO / "experiments" / "quickstart.json").read_text())
    cfg["model"]["config"] = str(REPO / "experiments" / "models" / "tiny-llama.json")
    cfg["engine"]["backend"] = "cpu"
    cfg["engine"]["rworkers"] = rworkers
    cfg["workload"]["requests"] = 4
    cfg["workload"]["gen_len"] = 16
    path.write_text(json.dumps(cfg))
    return path


def tokens(run: Path) -> list:
    return [json.loads(line)["tokens"] for line in (run / "requests.jsonl").read_text().splitlines()]


def registered_workers(run: Path) -> dict[str, str]:
    """name -> endpoint of the R-workers a run used, from its summary.json (which must say ok, none spawned)."""
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == "ok" and not s["engine_info"]["rworkers_spawned"], s["status"]
    return {w["hello"]["name"]: w["endpoint"] for w in s["engine_info"]["rworkers"]}


@pytest.fixture(scope="module")
def spawned_tokens(fd_bin, tmp_path_factory):
    """The tokens of the same config with 2 spawned workers: what every launcher's run must give."""
    d = tmp_path_factory.mktemp("spawned")
    cfg = config(d / "spawned.json", {"spawn": 2, "threads": 1, "memory_gb": 0.2})
    p = subprocess.run([fd_bin("fd-bench"), "run", str(cfg), "--out", str(d / "run"), "--quiet"], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return tokens(d / "run")


# ------------------------------------------------------------------------------------------------------------------
# Slurm
# ------------------------------------------------------------------------------------------------------------------


class Slurm:
    """munged + slurmctld + one slurmd per node of NODES, all of this host, in folder `d`."""

    def __init__(self, d: Path):
        self.d = d
        self.conf = d / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.daemons: list[subprocess.Popen] = []

    def write_conf(self) -> None:
        ctld, *slurmd = [free_ports(1) for _ in range(1 + len(NODES))]
        host = socket.gethostname()
        nodes = "\n".join(f"NodeName={n} NodeAddr=127.0.0.1 NodeHostname={host} Port={p} CPUs=1 State=UNKNOWN"
                          for n, p in zip(NODES, slurmd))
        d = self.d
        self.conf.write_text(f"""\
ClusterName=fdtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/munge.socket
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/spool/%n/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/spool/%n/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=5
{nodes}
PartitionName=fd Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
""")

    def start(self) -> None:
        d = self.d
        for sub in ["munge", "state", *(f"spool/{n}" for n in NODES)]:
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "munge").chmod(0o755)  # munged wants its socket's folder searchable by all
        subprocess.run([tool("mungekey"), "--create", f"--keyfile={d}/munge/munge.key"], check=True, timeout=60)
        self.daemons.append(subprocess.Popen(
            [tool("munged"), "-F", f"--socket={d}/munge/munge.socket", f"--key-file={d}/munge/munge.key",
             f"--log-file={d}/munge/munged.log", f"--pid-file={d}/munge/munged.pid", f"--seed-file={d}/munge/seed"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        self.wait_for(lambda: (d / "munge" / "munge.socket").exists(), "munged's socket", d / "munge" / "munged.log")
        self.write_conf()
        self.daemons.append(subprocess.Popen([tool("slurmctld"), "-D", "-i", "-f", str(self.conf)], env=self.env,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for n in NODES:
            self.daemons.append(subprocess.Popen([tool("slurmd"), "-D", "-N", n, "-f", str(self.conf)], env=self.env,
                                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        def idle() -> bool:
            p = subprocess.run([tool("sinfo"), "-h", "-N", "-o", "%N %T"], env=self.env, capture_output=True,
                               text=True, timeout=30)
            return p.returncode == 0 and sorted(p.stdout.split()) == sorted([*NODES, *["idle"] * len(NODES)])

        self.wait_for(idle, "the 3 nodes idle in sinfo", d / "slurmctld.log")

    def wait_for(self, ready, what: str, log: Path, timeout: float = 60) -> None:
        end, dead = time.monotonic() + timeout, []
        while time.monotonic() < end:
            if ready():
                return
            dead = [p.args[0] for p in self.daemons if p.poll() is not None]
            if dead:
                break
            time.sleep(0.2)
        log_text = log.read_text() if log.exists() else "(no log)"
        pytest.fail(f"Slurm set-up: no {what} (daemons exited: {dead or 'none'}); {log}:\n{log_text[-4000:]}",
                    pytrace=False)

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run([tool(args[0]), *args[1:]], env=self.env, capture_output=True, text=True, timeout=60)
        if check:
            assert p.returncode == 0, f"{' '.join(args)}: {p.stderr}"
        return p

    def submit(self, env: dict, *sbatch_args: str) -> str:
        p = subprocess.run([tool("sbatch"), "--parsable", f"--chdir={self.d}", f"--output={self.d}/job-%j.out",
                            *sbatch_args, str(SBATCH)], env={**self.env, **env}, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, p.stderr
        return p.stdout.strip().split(";")[0]

    def wait_job(self, job: str, timeout: float = 120) -> tuple[str, str, str]:
        """(JobState, ExitCode, the job's output) once it has ended; on timeout cancels it and fails."""
        end = time.monotonic() + timeout
        fields: dict[str, str] = {}
        while time.monotonic() < end:
            out = self.run("scontrol", "show", "job", "-o", job).stdout
            fields = dict(kv.split("=", 1) for kv in out.split() if "=" in kv)
            if fields.get("JobState") in JOB_END:
                break
            time.sleep(0.25)
        else:
            self.run("scancel", job, check=False)
            pytest.fail(f"job {job} did not end within {timeout} s: {fields}\n{self.output(job)}", pytrace=False)
        return fields["JobState"], fields["ExitCode"], self.output(job)

    def output(self, job: str) -> str:
        f = self.d / f"job-{job}.out"
        return f.read_text() if f.exists() else "(no output file)"

    def shutdown(self) -> list[str]:
        """Cancels every job, stops the daemons, kills what is left by pid; returns what had to be killed."""
        problems = []
        if self.conf.exists():
            self.run("scancel", "--user", str(os.getuid()), check=False)
            end = time.monotonic() + 60
            while time.monotonic() < end and self.run("squeue", "-h", check=False).stdout.strip():
                time.sleep(0.25)
            self.run("scontrol", "shutdown", check=False)
        for p in self.daemons[1:]:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                problems.append(f"{p.args[0]} still running 30 s after scontrol shutdown")
                stop([p])
        stop(self.daemons[:1])  # munged last: the others talk to it until they are down
        left = processes_mentioning(str(self.d))
        for pid, cmd in left.items():
            problems.append(f"left running: {pid} {cmd}")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return problems


@pytest.fixture(scope="module")
def slurm():
    require(SLURM_TOOLS, "the Slurm launcher test")
    if os.geteuid() != 0:
        pytest.skip("the Slurm launcher test starts slurmd, which runs jobs as root here: not root")
    # Not under pytest's tmp_path: munged wants every folder above its socket searchable by all.
    d = Path(tempfile.mkdtemp(prefix="fd-slurm-"))
    d.chmod(0o755)
    cluster = Slurm(d)
    try:
        cluster.start()
        yield cluster
    finally:
        problems = cluster.shutdown()
        pgrep = subprocess.run(["pgrep", "-a", "-f", str(d)], capture_output=True, text=True)
        if not problems and pgrep.returncode == 0:
            problems.append("pgrep -f still finds: " + pgrep.stdout)
        if not problems:
            shutil.rmtree(d, ignore_errors=True)
        assert not problems, f"Slurm shut-down ({d} kept):\n" + "\n".join(problems)


def job_env(fd_bin, d: Path, name: str, **extra) -> tuple[dict, Path]:
    cfg = config(d / f"{name}.json", {"register": "tcp://127.0.0.1:5600", "expect": 1, "register_timeout_ms": 60000})
    results = d / f"{name}-run"
    env = {"BIN": str(Path(fd_bin("fd-bench")).parent), "CONFIG": str(cfg), "RESULTS": str(results),
           "REGISTER_PORT": str(free_ports(1)), "RWORKER_PORT": str(free_ports(2)), "RWORKER_THREADS": "1",
           "RWORKER_MEMORY_GB": "0.2", **extra}
    return env, results


def left_running(*markers: str, timeout: float = 30) -> dict[int, str]:
    """The processes holding `markers` still there `timeout` s from now (none: {} as soon as they are gone)."""
    end = time.monotonic() + timeout
    while (left := processes_mentioning(*markers)) and time.monotonic() < end:
        time.sleep(0.25)
    return left


def job_processes_left(slurm: Slurm, job: str) -> dict[int, str]:
    """A job that has ended: its processes (their environment holds this cluster's SLURM_CONF and the job's
    SLURM_JOB_ID) left running once Slurm has had time to stop them."""
    return left_running(f"SLURM_CONF={slurm.conf}\0", f"SLURM_JOB_ID={job}\0")


def test_slurm_job_runs_the_spawned_runs_tokens(slurm, fd_bin, spawned_tokens):
    env, results = job_env(fd_bin, slurm.d, "ok")
    job = slurm.submit(env, "--nodes=3")
    state, exit_code, out = slurm.wait_job(job)
    assert (state, exit_code) == ("COMPLETED", "0:0"), out
    reg = f"tcp://0.0.0.0:{env['REGISTER_PORT']}"
    assert f"waiting for 2 R-worker(s) to register at {reg}" in out and "2 of 2 R-workers registered" in out, out
    # The rank-to-endpoint rule: task rank r listens on RWORKER_PORT + r and announces its node's NodeAddr.
    base = int(env["RWORKER_PORT"])
    want = {f"rworker0@{NODES[1]}": f"tcp://127.0.0.1:{base}", f"rworker1@{NODES[2]}": f"tcp://127.0.0.1:{base + 1}"}
    assert registered_workers(results) == want
    for name, ep in want.items():
        assert f"fd-rworker {name}: registered {ep} with the S-worker at tcp://127.0.0.1:{env['REGISTER_PORT']}" in out
    assert tokens(results) == spawned_tokens
    assert not job_processes_left(slurm, job)


def test_slurm_job_starting_too_few_workers_fails_naming_the_endpoint(slurm, fd_bin):
    """The S-worker expects 3 while the job starts 2: exit 2 naming the endpoint, the job FAILED with it, no run folder,
    and the 2 workers (registered, waiting for a session that never comes) stopped with the job."""
    env, results = job_env(fd_bin, slurm.d, "few", FD_BENCH_ARGS="--set engine.rworkers.expect=3 "
                           "--set engine.rworkers.register_timeout_ms=5000")
    job = slurm.submit(env, "--nodes=3")
    state, exit_code, out = slurm.wait_job(job)
    assert (state, exit_code) == ("FAILED", "2:0"), out
    reg = f"tcp://0.0.0.0:{env['REGISTER_PORT']}"
    assert (f"engine.rworkers.expect 3: 2 R-worker(s) registered at {reg} within engine.rworkers.register_timeout_ms "
            f"5000 ms (start them with fd-rworker --register {reg})") in out, out
    assert "fastdecode.sbatch: fd-bench exited 2" in out and not results.exists()
    assert not job_processes_left(slurm, job)


# ------------------------------------------------------------------------------------------------------------------
# MPI
# ------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mpirun():
    require(("mpirun",), "the MPI launcher test")
    return tool("mpirun")


def start_ranks(mpirun: str, fd_bin, n: int, register: str, base: int) -> subprocess.Popen:
    """The documented command (docs/CLUSTER.md), on one host: rank r listens on 127.0.0.1:base + r."""
    env = dict(os.environ, BIN=str(Path(fd_bin("fd-rworker")).parent), RWORKER_PORT=str(base), RWORKER_HOST="127.0.0.1")
    return subprocess.Popen([mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(n),
                             str(MPI_WRAPPER), register, "--threads", "1", "--memory-gb", "0.2"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def start_run(fd_bin, d: Path, name: str, register: str, expect: int, timeout_ms: int) -> subprocess.Popen:
    cfg = config(d / f"{name}.json", {"register": register, "expect": expect, "register_timeout_ms": timeout_ms})
    return subprocess.Popen([fd_bin("fd-bench"), "run", str(cfg), "--out", str(d / name), "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finish(procs: list[subprocess.Popen], marker: str) -> None:
    """Stops what is still running and checks that no process holding `marker` (a registration endpoint) is left."""
    stop(procs)
    left = left_running(f" {marker} ")  # as an argument: --register ENDPOINT --serve-once, mpirun ... ENDPOINT --threads
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"left running: {left}"


def test_mpirun_ranks_run_the_spawned_runs_tokens(mpirun, fd_bin, spawned_tokens, tmp_path):
    register, base = f"tcp://127.0.0.1:{free_ports(1)}", free_ports(2)
    run = start_run(fd_bin, tmp_path, "mpi", register, 2, 60000)
    ranks = start_ranks(mpirun, fd_bin, 2, register, base)
    try:
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
        out, _ = ranks.communicate(timeout=60)  # --serve-once: every rank exits once the run has closed its session
        assert ranks.returncode == 0, out
    finally:
        finish([run, ranks], register)
    host = socket.gethostname()
    want = {f"rworker{r}@{host}": f"tcp://127.0.0.1:{base + r}" for r in range(2)}
    assert registered_workers(tmp_path / "mpi") == want
    for name, ep in want.items():
        assert f"fd-rworker {name}: registered {ep} with the S-worker at {register}" in out, out
    assert tokens(tmp_path / "mpi") == spawned_tokens


def test_mpirun_ranks_registering_with_another_run_fail_the_right_one(mpirun, fd_bin, tmp_path):
    """Ranks given run B's endpoint instead of run A's: A exits 2 naming its endpoint, leaving no run folder. B takes
    them and runs: a registration names an endpoint, not a run (docs/CLUSTER.md)."""
    a, b = f"tcp://127.0.0.1:{free_ports(1)}", f"tcp://127.0.0.1:{free_ports(1)}"
    run_a = start_run(fd_bin, tmp_path, "a", a, 2, 2000)
    run_b = start_run(fd_bin, tmp_path, "b", b, 2, 60000)
    ranks = start_ranks(mpirun, fd_bin, 2, b, free_ports(2))
    try:
        _, err_a = run_a.communicate(timeout=120)
        _, err_b = run_b.communicate(timeout=300)
        ranks.communicate(timeout=60)
    finally:
        finish([run_a, run_b, ranks], b)
    assert run_a.returncode == 2, err_a
    assert (f"engine.rworkers.expect 2: 0 R-worker(s) registered at {a} within engine.rworkers.register_timeout_ms "
            f"2000 ms (start them with fd-rworker --register {a})") in err_a, err_a
    assert not (tmp_path / "a").exists()
    assert run_b.returncode == 0 and len(registered_workers(tmp_path / "b")) == 2, err_b


def test_mpirun_with_too_few_ranks_fails_naming_the_endpoint(mpirun, fd_bin, tmp_path):
    """One rank for a run expecting 2: exit 2 naming the endpoint, no run folder. The rank that registered waits for a
    session that never comes (--serve-once): stopping mpirun stops it."""
    register = f"tcp://127.0.0.1:{free_ports(1)}"
    run = start_run(fd_bin, tmp_path, "few", register, 2, 3000)
    ranks = start_ranks(mpirun, fd_bin, 1, register, free_ports(1))
    try:
        _, err = run.communicate(timeout=120)
    finally:
        finish([run, ranks], register)
    assert run.returncode == 2, err
    assert "1 of 2 R-workers registered" in err, err
    assert (f"engine.rworkers.expect 2: 1 R-worker(s) registered at {register} within "
            f"engine.rworkers.register_timeout_ms 3000 ms (start them with fd-rworker --register {register})") in err, err
    assert not (tmp_path / "few").exists()


# ------------------------------------------------------------------------------------------------------------------
# Kubernetes: no cluster here, and kubectl's client-side dry run asks an API server (docs/CLUSTER.md)
# ------------------------------------------------------------------------------------------------------------------


def test_kubernetes_manifest_agrees_with_itself():
    """The S-worker expects as many workers as the indexed Job completes; the workers register at the Service's name
    and port, which lead to the S-worker's registration port; each worker listens on the port it declares."""
    try:
        import yaml
    except ImportError:
        reason = "the Kubernetes manifest check: PyYAML not importable (scripts/setup.sh installs python3-yaml)"
        if os.environ.get("FD_REQUIRE_BINARIES", "") not in ("", "0"):
            pytest.fail(reason + " [FD_REQUIRE_BINARIES=1]", pytrace=False)
        pytest.skip(reason)
    service, sworker, rworkers = yaml.safe_load_all(K8S.read_text())
    assert (service["kind"], sworker["kind"], rworkers["kind"]) == ("Service", "Job", "Job")
    s_cmd = sworker["spec"]["template"]["spec"]["containers"][0]["command"]
    sets = dict(s_cmd[i + 1].split("=", 1) for i, a in enumerate(s_cmd) if a == "--set")
    reg_port = int(sets["engine.rworkers.register"].rsplit(":", 1)[1])
    assert int(sets["engine.rworkers.expect"]) == rworkers["spec"]["completions"] == rworkers["spec"]["parallelism"]
    assert rworkers["spec"]["completionMode"] == "Indexed"
    port = service["spec"]["ports"][0]
    assert port["targetPort"] == reg_port
    assert service["spec"]["selector"] == sworker["spec"]["template"]["metadata"]["labels"]
    w = rworkers["spec"]["template"]["spec"]["containers"][0]
    w_cmd = w["command"][-1]
    assert f"--register tcp://{service['metadata']['name']}:{port['port']}" in w_cmd and "--serve-once" in w_cmd
    listen = int(w_cmd.split("--listen tcp://0.0.0.0:")[1].split()[0])
    assert f"--advertise tcp://$POD_IP:{listen}" in w_cmd and w["ports"][0]["containerPort"] == listen
