"""fd-sim from outside: the schedule properties on its outputs, summary.json consistent with
steps.jsonl, the step-time formula, online arrivals, and exit code 2 for bad flags.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import FIXTURES

B, S, F = 256, 256, 32
LAYERS, T_MS, R_NS, P = 32, 40.0, 2.0, 4
COST = ["--t-ms-per-step-s-part", T_MS, "--r-ns-per-token-layer", R_NS, "--layers", LAYERS, "--rworkers", P]


def sim(fd_bin, out: Path, *args, check=True):
    proc = subprocess.run([fd_bin("fd-sim"), *map(str, args), "--out", str(out)], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        pytest.fail(f"fd-sim {' '.join(map(str, args))} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def load(out: Path):
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    return steps, json.loads((out / "summary.json").read_text())


def check_consistent(steps, summary, timed=True, offline=True):
    """summary.json's numbers recomputed from steps.jsonl; with `timed`, also the step clock (see
    check_back_to_back; `offline`: every request arrived at t = 0)."""
    r = summary["results"]
    ctx = np.array([s["total_context"] for s in steps], dtype=np.float64)
    assert r["steps"] == len(steps)
    assert r["max_total_context"] == ctx.max()
    assert r["output_tokens"] == sum(s["running"] for s in steps)
    assert r["max_running"] == max(s["running"] for s in steps)
    w = r["steady_window"]
    in_win = np.array([w["first_step"] <= s["step"] <= w["last_step"] for s in steps])
    assert w["steps"] == in_win.sum()
    assert r["mean_total_context"] == pytest.approx(ctx[in_win].mean(), rel=1e-12)
    assert r["max_total_context_steady"] == ctx[in_win].max()
    assert r["mean_total_context_all"] == pytest.approx(ctx.mean(), rel=1e-12)
    assert sum(s["finished"] for s in steps) == r["finished_requests"]
    assert sum(s["admitted"] for s in steps) == r["num_requests"]
    if timed:
        for s in steps:
            assert s["step_ms"] == pytest.approx(max(s["s_ms"], s["r_ms"]), rel=1e-12)
            assert s["binds"] == ("S" if s["s_ms"] >= s["r_ms"] else "R")
        duration = steps[-1]["start_s"] + steps[-1]["step_ms"] / 1e3 - steps[0]["start_s"]
        assert r["duration_s"] == pytest.approx(duration, rel=1e-9)
        assert r["tokens_per_s"] == pytest.approx(r["output_tokens"] / duration, rel=1e-9)
        assert r["peak_step_ms"] == pytest.approx(max(s["step_ms"] for s in steps), rel=1e-12)
        assert r["s_bound_steps"] == sum(s["binds"] == "S" for s in steps)
        check_back_to_back(steps, offline)
    prov = summary["provenance"]
    for k in ("git_commit", "host", "date_utc", "command"):
        assert k in prov


def check_back_to_back(steps, offline):
    """fd-sim's clock advances only by step times (a step where nothing runs, fixed-interval waiting
    for its slot, is not recorded and takes no time), except that when nothing runs and nothing has
    arrived it jumps to the next arrival. So each step starts where the previous one ended, unless the
    previous step finished every sequence it ran (then, online, a later start is an idle gap). Offline
    everything has arrived at t = 0: no gaps at all, and the first step starts at 0."""
    if offline:
        assert steps[0]["start_s"] == 0
    for prev, cur in zip(steps, steps[1:]):
        end = prev["start_s"] + prev["step_ms"] / 1e3
        where = f"step {cur['step']} after step {prev['step']} (ended {end!r})"
        if offline or prev["running"] > prev["finished"]:
            assert cur["start_s"] == pytest.approx(end, rel=1e-12, abs=1e-12), where
        else:
            assert cur["start_s"] >= end - 1e-12, where


@pytest.fixture(scope="module")
def runs(fd_bin, tmp_path_factory):
    base = tmp_path_factory.mktemp("fd_sim")
    w_lim = B * (S + F) // 2
    modes = {
        "all-at-once": ["--mode", "all-at-once"],
        "fixed-interval": ["--mode", "fixed-interval", "--interval", F],
        "load-control": ["--mode", "load-control", "--interval", F, "--w-lim", w_lim],
        "load-control-paced": ["--mode", "load-control", "--interval", F, "--w-lim", w_lim, "--min-gap", F],
    }
    out = {}
    for name, args in modes.items():
        d = base / name
        sim(fd_bin, d, *args, "--batch", B, "--seq", S, *COST)
        out[name] = load(d)
    return out


def test_all_at_once_peaks_at_BS(runs):
    steps, summary = runs["all-at-once"]
    check_consistent(steps, summary)
    assert summary["results"]["max_total_context"] == B * S
    assert summary["results"]["predictions"]["all_at_once_peak"] == B * S


def test_fixed_interval_settles_at_half(runs):
    steps, summary = runs["fixed-interval"]
    check_consistent(steps, summary)
    r = summary["results"]
    assert r["steady_window"]["steps"] >= 2 * S
    assert r["max_total_context_steady"] == pytest.approx(B * (S + F) / 2, rel=0.01)
    assert r["mean_total_context"] == pytest.approx(B * (S + 1) / 2, rel=0.01)
    assert r["mean_running_steady"] == B
    # S is constant: half of all-at-once's peak plus B·F/2
    assert r["max_total_context"] < 0.6 * B * S


def test_load_control_never_exceeds_w_lim(runs):
    w_lim = B * (S + F) // 2
    for name in ("load-control", "load-control-paced"):
        steps, summary = runs[name]
        check_consistent(steps, summary)
        assert max(s["total_context"] for s in steps) <= w_lim
    # paced by F it is fixed-interval exactly
    assert [s["total_context"] for s in runs["load-control-paced"][0]] == [s["total_context"] for s in runs["fixed-interval"][0]]


def test_step_time_formula(runs):
    steps, summary = runs["fixed-interval"]
    for s in steps:
        assert s["s_ms"] == pytest.approx(T_MS)
        assert s["r_ms"] == pytest.approx(LAYERS * s["total_context"] * R_NS * 1e-9 / P * 1e3, rel=1e-12)
    pm = summary["results"]["perf_model"]
    t_b = T_MS / 1e3 / LAYERS
    assert pm["cpus_needed"] == pytest.approx(B * S * R_NS * 1e-9 / (2 * t_b))
    assert pm["tokens_per_s_s_bound"] == pytest.approx(B / (LAYERS * t_b))
    assert pm["tokens_per_s_r_bound"] == pytest.approx(2 * P / (LAYERS * S * R_NS * 1e-9))


def test_poisson_online_reproducible_with_latencies(fd_bin, tmp_path):
    args = ["--mode", "fixed-interval", "--batch", 64, "--seq", 64, "--interval", 8, "--requests", 300,
            "--gen-len", "uniform:16:64", "--prompt-len", "uniform:0:32", "--arrival", "poisson:40", "--seed", 5, *COST]
    sim(fd_bin, tmp_path / "a", *args)
    sim(fd_bin, tmp_path / "b", *args)
    assert (tmp_path / "a" / "steps.jsonl").read_text() == (tmp_path / "b" / "steps.jsonl").read_text()
    steps, summary = load(tmp_path / "a")
    check_consistent(steps, summary, offline=False)
    r = summary["results"]
    assert r["finished_requests"] == 300
    for k in ("ttft_ms", "tpot_ms", "itl_ms", "queue_delay_ms", "e2e_latency_ms"):
        for q in ("p50", "p90", "p99"):
            assert r[k][q] >= 0
    assert r["ttft_ms"]["p50"] >= r["queue_delay_ms"]["p50"]
    assert r["ttft_ms"]["count"] == 300


def test_trace_and_profile(fd_bin, tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps({"arrival_s": 0.1 * i, "prompt_len": 8, "gen_len": 20, "max_gen_len": 32})
                               for i in range(40)) + "\n")
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({"t_b": [[1, 0.0005], [64, 0.0006], [256, 0.001]],
                                "r_s_per_token_layer": {"fp16": 2e-9, "int8": 1e-9}, "layers": 8}))
    sim(fd_bin, tmp_path / "o", "--mode", "load-control", "--batch", 16, "--seq", 32, "--interval", 4,
        "--w-lim", 400, "--trace", trace, "--profile", prof, "--kv-dtype", "int8")
    steps, summary = load(tmp_path / "o")
    check_consistent(steps, summary, offline=False)
    assert max(s["total_context"] for s in steps) <= 400
    # Each request (20 steps of ~4 ms) is done before the next arrives 100 ms later: the batch empties
    # and the clock jumps to exactly the next arrival, the arrival of the first request admitted then.
    first_admitted = np.cumsum([0] + [s["admitted"] for s in steps])[:-1]
    gaps = [(s, int(k)) for p, s, k in zip(steps, steps[1:], first_admitted[1:])
            if s["start_s"] > p["start_s"] + p["step_ms"] / 1e3 + 1e-9]
    assert [k for _, k in gaps] == list(range(1, 40))
    for s, k in gaps:
        assert s["admitted"] == 1 and s["start_s"] == pytest.approx(0.1 * k, rel=1e-12)
    assert summary["results"]["finished_requests"] == 40
    for s in steps:  # N·T(n) from the table, N·W·R/P with the int8 R
        assert s["r_ms"] == pytest.approx(8 * s["total_context"] * 1e-9 * 1e3)
        n = s["running"]
        t = 0.0005 + (0.0001 * (n - 1) / 63 if n <= 64 else 0.0001 + 0.0004 * (n - 64) / 192)
        assert s["s_ms"] == pytest.approx(8 * t * 1e3)


def test_kv_capacity_respected(fd_bin, tmp_path):
    sim(fd_bin, tmp_path / "o", "--mode", "all-at-once", "--batch", 128, "--seq", 64,
        "--gen-len", "uniform:8:64", "--kv-capacity-tokens", 3000, *COST)
    steps, summary = load(tmp_path / "o")
    check_consistent(steps, summary)
    assert max(s["total_context"] for s in steps) <= 3000


def test_no_cost_model_gives_null_times(fd_bin, tmp_path):
    sim(fd_bin, tmp_path / "o", "--mode", "fixed-interval", "--batch", 64, "--seq", 64, "--interval", 8)
    steps, summary = load(tmp_path / "o")
    check_consistent(steps, summary, timed=False)
    assert summary["results"]["tokens_per_s"] is None
    assert summary["notes"]


@pytest.mark.parametrize("args, message", [
    (["--mode", "load-control", "--batch", 8, "--seq", 8], "--w-lim"),
    (["--mode", "sls", "--batch", 8, "--seq", 8], "--mode"),
    (["--mode", "all-at-once", "--batch", 0, "--seq", 8], "--batch"),
    (["--mode", "all-at-once", "--batch", 8, "--seq", 8, "--gen-len", "uniform:5"], "--gen-len"),
    (["--mode", "all-at-once", "--batch", 8, "--seq", 8, "--gen-len", "uniform:9:5"], "--gen-len"),
    (["--mode", "all-at-once", "--batch", 8, "--seq", 8, "--arrival", "poisson:3"], "cost model"),
    (["--mode", "all-at-once", "--batch", 8, "--seq", 8, "--arrival", "bursty"], "--arrival"),
    (["--mode", "all-at-once", "--batch", 8, "--seq", 8, "--r-ns-per-token-layer", 3], "--layers"),
    (["--mode", "all-at-once", "--batch", 8, "--seq", 8, "--w-lim", 100], "load-control only"),
    (["--mode", "load-control", "--batch", 8, "--seq", 8, "--w-lim", 5], "could never start"),
    (["--mode", "all-at-once", "--batch", 8, "--seq", 8, "--t-b-ms", "64:1,32:2", "--layers", 2], "strictly increasing"),
])
def test_bad_flags_exit_2(fd_bin, tmp_path, args, message):
    proc = sim(fd_bin, tmp_path / "o", *args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert not (tmp_path / "o" / "summary.json").exists()


def test_bad_trace_names_file_and_line(fd_bin, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0, "prompt_len": 1, "gen_len": 2}\n{"arrival_s": 1, "prompt_len": 1}\n')
    proc = sim(fd_bin, tmp_path / "o", "--mode", "all-at-once", "--batch", 4, "--seq", 4, "--trace", trace,
               "--t-ms-per-step-s-part", 1, check=False)
    assert proc.returncode == 2
    assert f"{trace}:2: missing key 'gen_len'" in proc.stderr


def test_help(fd_bin):
    proc = subprocess.run([fd_bin("fd-sim"), "--help"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0
    for flag in ("--mode", "--w-lim", "--profile", "--trace", "--kv-capacity-tokens"):
        assert flag in proc.stdout


def test_a_service_profile_steps_with_the_one_model(fd_bin, tmp_path):
    """Issue 41: with a profile that has R-workers in service (r_service), fd-sim's step is fastdecode/sched/perf_model.h's
    predict_step — the number `fd-bench predict` gives for the step's B and mean context — and --rworkers must be the
    profile's workers x threads."""
    prof = FIXTURES / "profiles" / "profile_llama-2-7b_cuda_svc4x3.json"
    sim(fd_bin, tmp_path / "o", "--mode", "fixed-interval", "--batch", 64, "--seq", 64, "--interval", 8, "--prompt-len", 448,
        "--requests", 128, "--profile", prof, "--layers", 2, "--rworkers", 12)
    steps, summary = load(tmp_path / "o")
    assert summary["config"]["cost"]["model"] == "predict_step (r_service)"
    picked = [s for s in steps if s["running"] > 0][::7][:6]
    assert picked
    for s in picked:
        p = subprocess.run([fd_bin("fd-bench"), "predict", "--profile", str(prof), "--batch", str(s["running"]), "--context",
                            repr(s["total_context"] / s["running"]), "--layers", "2", "--json", "-"],
                           capture_output=True, text=True, check=True)
        want = json.loads(p.stdout)
        assert s["step_ms"] == pytest.approx(1e3 * want["step_s"], rel=1e-9)
        assert s["r_ms"] == pytest.approx(2e3 * want["r_layer_s"], rel=1e-9)
    bad = sim(fd_bin, tmp_path / "b", "--mode", "all-at-once", "--batch", 16, "--seq", 16, "--profile", prof, "--layers", 2,
              "--rworkers", 6, check=False)
    assert bad.returncode == 2 and "4 x 3 threads = 12 CPUs" in bad.stderr


def reference_placement(steps, n_workers, prompt, gen):
    """Per-step busiest / mean worker KV of a fixed-length run, placed by docs/SCHEDULING.md's rule ("Placement")
    written out here by direct summation: a new sequence goes to the worker minimising sum over its running sequences
    of sum_{t < min(gen, rem)} (len + t)(prompt + t), among those whose projected load stays within the mean after the
    placement plus the longest sequence; ties to the smaller projected load, then the lower index."""
    running = []  # [worker, admit_step]
    load = [0] * n_workers
    out = []
    for s in steps:
        step = s["step"]
        for _ in range(s["admitted"]):
            cost = [0.0] * n_workers
            for w, a in running:
                done = step - a
                length = prompt + done - 1 if done > 0 else prompt
                m = min(gen, gen - done)
                t = np.arange(m, dtype=np.float64)
                cost[w] += float(((length + t) * (prompt + t)).sum())
            need = prompt + gen
            bound = (sum(load) + need) / n_workers + need
            ok = [w for w in range(n_workers) if load[w] + need <= bound]
            best = min(ok, key=lambda w: (cost[w], load[w], w))
            running.append([best, step])
            load[best] += need
        kv = [0] * n_workers
        for w, a in running:
            if a < step:
                kv[w] += prompt + (step - a)
        out.append(max(kv) * n_workers / sum(kv) if sum(kv) else 0.0)
        for r in [r for r in running if step - r[1] + 1 == gen]:
            running.remove(r)
            load[r[0]] -= prompt + gen
    return out


@pytest.mark.parametrize("gen", [992, 736])
def test_sequences_are_placed_on_workers_as_the_engine_places_them(fd_bin, tmp_path, gen):
    # Fixed-interval with B*F/S = 64*64/992 = 4.13 (or 64*64/736 = 5.57) sequences a slot over 4 workers (Fig. 11's
    # runs): a slot that does not divide by 4 leaves a worker a sequence more, so busiest / mean stays above 1 (about
    # 1.06, 1.05) in steady state. At 736 placing by projected load alone (no overlap term) differs from the rule.
    args = ["--mode", "fixed-interval", "--batch", 64, "--seq", gen, "--interval", 64, "--prompt-len", 32, "--requests", 128]
    out = tmp_path / "w4"
    sim(fd_bin, out, *args, *COST, "--workers", 4)
    steps, summary = load(out)
    check_consistent(steps, summary)
    ref = reference_placement(steps, 4, 32, gen)
    got = [s.get("worker_kv_imbalance", 0.0) for s in steps]
    assert got == pytest.approx(ref, rel=1e-12)
    imb = summary["results"]["worker_kv_imbalance"]
    w = summary["results"]["steady_window"]
    steady = [g for s, g in zip(steps, got) if w["first_step"] <= s["step"] <= w["last_step"] and s["prefill_tokens"] == 0]
    assert imb["steady"]["count"] == len(steady) and imb["steady"]["max"] == pytest.approx(max(steady))
    assert 1.03 < imb["steady"]["p50"] < 1.08
    # The R part is the busiest worker's: the even share N*W*R/P times busiest / mean.
    for s, g in zip(steps, got):
        assert s["r_ms"] == pytest.approx(LAYERS * s["total_context"] * R_NS * 1e-6 / P * max(1.0, g), rel=1e-12)
    assert summary["config"]["cost"]["workers"] == 4
    # Without workers the R-Part is shared evenly and no imbalance is recorded.
    sim(fd_bin, tmp_path / "w0", *args, *COST)
    steps0, summary0 = load(tmp_path / "w0")
    assert "worker_kv_imbalance" not in summary0["results"] and all("worker_kv_imbalance" not in s for s in steps0)


@pytest.mark.parametrize("b,s,f,same", [(1024, 1024, 64, True), (100, 25, 10, False), (64, 992, 64, False)])
def test_paced_load_control_is_fixed_interval_only_when_the_slots_are_whole(fd_bin, tmp_path, b, s, f, same):
    # docs/SCHEDULING.md: load-control with W_lim = B(S+F)/2 and min_gap = F admits as fixed-interval does, step for step,
    # when F divides S and B*F/S is a whole number; with S/F = 2.5 (100, 25, 10) or B*F/S = 4.13 (Fig. 11's 64, 992, 64)
    # the two schedules differ.
    n = 4 * b
    sim(fd_bin, tmp_path / "fi", "--mode", "fixed-interval", "--batch", b, "--seq", s, "--interval", f, "--requests", n)
    sim(fd_bin, tmp_path / "lc", "--mode", "load-control", "--batch", b, "--seq", s, "--interval", f, "--requests", n,
        "--w-lim", b * (s + f) // 2, "--min-gap", f)
    key = lambda out: [(x["step"], x["admitted"], x["total_context"]) for x in load(out)[0]]
    assert (key(tmp_path / "fi") == key(tmp_path / "lc")) == same


def test_goodput_as_fd_bench_reports_it(fd_bin, tmp_path):
    # All-at-once, B = 4, 10 tokens each, 10 ms a step, 8 requests: the first batch's TTFT is 10 ms (e2e 100 ms), the
    # second's 110 ms (e2e 200 ms). With TTFT <= 50 ms: 4 of 8 good, 4 requests and 40 tokens over 0.2 s.
    sim(fd_bin, tmp_path / "a", "--mode", "all-at-once", "--batch", 4, "--seq", 10, "--requests", 8,
        "--t-ms-per-step-s-part", 10, "--slo", "ttft:50")
    slo = load(tmp_path / "a")[1]["results"]["slo"]
    assert slo["limits"] == {"ttft_ms": 50.0, "tpot_ms": None, "e2e_ms": None}
    assert slo["good_requests"] == 4 and slo["attainment"] == 0.5
    assert slo["goodput_requests_per_s"] == pytest.approx(20.0) and slo["goodput_tokens_per_s"] == pytest.approx(200.0)
    # TPOT is 10 ms for every request: a 9.9 ms limit fails them all; e2e <= 150 ms keeps the first batch.
    sim(fd_bin, tmp_path / "b", "--mode", "all-at-once", "--batch", 4, "--seq", 10, "--requests", 8,
        "--t-ms-per-step-s-part", 10, "--slo", "tpot:9.9")
    assert load(tmp_path / "b")[1]["results"]["slo"]["good_requests"] == 0
    sim(fd_bin, tmp_path / "c", "--mode", "all-at-once", "--batch", 4, "--seq", 10, "--requests", 8,
        "--t-ms-per-step-s-part", 10, "--slo", "e2e:150")
    assert load(tmp_path / "c")[1]["results"]["slo"]["good_requests"] == 4
    bad = sim(fd_bin, tmp_path / "d", "--mode", "all-at-once", "--batch", 4, "--seq", 10, "--slo", "ttft=5", check=False)
    assert bad.returncode == 2 and "expected ttft:MS" in bad.stderr and not (tmp_path / "d").exists()
