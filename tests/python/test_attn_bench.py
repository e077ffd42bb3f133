"""fd-attn-bench's Google Benchmark JSON, checked from outside on tiny shapes (a second or two on 2 cores):
each decode_attention benchmark runs right after its read_ceiling, the counters agree with each other and
with the KV bytes formula, the provenance is in the context, the memory cap's skips are listed; and
analysis/rworker_report.py still reproduces the committed reports from the issue-3 files and reads this
format; a sweep of the kernel's knobs names each setting and compares it with fp16 at that setting and at the defaults. No timed assertions: numbers are only checked against each other.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

ISAS = ("scalar", "avx2")
DTYPES = ("fp16", "int8", "int4")
BATCHES = (1, 3)
CONTEXTS = (40, 96, 4096)  # 40, 96: full blocks and an fp16 tail; 4096 with B = 3 in fp16 is over the cap
H, HKV, D = 4, 2, 64
MEMORY_GB, COLD_GB = 0.004, 0.002
REPS = 3


def per_head_block_bytes(dtype):  # kv_block_bytes / n_kv_heads (kernels/cpu/kv_quant.cpp)
    return {"fp16": 128 * D, "int8": 64 * D + 256, "int4": 40 * D}[dtype]


def kv_bytes(dtype, b, c):
    return b * HKV * ((c // 32) * per_head_block_bytes(dtype) + (c % 32) * D * 4)


def over_cap(dtype, b, c):  # one replica (R = 1 here) over --memory-gb
    blocks = (c // 32) * b * HKV * per_head_block_bytes(dtype) + (b * 2 * HKV * 32 * D * 2 if c % 32 else 0)
    return blocks / 1e9 > MEMORY_GB


def parse(name):
    parts = name.split("/")
    f = dict(p.split(":", 1) for p in parts[3:] if ":" in p)
    return parts[0], (parts[1], parts[2], int(f["B"]), int(f["ctx"]))


@pytest.fixture(scope="module")
def attn(fd_bin, tmp_path_factory, run_program):
    out = tmp_path_factory.mktemp("attn") / "attn_tiny.json"
    proc = run_program([fd_bin("fd-attn-bench"), "--isa", *ISAS, "--kv-dtype", *DTYPES,
                        "--batch", *map(str, BATCHES), "--context", *map(str, CONTEXTS),
                        "--heads", H, "--kv-heads", HKV, "--head-dim", D, "--threads", 2, "--reps", REPS,
                        "--warmup", 1, "--cold-gb", COLD_GB, "--memory-gb", MEMORY_GB, "--json", out], timeout=120)
    assert "skipped: kv fp16 B 3 ctx 4096" in proc.stdout
    return out, json.loads(out.read_text())


def test_provenance_and_formulas_in_the_context(attn):
    ctx = attn[1]["context"]
    assert ctx["fd_tool"] == "fd-attn-bench"
    for key in ("git_commit", "cpu_model", "cpu_cores", "date_utc", "command", "threads", "ceiling_isa"):
        assert f"fd_{key}" in ctx, key
    assert int(ctx["fd_cpu_cores"]) >= 1 and ctx["fd_threads"] == "2"
    assert ctx["fd_ceiling_isa"] in ("avx2", "avx512")
    assert "--memory-gb" in ctx["fd_command"]
    formulas = json.loads(ctx["fd_formulas"])
    for key in ("kv_bytes", "bytes_per_second", "tokens_per_second", "ratio_to_ceiling", "speedup_vs_fp16"):
        assert key in formulas, key


def test_the_memory_cap_skips_are_listed(attn):
    skipped = json.loads(attn[1]["context"]["fd_skipped"])
    want = {(d, b, c) for d in DTYPES for b in BATCHES for c in CONTEXTS if over_cap(d, b, c)}
    assert want == {("fp16", 3, 4096)}  # the test's own shapes: only this one is over the cap
    assert {(s["kv_dtype"], s["batch"], s["context"]) for s in skipped} == want
    assert all(s["needed_gb"] > MEMORY_GB for s in skipped)


def test_each_kernel_runs_right_after_its_ceiling(attn):
    rows = attn[1]["benchmarks"]
    assert all(r["run_type"] == "iteration" and not r.get("error_occurred") for r in rows)
    assert all(r["iterations"] == REPS for r in rows)
    families = [parse(r["name"]) for r in rows]
    assert [f for f, _ in families] == ["read_ceiling", "decode_attention"] * (len(rows) // 2)
    for i in range(0, len(families), 2):
        assert families[i][1] == families[i + 1][1], rows[i + 1]["name"]
    cases = {case for f, case in families if f == "decode_attention"}
    assert cases == {(i, d, b, c) for i in ISAS for d in DTYPES for b in BATCHES for c in CONTEXTS
                     if not over_cap(d, b, c)}


def test_counters_agree_with_each_other(attn):
    rows = attn[1]["benchmarks"]
    kernels = {parse(r["name"])[1]: r for r in rows if r["name"].startswith("decode_attention/")}
    ceilings = {parse(r["name"])[1]: r for r in rows if r["name"].startswith("read_ceiling/")}
    for (isa, dt, b, c), k in kernels.items():
        where = k["name"]
        ceil = ceilings[(isa, dt, b, c)]
        for r in (k, ceil):
            assert (r["batch"], r["context"], r["n_heads"], r["n_kv_heads"], r["head_dim"]) == (b, c, H, HKV, D), where
            assert r["omp_threads"] == 2 and r["warmup"] == 1 and r["replicas"] >= 1, where
            assert r["kv_bytes"] == kv_bytes(dt, b, c), where
            assert 0 < r["seconds_median"] <= r["seconds_p90"], where
            assert r["bytes_per_second"] == pytest.approx(r["kv_bytes"] / r["seconds_median"], rel=1e-12), where
        assert k["tokens_per_second"] == pytest.approx(b / k["seconds_median"], rel=1e-12), where
        assert k["ratio_to_ceiling"] == pytest.approx(ceil["seconds_median"] / k["seconds_median"], rel=1e-12), where
        assert k["ratio_to_ceiling"] == pytest.approx(k["bytes_per_second"] / ceil["bytes_per_second"], rel=1e-12), where
        assert k["ceiling_bytes_per_second"] == pytest.approx(ceil["bytes_per_second"], rel=1e-12), where
        # a task reads heads_per_task kv heads (its auto value: the fewest whose bytes of a block reach 8 KiB)
        assert k["heads_per_task"] >= 1 and HKV % k["heads_per_task"] == 0 and k["prefetch_blocks"] == 1, where
        assert k["plan_tasks"] >= b * HKV // k["heads_per_task"], where
        assert k["plan_split_pairs"] >= 0 and k["plan_chunk_target_bytes"] > 0, where
        fp16 = kernels.get((isa, "fp16", b, c))
        if dt == "fp16" or fp16 is None:
            assert "speedup_vs_fp16" not in k, where
        else:
            assert k["speedup_vs_fp16"] == pytest.approx(k["tokens_per_second"] / fp16["tokens_per_second"],
                                                         rel=1e-12), where


# A sweep of the kernel's knobs: every (prefetch distance, heads a task) a run of its own, named /pf:N/hg:N, with the
# counters as resolved; speedup_vs_fp16 against fp16 at the same setting, speedup_vs_fp16_default against fp16 at the
# library's defaults as fp16 resolves them (prefetch 1, heads a task auto: 1 for fp16 at d 64; int4's auto is 2 here).
SWEEP_PF, SWEEP_HG = (0, 1), (0, 1, 2)


def auto_heads_per_task(dtype):  # decode_attention_heads_per_task: the fewest dividing heads reaching 8 KiB a block
    want = min(-(-8192 // per_head_block_bytes(dtype)), 8)
    for d in range(want, 9):
        if HKV % d == 0:
            return d
    return next(d for d in range(min(want, 8), 0, -1) if HKV % d == 0)


@pytest.fixture(scope="module")
def sweep(fd_bin, tmp_path_factory, run_program):
    out = tmp_path_factory.mktemp("attn") / "attn_sweep.json"
    run_program([fd_bin("fd-attn-bench"), "--isa", "scalar", "--kv-dtype", "fp16", "int4", "--batch", 3,
                 "--context", 96, "--heads", H, "--kv-heads", HKV, "--head-dim", D, "--threads", 2, "--reps", REPS,
                 "--cold-gb", 0, "--prefetch-blocks", *SWEEP_PF, "--heads-per-task", *SWEEP_HG, "--json", out],
                timeout=120)
    return json.loads(out.read_text())["benchmarks"]


def test_a_sweep_names_each_setting_and_compares_with_fp16_twice(sweep):
    runs = {}
    for r in sweep:
        if not r["name"].startswith("decode_attention/"):
            continue
        parts = r["name"].split("/")
        f = dict(p.split(":", 1) for p in parts[3:] if ":" in p)
        runs[(parts[2], int(f["pf"]), int(f["hg"]))] = r
    assert set(runs) == {(dt, pf, hg) for dt in ("fp16", "int4") for pf in SWEEP_PF for hg in SWEEP_HG}
    assert auto_heads_per_task("fp16") == 1 and auto_heads_per_task("int4") == 2  # the shape tells them apart
    default = next(r for r in sweep if r["name"].startswith("decode_attention/scalar/fp16/") and
                   r["prefetch_blocks"] == 1 and r["heads_per_task"] == auto_heads_per_task("fp16"))
    for (dt, pf, hg), r in runs.items():
        where = r["name"]
        assert r["prefetch_blocks"] == pf and r["heads_per_task"] == (hg or auto_heads_per_task(dt)), where
        if dt == "fp16":
            assert "speedup_vs_fp16" not in r and "speedup_vs_fp16_default" not in r, where
            continue
        fp16 = runs[("fp16", pf, hg)]
        assert r["speedup_vs_fp16"] == pytest.approx(r["tokens_per_second"] / fp16["tokens_per_second"], rel=1e-12), where
        assert r["speedup_vs_fp16_default"] == pytest.approx(r["tokens_per_second"] / default["tokens_per_second"],
                                                             rel=1e-12), where


def test_usage_errors(fd_bin):
    for args, text in ((["--kv-dtype", "int3"], "--kv-dtype"), (["--head-dim", "48"], "--head-dim"),
                       (["--heads", "6", "--kv-heads", "4"], "--heads")):
        proc = subprocess.run([fd_bin("fd-attn-bench"), *args], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2, (args, proc.stderr)
        assert text in proc.stderr, (args, proc.stderr)


def test_nothing_to_run_is_an_error_not_an_empty_success(fd_bin):
    proc = subprocess.run([fd_bin("fd-attn-bench"), "--batch", "1", "--context", "64", "--kv-dtype", "fp16",
                           "--memory-gb", "1e-9", "--cold-gb", "0"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "skipped: kv fp16 B 1 ctx 64" in proc.stdout
    assert "no benchmark to run" in proc.stderr


def test_help_lists_the_options_and_google_benchmark_flags(fd_bin):
    for prog in ("fd-attn-bench", "fd-transport-bench"):
        proc = subprocess.run([fd_bin(prog), "--help"], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert "--quick" in proc.stdout and "--benchmark_filter" in proc.stdout and "--json FILE" in proc.stdout


def _report(repo_root, folder, out):
    subprocess.run([sys.executable, str(repo_root / "analysis" / "rworker_report.py"), str(folder), "--out", str(out)],
                   check=True, capture_output=True, text=True, timeout=120, cwd=repo_root)
    return out.read_text()


@pytest.mark.parametrize("machine", ["dev-machine", "gpu-machine", "dev-machine-gbench", "gpu-machine-gbench"])
def test_report_reproduces_the_committed_one(repo_root, tmp_path, machine):
    # As artifacts/rworker/README.md says it was made: from the repository root, the folder given relative.
    d = f"artifacts/rworker/{machine}"
    assert _report(repo_root, d, tmp_path / "REPORT.md") == (repo_root / d / "REPORT.md").read_text()


def test_report_reads_the_google_benchmark_format(repo_root, tmp_path, attn):
    shutil.copy(attn[0], tmp_path / attn[0].name)
    text = _report(repo_root, tmp_path, tmp_path / "REPORT.md")
    ctx = attn[1]["context"]
    assert f"{ctx['fd_cpu_model']}, 2 threads, commit `{ctx['fd_git_commit'][:12]}`" in text
    kernels = [r for r in attn[1]["benchmarks"] if r["name"].startswith("decode_attention/")]
    for r in kernels:
        isa, dt, b, c = parse(r["name"])[1]
        base = next((f for f in kernels if parse(f["name"])[1] == (isa, "fp16", b, c)), None)
        sp = f"{r['tokens_per_second'] / base['tokens_per_second']:.2f}" if base and dt != "fp16" else "—"
        row = (f"| {isa} | {dt} | {b} | {c} | {r['tokens_per_second']:.0f} | {r['bytes_per_second'] / 1e9:.1f} | "
               f"{r['ceiling_bytes_per_second'] / 1e9:.1f} | {r['ratio_to_ceiling']:.2f} | {sp} |")
        assert row in text, row
    assert any("/fp16/" in r["name"] for r in kernels) and any("/int4/" in r["name"] for r in kernels)


def test_append_rows_time_a_decode_token_against_a_copy_of_its_bytes(fd_bin, tmp_path, run_program):
    """--append: one kv_append row per KV dtype, 256 sequences; its counters are the medians they say they are."""
    out = tmp_path / "append.json"
    run_program([fd_bin("fd-attn-bench"), "--append", "--kv-dtype", "fp16", "int4", "--batch", 1, "--context", 40,
                 "--heads", H, "--kv-heads", HKV, "--head-dim", D, "--threads", 2, "--reps", REPS, "--cold-gb", COLD_GB,
                 "--benchmark_filter=kv_append", "--json", out], timeout=120)
    rows = {r["name"].split("/iterations")[0]: r for r in json.loads(out.read_text())["benchmarks"]}
    assert set(rows) == {"kv_append/fp16/B:256", "kv_append/int4/B:256"}
    for name, r in rows.items():
        assert r["token_bytes"] == 2 * HKV * D * 2, name  # K and V of one token, fp16
        assert r["ns_per_sequence"] > 0 and r["copy_ns_per_sequence"] > 0, name
        assert r["ratio_to_copy"] == pytest.approx(r["copy_ns_per_sequence"] / r["ns_per_sequence"], rel=1e-9), name
        assert r["iterations"] == REPS, name
