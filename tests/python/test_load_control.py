"""Load control (schedule mode "load-control", docs/SCHEDULING.md) through `fd-bench run`, end to end.

The scheduler itself is tested in tests/unit/test_schedule.cpp and through fd-sim; here the whole
harness runs it with an engine, and what it did is read back from the run folder only:

* the admission step of every request (steps.jsonl: `sched_step`, `admitted`; FIFO, so request ids in
  order), cross-checked against requests.jsonl (first token at the end of that step, last token at the
  end of step a + g - 1: the lives the scheduler assumes);
* the W_lim bound as SCHEDULING.md defines it: at every step t, W(t) = sum of ctx = p + k over the
  running sequences (k = tokens so far) never exceeds W_lim; at every admission step the projected
  load (running sequences to their max_gen_len) stays <= W_lim for every future step; and the engine's
  own `total_context` (KV attended, p + k - 1 each) is that W minus one per running sequence;
* the admission steps equal those of a brute-force simulation of the definition written here (the
  earliest step at which a micro-batch of m = ceil(B*F/S) fits, several per step unless paced by
  min_gap; the longest fitting prefix when nothing runs);
* every request finishes with its trace's gen_len (the scheduler is told a larger max_gen_len for some:
  early finishes free their projected load);
* all-at-once on the same trace admits everything at step 0, overshoots W_lim, and gives the same tokens.

The workload is a trace of 12 requests all arriving at t = 0 (offline), so nothing depends on timing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from test_harness import bench, read_jsonl, write_config

# (prompt_len p, gen_len g = tokens generated, max_gen_len G = what the scheduler projects with)
TRACE = [(5, 6, 6), (3, 9, 9), (8, 4, 7), (6, 7, 7), (4, 10, 10), (9, 5, 5),
         (2, 8, 12), (7, 6, 6), (5, 9, 9), (3, 3, 8), (10, 7, 7), (6, 5, 5)]
B, S, F, W_LIM = 4, 10, 4, 53
M = math.ceil(B * F / S)  # the default micro-batch, 2
LOAD_CONTROL = {"mode": "load-control", "batch": B, "seq": S, "interval": F, "w_lim": W_LIM}
PACED = dict(LOAD_CONTROL, min_gap=F)
REFERENCE = {"type": "reference", "threads": 1}


def write_trace(path: Path) -> Path:
    path.write_text("".join(json.dumps({"arrival_s": 0.0, "prompt_len": p, "gen_len": g, "max_gen_len": G}) + "\n"
                            for p, g, G in TRACE))
    return path


def run(fd_bin, models_dir, tmp: Path, name: str, schedule=None, engine=REFERENCE):
    cfg = {"name": name,
           "model": {"config": "MODELS/tiny-llama-gqa.json", "weights": {"seed": 2, "dtype": "bf16"}},
           "workload": {"arrival": "trace", "trace": str(write_trace(tmp / "trace.jsonl")), "seed": 4},
           "engine": engine}
    if schedule is not None:
        cfg["schedule"] = schedule
    bench(fd_bin, "run", write_config(tmp / f"{name}.json", models_dir, cfg), "--out", tmp / name, "--quiet")
    d = tmp / name
    return read_jsonl(d / "steps.jsonl"), read_jsonl(d / "requests.jsonl"), json.loads((d / "summary.json").read_text())


def admissions(steps):
    """{request id: scheduler step it was admitted at}, from steps.jsonl alone (FIFO: ids in order)."""
    adm, nxt = {}, 0
    for s in steps:
        for _ in range(s["admitted"]):
            adm[nxt] = s["sched_step"]
            nxt += 1
    return adm


def ctx(i, a, t):
    """ctx = p + k of request i admitted at step a, at step t (k = t - a + 1); 0 when not running."""
    p, g, _ = TRACE[i]
    return p + t - a + 1 if a <= t <= a + g - 1 else 0


def projected(i, a, t):
    """The scheduler's projection: request i runs to its max_gen_len G."""
    p, _, G = TRACE[i]
    return p + t - a + 1 if a <= t <= a + G - 1 else 0


def simulate_load_control(w_lim, m, min_gap=0):
    """Admission steps by the definition (docs/SCHEDULING.md, offline: everything has arrived): at step s
    the next micro-batch (the next m in FIFO order) starts iff with it W_proj(t) <= w_lim for every
    t >= s, running sequences projected to their max length; repeat at the same step (once per step
    when paced, and not before the previous admission + min_gap). A sequence's load is gone from the
    step after its actual last token."""
    queue, running, adm, last, s = list(range(len(TRACE))), {}, {}, None, 0

    def fits(batch):
        alive = {**running, **{i: s for i in batch}}
        end = max(a + TRACE[i][2] - 1 for i, a in alive.items())
        return all(sum(projected(i, a, t) for i, a in alive.items()) <= w_lim for t in range(s, end + 1))

    while queue or running:
        running = {i: a for i, a in running.items() if a + TRACE[i][1] - 1 >= s}
        while queue and not (min_gap and last is not None and s < last + min_gap):
            batch = queue[:m]
            if not fits(batch):
                # (the progress guarantee, a prefix when nothing runs, is never needed by this trace)
                assert running, f"step {s}: a whole micro-batch exceeds w_lim with nothing running"
                break
            for i in batch:
                adm[i] = running[i] = s
            queue = queue[len(batch):]
            last = s
            if min_gap:
                break
        s += 1
    return adm


def check_run(steps, reqs, summary, w_lim=None):
    """What every schedule must give: each request's life as the scheduler assumes it, its full
    gen_len, consistent step lines; with w_lim, the load-control bound on actual and projected load."""
    n = len(TRACE)
    adm = admissions(steps)
    assert sorted(adm) == list(range(n)), "every request admitted once"
    by_sched = {s["sched_step"]: s for s in steps}
    assert len(by_sched) == len(steps)
    assert [s["step"] for s in steps] == list(range(len(steps)))
    assert [r["id"] for r in reqs] == list(range(n))
    for r, (p, g, _) in zip(reqs, TRACE):
        assert (r["prompt_len"], r["output_len"], len(r["tokens"])) == (p, g, g), r["id"]
        a = adm[r["id"]]
        first, last = by_sched[a], by_sched[a + g - 1]  # the life a .. a+g-1 (reference engine: no deferral)
        assert r["ttft_ms"] == pytest.approx(first["start_ms"] + first["step_ms"], abs=1e-3), r["id"]
        assert r["e2e_ms"] == pytest.approx(last["start_ms"] + last["step_ms"], abs=1e-3), r["id"]
    assert summary["results"]["output_tokens"] == sum(g for _, g, _ in TRACE)
    assert sum(s["finished"] for s in steps) == n
    admitted_so_far = 0
    for s in steps:
        t = s["sched_step"]
        alive = [i for i, a in adm.items() if ctx(i, a, t)]
        admitted_so_far += s["admitted"]
        assert s["running"] == len(alive), t
        assert s["queued"] == n - admitted_so_far, t
        assert s["finished"] == sum(adm[i] + TRACE[i][1] - 1 == t for i in alive), t
        assert s["prefill_tokens"] == sum(TRACE[i][0] for i in alive if adm[i] == t), t
        # the engine counts the KV attended, p + k - 1 per sequence: W(t) less one per running sequence
        assert s["total_context"] == sum(ctx(i, adm[i], t) for i in alive) - len(alive), t
    if w_lim is None:
        return adm
    for s in steps:  # actual W(t) = sum of p + k over the running sequences
        assert s["total_context"] + s["running"] <= w_lim, s
    for a0 in sorted(set(adm.values())):  # at each admission step: projected load <= W_lim from there on
        alive = {i: a for i, a in adm.items() if a <= a0 <= a + TRACE[i][1] - 1}
        end = max(a + TRACE[i][2] - 1 for i, a in alive.items())
        for t in range(a0, end + 1):
            assert sum(projected(i, a, t) for i, a in alive.items()) <= w_lim, (a0, t)
    return adm


@pytest.fixture(scope="module")
def ref_runs(fd_bin, models_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("load_control")
    return {name: run(fd_bin, models_dir, tmp, name, sch)
            for name, sch in (("all-at-once", None), ("load-control", LOAD_CONTROL), ("paced", PACED))}


def test_simulation_of_the_definition_is_not_vacuous():
    """The trace and limits are chosen so that equality with the simulation pins the policy: all at
    once would overshoot W_lim by far; W_lim - 1 or W_lim + 1 would admit at other steps (an
    off-by-one in the bound shows), and so would min_gap F - 1 or F + 1; the greedy rule starts several
    micro-batches in one step, and pacing changes that."""
    every = {i: 0 for i in range(len(TRACE))}
    assert max(sum(ctx(i, 0, t) for i in every) for t in range(12)) > 2 * W_LIM
    greedy, paced = simulate_load_control(W_LIM, M), simulate_load_control(W_LIM, M, F)
    for w in (W_LIM - 1, W_LIM + 1):
        assert simulate_load_control(w, M) != greedy, w
    for gap in (F - 1, F + 1):
        assert simulate_load_control(W_LIM, M, gap) != paced, gap
    assert greedy != paced and len(set(greedy.values())) >= 4 and max(greedy.values()) > S
    assert any(list(greedy.values()).count(a) > M for a in greedy.values())  # several micro-batches at once


def test_load_control_keeps_w_lim(ref_runs):
    steps, reqs, summary = ref_runs["load-control"]
    adm = check_run(steps, reqs, summary, W_LIM)
    assert adm == simulate_load_control(W_LIM, M)
    # W_lim binds: some step runs at it exactly
    assert max(s["total_context"] + s["running"] for s in steps) == W_LIM
    assert summary["config"]["schedule"] == {**LOAD_CONTROL, "micro_batch": 0, "min_gap": 0, "max_running": 0,
                                             "kv_capacity_tokens": 0}


def test_paced_load_control_spaces_micro_batches(ref_runs):
    steps, reqs, summary = ref_runs["paced"]
    adm = check_run(steps, reqs, summary, W_LIM)
    assert adm == simulate_load_control(W_LIM, M, F)
    starts = [s["sched_step"] for s in steps if s["admitted"]]
    assert all(b - a >= F for a, b in zip(starts, starts[1:])), starts
    assert all(s["admitted"] <= M for s in steps)


def test_all_at_once_same_tokens_other_admissions(ref_runs):
    steps, reqs, summary = ref_runs["all-at-once"]
    adm = check_run(steps, reqs, summary)
    assert set(adm.values()) == {0}
    assert max(s["total_context"] + s["running"] for s in steps) > W_LIM  # what load control prevents
    tokens = [r["tokens"] for r in reqs]
    for name in ("load-control", "paced"):
        assert admissions(ref_runs[name][0]) != adm
        assert [r["tokens"] for r in ref_runs[name][1]] == tokens, name


def test_load_control_with_fastdecode_engine(ref_runs, fd_bin, models_dir, tmp_path):
    """The same schedule with the FastDecode engine (CPU S-Part, two spawned R-workers, fp16 KV): the same
    admissions and bound; its tokens are the reference engine's with an fp16 KV-cache."""
    fd = {"type": "fastdecode", "backend": "cpu", "threads": 1,
          "rworkers": {"spawn": 2, "threads": 1, "kv_dtype": "fp16", "memory_gb": 0.1}}
    steps, reqs, summary = run(fd_bin, models_dir, tmp_path, "fd", LOAD_CONTROL, fd)
    assert summary["results"]["kv_capacity_tokens"] > W_LIM  # derived from memory; W_lim is what binds
    adm = check_run(steps, reqs, summary, W_LIM)
    assert adm == simulate_load_control(W_LIM, M)
    _, ref, _ = run(fd_bin, models_dir, tmp_path, "ref16", None, dict(REFERENCE, kv_dtype="fp16"))
    assert [r["tokens"] for r in reqs] == [r["tokens"] for r in ref]
