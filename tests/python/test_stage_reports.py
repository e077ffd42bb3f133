"""The analysis scripts of issues 17 and 18 on synthetic sweep folders: analysis/hybrid_grid.py (the grid and
--online), analysis/prefill_ttft.py and analysis/pipeline_bound.py compute the ratios their reports state."""
import importlib.util
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "analysis"))


def module(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "analysis", name + ".py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def write_sweep(root, points):
    """points: {point name: [(summary dict, [step dicts]), ...]} -> root/index.json and root/<point>/repK/."""
    index = {"points": []}
    for name, runs in points.items():
        entry = {"name": name, "runs": []}
        for k, (summary, steps) in enumerate(runs, 1):
            d = root / name / ("rep%d" % k)
            d.mkdir(parents=True)
            (d / "summary.json").write_text(json.dumps(summary))
            (d / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
            entry["runs"].append({"status": "ok", "dir": "%s/rep%d" % (name, k), "headline": {}})
        index["points"].append(entry)
    root.mkdir(parents=True, exist_ok=True)
    (root / "index.json").write_text(json.dumps(index))


def test_prefill_ttft_against_fp16(tmp_path):
    def run(ttft, pre, dec):
        summary = {"results": {"ttft_ms": {"p50": ttft, "mean": ttft}}}
        steps = [{"prefill_tokens": 100, "decode_tokens": 0, "step_ms": pre},
                 {"prefill_tokens": 0, "decode_tokens": 8, "step_ms": dec}]
        return summary, steps
    write_sweep(tmp_path / "s", {"kv-fp16": [run(100.0, 90.0, 10.0), run(110.0, 95.0, 10.0)],
                                 "kv-int8": [run(105.0, 92.0, 7.0)], "kv-int4": [run(150.0, 140.0, 6.0)]})
    assert module("prefill_ttft").main([str(tmp_path / "s")]) == 0
    rows = {r["kv_dtype"]: r for r in json.loads((tmp_path / "s" / "prefill_ttft.json").read_text())}
    assert rows["fp16"]["ttft_p50"] == pytest.approx(105.0)  # median of the two repeats
    assert rows["int8"]["ttft_mean_vs_fp16"] == pytest.approx(1.0)
    assert rows["int4"]["ttft_mean_vs_fp16"] == pytest.approx(150.0 / 105.0)
    assert rows["int4"]["decode_step_ms_vs_fp16"] == pytest.approx(0.6)
    assert "NOT met" in (tmp_path / "s" / "prefill_ttft.md").read_text()  # int4 at 1.43x


def test_pipeline_bound_is_step_over_the_busier_side(tmp_path):
    def step(ms, s, r):
        return {"decode_tokens": 256, "prefill_tokens": 0, "step_ms": ms,
                "breakdown_ms": {"s_compute": s, "r_compute_max": r, "r_wait": r - s, "d2h": 0.1, "h2d": 0.3,
                                 "wire": 0.5, "idle": ms - s, "send": 0.25}}
    write_sweep(tmp_path / "p", {
        "layers-2": [({"model": {"layers": 2}}, [step(12.0, 2.0, 10.0), step(13.0, 2.0, 10.0), step(11.0, 2.0, 10.0)])],
        "layers-8": [({"model": {"layers": 8}}, [step(41.0, 40.0, 30.0), step(42.0, 40.0, 30.0)])]})
    assert module("pipeline_bound").main([str(tmp_path / "p")]) == 0
    rows = {r["layers"]: r for r in json.loads((tmp_path / "p" / "pipeline_bound.json").read_text())}
    assert rows[2]["ratio_median"] == pytest.approx(1.2) and rows[2]["ratio_max"] == pytest.approx(1.3)
    assert rows[8]["ratio_median"] == pytest.approx(1.0375)  # S-Part-bound: the step over s_compute
    assert rows[8]["wire"] == pytest.approx(0.5) and rows[8]["h2d"] == pytest.approx(0.3)
    assert rows[8]["send"] == pytest.approx(0.25)
    assert "target <= 1.05: met" in (tmp_path / "p" / "pipeline_bound.md").read_text()


def test_hybrid_grid_cells_and_online(tmp_path):
    hg = module("hybrid_grid")

    def run(batch, step_ms, cpu=0):
        summary = {"model": {"name": "llama-2-7b"}}
        steps = [{"decode_tokens": batch, "prefill_tokens": 0, "step_ms": step_ms, "breakdown_ms": {"modelled_step": 1.0},
                  "counts": {"cpu_seqs": cpu, "gpu_seqs": batch - cpu}} for _ in range(3)]
        return summary, steps
    write_sweep(tmp_path / "g", {"mem-24_cores-4_run-gpu-only-512": [run(32, 1.0), run(32, 1.2)],
                                 "mem-24_cores-4_run-fastdecode-512": [run(252, 100.0)],
                                 "mem-24_cores-4_run-hybrid-512": [run(32, 1.05, cpu=2)]})
    assert hg.main([str(tmp_path / "g"), "--fd-bench", "/nonexistent/fd-bench"]) == 0
    (row,) = json.loads((tmp_path / "g" / "hybrid_grid.json").read_text())
    assert row["cores"] == 4 and row["context"] == 512
    go = (32 / 1.0e-3 + 32 / 1.2e-3) / 2  # the median of the repeats' steady rates (two: their mean)
    assert row["gpu-only"]["steady_tokens_per_s"] == pytest.approx(go)
    assert row["hybrid_vs_best"] == pytest.approx((32 / 1.05e-3) / go)
    assert row["hybrid"]["cpu_seqs_max"] == 2 and row["meets_0.98"]
    assert "error" in row.get("modelled", {"error": "no fd-bench"})  # no prior in this summary: named, not a crash

    def online_run(tok_s, tpot50, tpot99):
        summary = {"results": {"output_throughput": tok_s, "request_throughput": 1.0, "duration_s": 10.0,
                               "tpot_ms": {"p50": tpot50, "p99": tpot99, "mean": tpot50},
                               "ttft_ms": {"p50": 50.0, "p99": 90.0, "mean": 60.0}, "queue_ms": {"p50": 1.0}}}
        return summary, run(4, 1.0)[1]
    write_sweep(tmp_path / "o", {"run-gpu-only": [online_run(3600.0, 0.5, 0.9)], "run-fastdecode": [online_run(1500.0, 33.0, 69.0)],
                                 "run-hybrid": [online_run(3610.0, 0.51, 0.6)]})
    assert hg.main([str(tmp_path / "o"), "--online"]) == 0
    rows = {r["engine"]: r for r in json.loads((tmp_path / "o" / "hybrid_online.json").read_text())}
    assert set(rows) == {"gpu-only", "fastdecode", "hybrid"}
    assert rows["fastdecode"]["tpot_ms"]["p99"] == 69.0 and rows["hybrid"]["output_tokens_per_s"] == 3610.0
    assert rows["hybrid"]["cpu_seqs_max"] == 0


def test_gpu_roofline_formula():
    """bytes = L*(w_layer + b*ctx*kv) + w_head, flops = 2*b*(L*p_layer + p_head) + 4*L*b*ctx*d; the larger time."""
    gr = module("gpu_roofline")
    t, nbytes, flops = gr.roofline("llama-2-7b", 2, 64, 528, 4.41e12, 8.94e14)
    assert nbytes == pytest.approx(2 * (2 * 202.4e6 + 64 * 528 * 16384) + 2 * 32000 * 4096)
    assert flops == pytest.approx(2 * 64 * (2 * 202.4e6 + 32000 * 4096) + 4 * 2 * 64 * 528 * 4096)
    assert t == pytest.approx(nbytes / 4.41e12)  # memory-bound at B = 64
    t2, _, _ = gr.roofline("llama-2-7b", 2, 64, 528, 4.41e12, 1e12)  # a slow tensor core: compute-bound
    assert t2 == pytest.approx(flops / 1e12)


def test_gpu_roofline_takes_the_steady_batch():
    """A window of 30 steps at 252 rows and 31 steps of a 4-row tail is judged at 252, not at a mean batch of 126."""
    from fd_runs import steady_steps
    steps = [{"decode_tokens": 252, "step_ms": 1.7}] * 30 + [{"decode_tokens": 4, "step_ms": 0.47}] * 31
    got = steady_steps(steps)
    assert len(got) == 30 and {x["decode_tokens"] for x in got} == {252}
    assert steady_steps([]) == []


def test_gpu_roofline_judges_the_step_period(tmp_path):
    """The step judged is the period from one decode step's start to the next's (what the run's throughput sees), not
    the step() call: with asynchronous stepping the call returns while the next step runs. 20 steps of 64 rows
    started 0.70 ms apart, each call 0.55 ms: judged at 0.70; a run without start_ms falls back to the call."""
    gr = module("gpu_roofline")
    bal = tmp_path / "balance.json"
    bal.write_text(json.dumps({"benchmarks": [{"name": "balance/read/all/x", "bytes_per_second": 4.4e12},
                                              {"name": "balance/gemm_fp16/all/x", "flop_per_second": 8.9e14}]}))
    for name, with_start in (("a", True), ("b", False)):
        d = tmp_path / name / "full" / "llama-2-7b" / "steady" / "gpu-only-b64"
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"model": {"name": "llama-2-7b", "layers": 2}, "config": {}}))
        steps = [{"step": 0, "start_ms": 0.0, "prefill_tokens": 64 * 500, "decode_tokens": 0, "step_ms": 50.0}]
        for i in range(1, 21):
            x = {"step": i, "prefill_tokens": 0, "decode_tokens": 64, "total_context": 64 * 528, "step_ms": 0.55,
                 "breakdown_ms": {"gpu_decode": 0.66}}
            if with_start:
                x["start_ms"] = 50.0 + 0.70 * (i - 1)
            steps.append(x)
        (d / "steps.jsonl").write_text("".join(json.dumps(x) + "\n" for x in steps))
        assert gr.main(["--baselines", str(tmp_path / name), "--balance-bench", str(bal), "--paper", str(tmp_path / "no-paper"),
                        "--out", str(tmp_path / ("o" + name))]) == 0
        r = json.loads((tmp_path / ("o" + name) / "gpu_roofline.json").read_text())["rows"][0]
        want = 0.70 if with_start else 0.55
        assert r["step_ms"] == pytest.approx(0.55) and r["period_ms"] == pytest.approx(want)
        assert r["period_from"] == ("start_ms" if with_start else "step_ms")
        assert r["step_vs_roofline"] == pytest.approx(want / r["roofline_ms"])


def test_kernel_profile_cuts_decode_steps_at_argmax(tmp_path):
    """ncu's raw CSV (a units row, thousands separators): a prefill step is left out, each decode step's kernels summed
    per name, and the step's wall time without ncu set against the kernels' sum."""
    kp = module("kernel_profile")
    head = '"ID","Kernel Name","gpu__time_duration.sum"\n"","","usecond"\n'
    seq = [("prefill_kernel(float const*)", 900.0), ("void fd::cuda::decode_split_kernel<128, 1, false>(DecodeArgs)", 7.0),
           ("argmax_kernel(float const*, long, int*)", 5.0)]  # a step with a prefill in it: not a decode step
    for _ in range(3):
        seq += [("void fd::<unnamed>::rmsnorm_kernel<__half>(float *, const T1 *)", 4.0), ("sm90_xmma_gemm_f16f16_f32", 100.0),
                ("void fd::<unnamed>::decode_split_kernel<128, 1, 0>(fd::<unnamed>::DecodeArgs)", 500.0),
                ("void fd::<unnamed>::rmsnorm_kernel<__half>(float *, const T1 *)", 4.0), ("argmax_kernel(float const*, long, int*)", 1000.0)]
    seq += [("nvjet_other_tile", 50.0), ("void fd::<unnamed>::decode_split_kernel<128, 1, 0>(fd::<unnamed>::DecodeArgs)", 9.0),
            ("argmax_kernel(float const*, long, int*)", 1.0)]  # a tail step of another batch: other kernels, left out
    rows = "".join('"%d","%s","%s"\n' % (i, n, ("%.1f" % t).replace("1000.0", "1,000.0")) for i, (n, t) in enumerate(seq))
    (tmp_path / "k.csv").write_text("==PROF== Connected\n" + head + rows)
    run = tmp_path / "run"
    run.mkdir()
    (run / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in
                                             [{"prefill_tokens": 0, "decode_tokens": 8, "step_ms": 2.0}] * 3))
    assert kp.main([str(tmp_path / "k.csv"), "--runs", str(run), "--out", str(tmp_path / "o")]) == 0
    p = json.loads((tmp_path / "o" / "kernel_profile.json").read_text())[0]
    assert p["steps"] == 3 and p["decode_steps"] == 4
    k = {x["name"]: x for x in p["kernels"]}
    assert set(k) == {"rmsnorm_kernel", "sm90_xmma_gemm_f16f16_f32", "decode_split_kernel", "argmax_kernel"}
    assert k["rmsnorm_kernel"]["launches"] == 2 and k["rmsnorm_kernel"]["ms"] == pytest.approx(0.008)
    assert k["argmax_kernel"]["ms"] == pytest.approx(1.0)
    assert p["total_ms"] == pytest.approx(0.008 + 0.1 + 0.5 + 1.0)
    assert p["groups_ms"] == pytest.approx({"attention": 0.5, "gemm": 0.1, "other": 1.008})
    assert p["step_ms"] == 2.0


def test_stage_targets_committed_table_is_current(tmp_path):
    """artifacts/stages/TARGETS.md is what analysis/stages_targets.py makes of the committed results: a result file
    that changes without the table being regenerated fails here."""
    st = module("stages_targets")
    assert st.main(["--out", str(tmp_path)]) == 0
    committed = open(os.path.join(REPO, "artifacts", "stages", "TARGETS.md"), encoding="utf-8").read()
    assert (tmp_path / "TARGETS.md").read_text(encoding="utf-8") == committed


def test_stage_targets_verdicts(tmp_path):
    """A target is met only when every point meets it; the ranges are the points'."""
    st = module("stages_targets")
    assert st.verdict([1.0, 1.2], lambda v: v <= 1.2) == ("1.00-1.20", True)
    assert st.verdict([1.0, 1.21], lambda v: v <= 1.2) == ("1.00-1.21", False)
    assert st.verdict([], lambda v: True) == ("no point measured", False)
    pipe = tmp_path / "pipe.json"
    pipe.write_text(json.dumps([{"layers": 2, "ratio_median": 1.3, "has_copy_fields": True},
                                {"layers": 8, "ratio_median": 1.04, "has_copy_fields": True},
                                {"layers": 16, "ratio_median": 1.06, "has_copy_fields": True}]))
    row = st.pipeline_row(str(pipe))
    assert row[2] == "1.04-1.06x" and row[3] is False  # the 2-layer point is outside the target's range
    roof = tmp_path / "roof.json"
    roof.write_text(json.dumps({"rows": [{"engine": "gpu-only", "requested_batch": 16, "step_vs_roofline": 1.9},
                                         {"engine": "gpu-only", "requested_batch": 64, "step_vs_roofline": 1.25},
                                         {"engine": "paged-swap", "requested_batch": 64, "step_vs_roofline": 1.31}]}))
    tr = tmp_path / "transport.json"  # the shm lane judged where the file has it, the sockets beside
    rt = lambda t, links, v: {"name": "round_trip/%s/io:1/links:%d/size:4M" % (t, links), "links": links, "GBps_per_link": v}
    tr.write_text(json.dumps({"benchmarks": [rt("ipc", 4, 1.3), rt("tcp", 4, 1.5), rt("shm", 4, 4.2), rt("shm", 4, 5.0),
                                             rt("shm", 1, 0.5)]}))
    row = st.transport_row(str(tr))
    assert row[2] == "4.20-5.00 (ipc/tcp: 1.30-1.50)" and row[3] is True
    tr.write_text(json.dumps({"benchmarks": [rt("ipc", 4, 1.3), rt("shm", 4, 2.0), rt("shm-inplace", 4, 9.5),
                                             rt("shm-inplace", 4, 3.5), rt("shm-inplace", 1, 30.0)]}))
    row = st.transport_row(str(tr))  # in place, the engine's way, judged; copied in and the sockets beside
    assert row[2] == "3.50-9.50 (shm copied in: 2.00; ipc/tcp: 1.30)" and row[3] is False
    tr.write_text(json.dumps({"benchmarks": [rt("ipc", 4, 4.5), rt("tcp", 4, 3.9)]}))
    assert st.transport_row(str(tr))[2:4] == ("3.90-4.50", False)
    sp = tmp_path / "spart.json"  # the S-Part judged from graphs where the row has them, eagerly above kMaxRows
    sp.write_text(json.dumps({"rows": [{"B": 32, "ratio": 1.5, "graph_ratio": 1.4},
                                       {"B": 64, "ratio": 1.16, "graph_ratio": 1.08},
                                       {"B": 2048, "ratio": 1.09, "graph_ratio": None}]}))
    row = st.spart_row([str(sp)])
    assert row[2] == "1.08-1.09x (launched eagerly: 1.09-1.16x)" and row[3] is True
    sp.write_text(json.dumps({"rows": [{"B": 64, "ratio": 1.16, "graph_ratio": 1.11}]}))
    assert st.spart_row([str(sp)])[3] is False
    kern = tmp_path / "kernels.json"  # paged-swap is judged by its attention kernels (the words), not its step
    kern.write_text(json.dumps([{"file": "paged-swap-b256.csv.gz", "attention_roofline": {"batch": 256, "ratio": 1.06}},
                                {"file": "gpu-only-b64.csv.gz", "attention_roofline": {"batch": 64, "ratio": 1.5}}]))
    go, ps = st.roofline_rows(str(roof), str(kern))
    assert go[2] == "1.25x" and go[3] is True
    assert ps[3] is True and ps[2] == "1.06x (its whole decode step: 1.31x)" and "(B 256)" in ps[0]
    kern.write_text(json.dumps([{"file": "paged-swap-b64.csv.gz", "attention_roofline": {"batch": 64, "ratio": 1.31}}]))
    assert st.roofline_rows(str(roof), str(kern))[1][3] is False
    # Runs at two depths: each depth's range, met only when every point of both is.
    roof.write_text(json.dumps({"rows": [{"engine": "gpu-only", "layers": 2, "requested_batch": 64, "step_vs_roofline": 1.38},
                                         {"engine": "gpu-only", "layers": 2, "requested_batch": 256, "step_vs_roofline": 1.29},
                                         {"engine": "gpu-only", "layers": 4, "requested_batch": 256, "step_vs_roofline": 1.25},
                                         {"engine": "paged-swap", "layers": 2, "requested_batch": 64, "step_vs_roofline": 1.31}]}))
    go = st.roofline_rows(str(roof), str(kern))[0]
    assert go[2] == "2 layers: 1.29-1.38x; 4 layers: 1.25x" and go[3] is False
    # Two files: each engine from the first that has it (gpu-only from a newer call, paged-swap from an older one).
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({"rows": [{"engine": "gpu-only", "layers": 4, "requested_batch": 64, "step_vs_roofline": 1.2}]}))
    go, ps = st.roofline_rows([str(newer), str(roof)], str(kern))
    assert go[2] == "1.20x" and go[3] is True and go[4].endswith("newer.json")
    assert ps[2].endswith("(its whole decode step: 1.31x)") and ps[4].endswith("roof.json")

    # fp16 GQA against its ceiling: the best ISA, and every repeat (*_rN.json) of it kept, not the kindest.
    def attn(path, isa_ratios):
        b = [{"name": "decode_attention/%s/fp16/B:64/ctx:1024" % isa, "context": 1024, "batch": 64, "n_heads": 32,
              "n_kv_heads": 8, "ratio_to_ceiling": r} for isa, r in isa_ratios]
        path.write_text(json.dumps({"benchmarks": b}))
        return str(path)
    one = [attn(tmp_path / "a_avx2.json", [("avx2", 0.7)]), attn(tmp_path / "a_avx512.json", [("avx512", 0.97)])]
    assert st.attn_rows(one)[-1][2:4] == ("0.97", True)  # the best ISA of the run
    reps = [attn(tmp_path / "f_r1.json", [("avx512", 0.97)]), attn(tmp_path / "f_r2.json", [("avx512", 0.8)])]
    assert st.attn_rows(reps)[-1][2:4] == ("0.80-0.97 (per-point medians 0.89)", False)


def write_trace(d, tracks):
    """tracks: {track name: [(ts_us, dur_us, span name)]} -> d/trace.json in the harness's Chrome trace format."""
    ev = [{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "fd-bench"}}]
    for tid, (t, spans) in enumerate(tracks.items(), 1):
        ev.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": t}})
        ev += [{"name": n, "ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur} for ts, dur, n in spans]
    d.mkdir(parents=True, exist_ok=True)
    (d / "trace.json").write_text(json.dumps({"traceEvents": ev}))


def test_trace_tracks_one_mini_batch_per_stream(tmp_path):
    tt = module("trace_tracks")
    good = {"gpu stream 0": [(0, 10, "L0 mb0 q/k/v"), (10, 2, "L0 mb0 d2h"), (40, 3, "L0 mb0 h2d"), (43, 9, "L0 mb0 output+MLP")],
            "gpu stream 1": [(12, 10, "L0 mb1 q/k/v"), (22, 2, "L0 mb1 d2h"), (50, 3, "L0 mb1 h2d"), (53, 9, "L0 mb1 output+MLP")],
            "gpu stream 2": [(70, 5, "mb2 embed")],
            "rworker 0": [(14, 20, "L0 mb0")], "s-part": [(0, 12, "L0 mb0 attention input")]}
    write_trace(tmp_path / "good", good)
    assert tt.main([str(tmp_path / "good"), "--out", str(tmp_path / "o1")]) == 0
    r = json.loads((tmp_path / "o1" / "trace_tracks.json").read_text())["runs"][0]
    assert r["built"] and r["streams"]["gpu stream 1"]["mini_batches"] == [1]
    assert r["streams"]["gpu stream 0"]["stages"] == ["d2h", "h2d", "output+MLP", "q/k/v"]
    assert r["streams_busy_together_ms"] == pytest.approx(0.002)  # stream 0's output+MLP (43-52), 1's h2d (50-53)
    # Faults it must see: a stream holding two mini-batches; spans overlapping inside a stream; no R-worker track.
    for name, fault in [("two", {"gpu stream 1": good["gpu stream 1"] + [(80, 1, "L1 mb0 h2d")]}),
                        ("overlap", {"gpu stream 0": good["gpu stream 0"] + [(5, 2, "L0 mb0 d2h")]}),
                        ("noworker", {"rworker 0": None})]:
        bad = {k: v for k, v in {**good, **fault}.items() if v is not None}
        write_trace(tmp_path / name, bad)
        assert tt.main([str(tmp_path / name), "--out", str(tmp_path / ("o-" + name))]) == 1, name
        assert "NOT built" in (tmp_path / ("o-" + name) / "trace_tracks.md").read_text()


def test_stage_targets_attention_median_of_repeats(tmp_path):
    """Per point: each ISA's median over the repeats (*_rN.json), then the best ISA; fp16 GQA keeps every run."""
    st = module("stages_targets")

    def bench(isa, dt, kvh, speed=None, ratio=1.0):
        b = {"name": "decode_attention/%s/%s/B:64/ctx:4096/iterations:5/manual_time" % (isa, dt), "context": 4096,
             "batch": 64, "n_heads": 32, "n_kv_heads": kvh, "ratio_to_ceiling": ratio}
        if speed is not None:
            b["speedup_vs_fp16"] = speed
        return b

    paths = []
    # int4 MHA: vnni 2.5, 2.6, 9.0 (a disturbed repeat) -> 2.6; fp32 query 2.0, 2.1, 2.2 -> 2.1; best ISA 2.6
    for r, (vnni, f32, fp16_ratio) in enumerate([(2.5, 2.0, 0.9), (2.6, 2.1, 1.0), (9.0, 2.2, 1.1)], 1):
        for isa, v in (("avx512vnni", vnni), ("avx512", f32)):
            p = tmp_path / ("new_attn_kv32_%s_r%d.json" % (isa, r))
            p.write_text(json.dumps({"benchmarks": [bench(isa, "int4", 32, v), bench(isa, "fp16", 8, ratio=fp16_ratio)]}))
            paths.append(str(p))
    rows = {r[0].split(":")[0]: r for r in st.attn_rows(paths)}
    assert rows["CPU attention, MHA int4 KV"][2] == "2.60x" and rows["CPU attention, MHA int4 KV"][3] is False
    fp16 = rows["CPU attention, fp16 GQA"]
    assert fp16[2] == "0.90-1.10 (per-point medians 1.00)" and fp16[3] is False  # one run below 0.95 fails it
    # the best ISA by median: a slower ISA's runs do not count against it
    paths = [str(tmp_path / "x_avx2_r1.json"), str(tmp_path / "x_avx512_r1.json")]
    (tmp_path / "x_avx2_r1.json").write_text(json.dumps({"benchmarks": [bench("avx2", "fp16", 8, ratio=0.5)]}))
    (tmp_path / "x_avx512_r1.json").write_text(json.dumps({"benchmarks": [bench("avx512", "fp16", 8, ratio=0.96)]}))
    assert st.attn_rows(paths)[-1][2:4] == ("0.96", True)
