"""fd-bench profile and plan end to end, as a user runs them (issue 13's last bullet).

* profile measures R for each of fp16 / int8 / int4 KV over a working set that streams from DRAM (at
  least 4 x the last-level cache sysfs reports, and at least 1 GiB) and records the bytes and the LLC;
  `plan --kv-dtype int4` uses the int4 R.
* plan prints P with three significant digits (never "P = 0.0; using 1"), says why the CPU count used
  differs, and reports P as sockets of a named CPU with --socket-cores / --socket-name.
* --sm-count is the CUDA S-Part's knob: with --backend cpu it is refused (exit 2) before any work.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from conftest import FIXTURES

P_LINE = re.compile(r"CPUs needed P = B·S·R/\(2·T\(B\)\) = (\S+) cores(?: = (\S+) sockets of (.+) \((\d+) cores each\))?; "
                    r"using (\S+)(?: \((.+)\))?$", re.M)


def bench(fd_bin, *args, check=True):
    proc = subprocess.run([fd_bin("fd-bench"), *map(str, args)], capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        pytest.fail(f"fd-bench {' '.join(map(str, args))} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def sysfs_llc_bytes() -> int:
    """The highest-level cache of cpu0, read here independently of the C++ (0 when unreadable)."""
    best = (-1, 0)
    for d in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level, size = int((d / "level").read_text()), (d / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
        best = max(best, (level, int(size.rstrip("KMG")) * mult))
    return best[1]


@pytest.fixture(scope="module")
def profile(fd_bin, models_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("profile")
    bench(fd_bin, "profile", "--backend", "cpu", "--model", models_dir / "tiny-llama.json", "--batches", 1, 4,
          "--kv-dtypes", "fp16", "int8", "int4", "--context", 64, "--reps", 1, "--out", d / "profile.json")
    return d / "profile.json"


def test_profile_measures_every_kv_dtype_from_dram(profile):
    p = json.loads(profile.read_text())
    assert set(p["r_s_per_token_layer"]) == {"fp16", "int8", "int4"}
    assert all(r > 0 for r in p["r_s_per_token_layer"].values())
    m = p["method"]
    llc = sysfs_llc_bytes()
    assert m["llc_bytes"] == (llc or None)
    assert not m["r_working_set_capped"]  # the test machine has the memory for it
    for dt in ("fp16", "int8", "int4"):
        assert m["r_bytes_read"][dt] >= max(4 * llc, 1 << 30), (dt, m["r_bytes_read"][dt], llc)
        assert f"{dt} " in m["r"]
    assert "sm_count" not in p and p["backend"] == "cpu"


def test_plan_uses_the_int4_r(fd_bin, models_dir, profile, tmp_path):
    p = json.loads(profile.read_text())
    out = tmp_path / "plan.json"
    r = bench(fd_bin, "plan", "--profile", profile, "--model", models_dir / "tiny-llama.json", "--seq", 32,
              "--kv-dtype", "int4", "--json", out)
    plan = json.loads(out.read_text())
    R = p["r_s_per_token_layer"]["int4"]
    assert r.stdout.startswith("MODELLED") and f"R[int4] = {R:.3g} s/token/layer" in r.stdout
    assert plan["inputs"]["kv_dtype"] == "int4" and plan["inputs"]["r_s_per_token_layer"] == R
    assert plan["cpus_needed"] == pytest.approx(plan["batch"] * 32 * R / (2 * plan["t_b_s"]))
    assert plan["tokens_per_s_r_bound"] == pytest.approx(2 * plan["cpus_used"] / (2 * 32 * R))


def test_plan_p_line_never_reads_zero(fd_bin, models_dir, profile, tmp_path):
    """The tiny model needs a small fraction of one CPU: printed with its digits, and why 1 is used."""
    out = tmp_path / "plan.json"
    r = bench(fd_bin, "plan", "--profile", profile, "--model", models_dir / "tiny-llama.json", "--seq", 32,
              "--json", out)
    plan = json.loads(out.read_text())
    assert 0 < plan["cpus_needed"] < 1 and plan["cpus_used"] == 1  # the case "%.1f" printed as "P = 0.0; using 1"
    m = P_LINE.search(r.stdout)
    assert m, r.stdout
    assert float(m[1]) == pytest.approx(plan["cpus_needed"], rel=5e-3) and float(m[1]) > 0
    assert m[2] is None and m[5] == "1" and m[6] == "at least one R-worker CPU"
    assert plan["cpus_used_reason"] == "at least one R-worker CPU"
    assert plan["sockets_needed"] is None and plan["socket_cores"] is None and plan["socket_name"] is None


def test_plan_reports_sockets(fd_bin, models_dir, tmp_path):
    """P = 4.096 (the unit test's latency case): 4.1 cores = 0.064 sockets of 64 cores, 5 used."""
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({"t_b": [[1, 1e-3], [64, 1e-3], [128, 1.6e-3], [256, 3.2e-3]],
                                "r_s_per_token_layer": {"fp16": 1e-7}, "backend": "cuda", "sm_count": 32}))
    out = tmp_path / "plan.json"
    r = bench(fd_bin, "plan", "--profile", prof, "--model", models_dir / "llama-2-7b.json", "--seq", 1024,
              "--latency-ms", 65536 * 2.01, "--socket-cores", 64, "--socket-name", "AMD EPYC 7763", "--json", out)
    plan = json.loads(out.read_text())
    assert plan["cpus_needed"] == pytest.approx(4.096)
    assert plan["sockets_needed"] == pytest.approx(4.096 / 64)
    assert plan["socket_cores"] == 64 and plan["socket_name"] == "AMD EPYC 7763"
    m = P_LINE.search(r.stdout)
    assert m, r.stdout
    assert (m[1], m[2], m[3], m[4], m[5], m[6]) == ("4.1", "0.064", "AMD EPYC 7763", "64", "5", "rounded up to whole CPUs")
    r = bench(fd_bin, "plan", "--profile", prof, "--model", models_dir / "llama-2-7b.json", "--seq", 1024,
              "--socket-name", "AMD EPYC 7763", check=False)
    assert r.returncode == 2 and "--socket-cores" in r.stderr


def test_profile_refuses_bad_options(fd_bin, models_dir, tmp_path):
    """Refused with exit 2 before any measurement, naming the flag; no profile.json written."""
    out = tmp_path / "p.json"
    for args, text in ((["--backend", "cpu", "--sm-count", 8], "--sm-count 8"),
                       (["--kv-dtypes", "fp16", "int3"], "int3"),
                       (["--batches", 4, 2], "--batches")):
        r = bench(fd_bin, "profile", "--model", models_dir / "tiny-llama.json", *args, "--out", out, check=False)
        assert r.returncode == 2 and text in r.stderr, (args, r.returncode, r.stderr)
        assert not out.exists()


def test_plan_answers_with_a_datasheet_gpu_and_sockets_by_bandwidth(fd_bin, models_dir, tmp_path):
    """Issue 41: `plan --batch B --seq S` with the GPU by its datasheet and a socket by its memory bandwidth prints P in
    sockets, the tokens/s and the step, and the validation's error band (a validation written here: its summary is all
    the plan reads of it); the numbers are the roofline's, recomputed here from the model's shapes."""
    out = tmp_path / "plan.json"
    validation = tmp_path / "validation.json"
    validation.write_text(json.dumps({"summary": {"runs": 7, "median_abs_err": 0.05, "max_abs_err": 0.125}}))
    p = bench(fd_bin, "plan", "--model", models_dir / "llama-2-7b.json", "--batch", 1024, "--seq", 1024, "--gpu-hbm-gbps", 600,
              "--gpu-tflops", 125, "--socket-gbps", 154, "--validation", validation, "--json", out)
    j = json.loads(out.read_text())
    cfg = json.loads((models_dir / "llama-2-7b.json").read_text())
    h, inter, kv = cfg["hidden_size"], cfg["intermediate_size"], cfg["hidden_size"] // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    layer_params = h * h * 2 + 2 * h * kv + 3 * h * inter + 2 * h  # q, o; k, v; gate, up, down; the two norms
    t = max(2 * 2 * layer_params / 600e9, 2 * layer_params * 1024 / (125e12 * 0.7))
    r_socket = 2 * kv * 2 / 154e9  # K and V of one token at one layer, fp16, read at 154 GB/s
    assert j["batch"] == 1024 and j["batch_rule"] == "given" and j["inputs"]["cpu_unit"] == "sockets"
    assert j["t_b_s"] == pytest.approx(t, rel=1e-6)
    assert j["cpus_needed"] == pytest.approx(1024 * 1024 * r_socket / (2 * t), rel=1e-6)
    assert j["tokens_per_s"] == pytest.approx(min(1024 / (32 * t), 2 * j["cpus_used"] / (32 * 1024 * r_socket)), rel=1e-6)
    assert re.search(r"sockets needed P = B·S·R/\(2·T\(B\)\) = (\S+) \(each reading KV at 154 GB/s\)", p.stdout)
    assert re.search(r"tokens/s: S-bound \d+, R-bound \d+ -> \d+ \([SR] binds\); step [\d.]+ ms", p.stdout)
    assert re.search(r"error band: .* off by a median 5\.0 %, at most 12\.5 % \(7 runs: " + re.escape(str(validation)) + r"\)",
                     p.stdout), p.stdout
    # With a profile's R as well: P in cores, and in sockets judged by bandwidth.
    prof = FIXTURES / "profiles" / "profile_llama-2-7b_cuda_svc4x3.json"
    p = bench(fd_bin, "plan", "--model", models_dir / "llama-2-7b.json", "--batch", 1024, "--seq", 1024, "--profile", prof,
              "--socket-gbps", 154, "--json", out)
    j = json.loads(out.read_text())
    assert j["sockets_by_bandwidth"] == pytest.approx(1024 * 1024 * r_socket / (2 * j["t_b_s"]), rel=1e-6)
    assert "in sockets judged by memory bandwidth (154 GB/s each)" in p.stdout
    # Half a datasheet, or a datasheet GPU without any CPU, is refused before any work.
    for args, what in ((["--gpu-hbm-gbps", 600], "needs both --gpu-hbm-gbps and --gpu-tflops"),
                       (["--gpu-hbm-gbps", 600, "--gpu-tflops", 125], "--socket-gbps")):
        r = bench(fd_bin, "plan", "--model", models_dir / "llama-2-7b.json", "--seq", 1024, *args, check=False)
        assert r.returncode == 2 and what in r.stderr, r.stderr


def test_scheduling_doc_shows_what_the_plan_prints(fd_bin):
    """docs/SCHEDULING.md quotes `fd-bench plan ... --gpu-hbm-gbps 600 ...` and its output: the command prints it today."""
    repo = Path(__file__).resolve().parents[2]
    doc = (repo / "docs" / "SCHEDULING.md").read_text()
    m = re.search(r"```\n\$ fd-bench (plan [^\n]+)\n(.*?)\n```", doc, re.S)
    assert m, "docs/SCHEDULING.md has no quoted fd-bench plan command"
    proc = subprocess.run([fd_bin("fd-bench"), *m.group(1).split()], capture_output=True, text=True, timeout=120, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip("\n") == m.group(2), "the quoted output is stale: rerun the command and paste it"
