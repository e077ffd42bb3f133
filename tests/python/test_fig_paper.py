"""analysis/fig_paper.py (Figs. 8, 11/12, 13 from scripts/reproduce.sh's sweeps) and analysis/claims.py.

Synthetic sweep folders in tmp_path (fd-bench sweep's layout <sweep>/<point>/rep<k>/): Fig. 8's least-squares
line and R^2 equal the ones of the step times planted (step = a + b * layers); the SLS ratios equal the planted
peak and throughputs; the scaling efficiency is tokens/s(P) / (P/P0 * tokens/s(P0)); CLAIMS.md carries those
numbers with their verdicts, and the committed baselines grid's ratio of FastDecode to gpu-only.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

REQUIRE = os.environ.get("FD_REQUIRE_BINARIES", "") not in ("", "0")
try:
    import matplotlib  # noqa: F401
except ImportError as e:
    if not REQUIRE:
        pytest.skip(f"matplotlib cannot be imported ({e}): analysis/fig_paper.py is not tested", allow_module_level=True)
    raise

REPO = Path(__file__).resolve().parents[2]
ANALYSIS = REPO / "analysis"
sys.path.insert(0, str(ANALYSIS))


def module(name):
    spec = importlib.util.spec_from_file_location(name, ANALYSIS / f"{name}.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def run(root, sweep, point, rep, steps, layers=2, mode="all-at-once", rworkers=(4, 3), results=None, full_layers=32):
    d = root / sweep / point / f"rep{rep}"
    d.mkdir(parents=True)
    (d / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    summary = {"engine": "fastdecode", "model": {"layers": layers, "full_layers": full_layers, "name": "llama-2-7b"},
               "config": {"schedule": {"mode": mode}, "engine": {"rworkers": {"spawn": rworkers[0], "threads": rworkers[1]}},
                          "hardware": {"gpu": {}}},
               "provenance": {"gpus": [{"name": "NVIDIA H200"}], "cpu_cores": 16, "git_commit": "abc1234"},
               "results": results or {}}
    (d / "summary.json").write_text(json.dumps(summary))
    return d


def decode(n, ms, B=8, start=1, ctx=100):
    return [{"step": start + i, "step_ms": ms if not callable(ms) else ms(i), "prefill_tokens": 0, "decode_tokens": B,
             "new_tokens": B, "total_context": ctx} for i in range(n)]


PREFILL = [{"step": 0, "step_ms": 500.0, "prefill_tokens": 4096, "decode_tokens": 0, "new_tokens": 8, "total_context": 0}]


@pytest.fixture
def paper(tmp_path):
    root = tmp_path / "paper"
    for L in (1, 2, 4, 8):  # step = 3 + 2.5 L ms, two repeats each (median = the planted value)
        for rep, jitter in ((1, -0.1), (2, 0.1)):
            run(root, "fig8-llama-2-7b-fastdecode", f"layers-{L}", rep, PREFILL + decode(5, 3.0 + 2.5 * L + jitter), layers=L)
    # all-at-once (its steady window the whole run) and fixed-interval, three repeats each: the summaries' steady-window
    # p99 and tokens/s are the metric for both (medians 50 / 34 ms, 100 / 110 tok/s); whole-run rates beside them.
    for rep, (p99, tps) in enumerate(((50.0, 100.0), (60.0, 90.0), (40.0, 120.0)), 1):
        run(root, "fig11-sls-s1024", "sched-all-at-once", rep, PREFILL + decode(40, lambda i: 10.0 + 90.0 * i / 39),
            results={"output_throughput": 80.0, "steady": {"tokens_per_s": tps, "decode_step_ms": {"p99": p99}},
                     "decode_only": {"step_ms": {"p99": p99}}})
    for rep, (p99, tps, imb) in enumerate(((34.0, 110.0, 1.02), (30.0, 105.0, 1.04), (36.0, 130.0, 1.03)), 1):
        run(root, "fig11-sls-s1024", "sched-fixed-interval", rep, PREFILL + decode(40, 68.0), mode="fixed-interval",
            results={"output_throughput": 70.0, "steady": {"tokens_per_s": tps, "decode_step_ms": {"p99": p99}, "mean_batch": 7.5},
                     "decode_only": {"step_ms": {"p99": 90.0}}, "worker_kv_imbalance": {"steady": {"p50": imb, "max": imb + 0.01}}})
    for cores, (sp, th), tps in ((1, (1, 1), 1000.0), (4, (4, 1), 3000.0), (12, (4, 3), 6000.0)):
        run(root, "fig13-scaling-s1024", f"cores-{cores}", 1, PREFILL + decode(4, 8.0 * 1000 / tps, B=8), rworkers=(sp, th))
    return root


def test_fig8_fit_and_r2(paper, tmp_path):
    fp = module("fig_paper")
    data, fits, one = fp.fig8_data(str(paper))
    rows = data[("llama-2-7b", "fastdecode")]
    assert [r[0] for r in rows] == [1, 2, 4, 8]
    assert [r[1] for r in rows] == pytest.approx([3 + 2.5 * L for L in (1, 2, 4, 8)])
    assert [(r[2], r[3]) for r in rows] == [pytest.approx((3 + 2.5 * L - 0.1, 3 + 2.5 * L + 0.1)) for L in (1, 2, 4, 8)]
    a0, b0, r2 = fits[("llama-2-7b", "fastdecode")]
    assert (a0, b0, r2) == pytest.approx((3.0, 2.5, 1.0))
    assert one["summary"]["provenance"]["git_commit"] == "abc1234"


def test_sls_ratios_and_scaling(paper):
    fp = module("fig_paper")
    d = fp.sls_data(str(paper), "fig11-sls-s1024")
    # One metric for both schedules: the medians of the repeats' steady-window p99 and tokens/s.
    assert (d["all-at-once"]["p99"], d["all-at-once"]["tps"]) == (50.0, 100.0)
    assert d["all-at-once"]["p99_range"] == (40.0, 60.0) and d["all-at-once"]["tps_range"] == (90.0, 120.0)
    assert (d["fixed-interval"]["p99"], d["fixed-interval"]["tps"]) == (34.0, 110.0)
    assert d["fixed-interval"]["whole_tps"] == 70.0 and d["fixed-interval"]["whole_p99"] == 90.0  # beside, not the metric
    assert d["fixed-interval"]["imbalance"] == (1.03, pytest.approx(1.05)) and d["fixed-interval"]["repeats"] == 3
    # Ratios paired by repeat (rep k with rep k), as analysis/compare.py takes them: medians of 0.68, 0.5, 0.9 and of
    # 1.1, 1.167, 1.083.
    peak, tp = fp.sls_ratios(d)["fixed-interval"]
    assert peak == pytest.approx(34.0 / 50.0) and tp == pytest.approx(0.10)
    assert fp.paired_ratio([1.0, 2.0], [1.0, 1.0, 4.0]) == pytest.approx(1.5 / 1.0)  # unequal repeats: median / median
    rows, eff = fp.scaling_data(str(paper), "fig13-scaling-s1024")
    assert [r[0] for r in rows] == [1, 4, 12]
    assert [r[1] for r in rows] == pytest.approx([1000.0, 3000.0, 6000.0])
    assert [e for _, e in eff] == pytest.approx([1.0, 0.75, 0.5])


def test_figures_written(paper, tmp_path, capsys):
    fp = module("fig_paper")
    assert fp.main(["--paper", str(paper), "--out", str(tmp_path / "o")]) == 0
    names = sorted(p.name for p in (tmp_path / "o").iterdir())
    assert names == sorted(f"{n}.{x}" for n in ("fig8_layers", "fig11_sls_measured", "fig13_scaling") for x in ("png", "pdf"))
    with pytest.raises(fp.Skip, match="fig8-llama-2-13b|no fig8"):
        fp.fig8_data(str(tmp_path / "empty"))


def test_claims_table(paper, tmp_path):
    cl = module("claims")
    out = tmp_path / "CLAIMS.md"
    assert cl.main(["--paper", str(paper), "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    rows = {l.split(" | ")[0].lstrip("| "): l for l in text.splitlines() if l.startswith("| Fig.") or l.startswith("| §")}
    fig8 = rows["Fig. 8: step latency is linear in the layer count (llama-2-7b, fastdecode)"]
    assert "R² = 1.0000" in fig8 and "| holds | holds ≥ 0.99; in shape ≥ 0.95 |" in fig8
    sls = rows["Fig. 11: SLS (fixed-interval) latency / all-at-once's peak"]
    assert "| 68 % (median of 3, paired by repeat) |" in sls and "| holds |" in sls  # 34 / 50, 30 / 60, 36 / 40 ms
    assert "+10.0 % (median of 3, paired by repeat)" in rows["Fig. 11: SLS (fixed-interval) sustained throughput vs all-at-once"]
    assert "50 % from 1 to 12 cores" in rows["Fig. 13: strong-scaling efficiency (S = 1024)"]
    # the committed grid: FastDecode / gpu-only at B = 1024 on the full H200 is what its run folders say
    fb = module("fig_baselines")
    runs, _ = fb.load_runs(cl.DEFAULT_BASELINES, "steady")
    want = runs[("full", "llama-2-7b")]["fastdecode"][1024]["tok_s"] / runs[("full", "llama-2-7b")]["gpu-only"][1024]["tok_s"]
    trt = rows["Fig. 9: FastDecode / TensorRT-LLM, llama-2-7b, B = 1024 (ours: gpu-only)"]
    assert ("| %.2f× (" % want) in trt and "| does not hold — FastDecode loses" in trt
    assert "cannot be tested here" in rows["Fig. 14: Doubling S- and R-workers (model parallel, OPT-175b) gives 1.84×"]
    assert "MODELLED assumptions" in text


def test_committed_claims_are_current(tmp_path):
    """CLAIMS.md at the repository root is analysis/claims.py's output on the committed run folders: a number
    that changes in them changes it (regenerate with `analysis/claims.py --out CLAIMS.md`)."""
    cl = module("claims")
    out = tmp_path / "CLAIMS.md"
    assert cl.main(["--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == (REPO / "CLAIMS.md").read_text(encoding="utf-8"), \
        "CLAIMS.md is stale: run analysis/claims.py --out CLAIMS.md and commit it"


# The Fig. 11 sweep at S = 1024 as the GPU machine ran it: the first repeat of each schedule, steps trimmed to the keys
# the figure reads (tests/fixtures/README.md).
SLS_RUNS = REPO / "tests" / "fixtures" / "sls-fig11" / "fig11-sls-s1024"


def test_sls_predict_reads_the_sweeps_experiment():
    sp = module("sls_predict")
    args = sp.sim_args("fig11-sls-s1024", ["workload.gen_len=992", 'schedule={"mode":"all-at-once"}'], "P.json", "OUT")
    assert args == ["--experiment", str(REPO / "experiments" / "paper" / "base" / "llama-2-7b-fastdecode-sls.json"),
                    "--set", "workload.gen_len=992", "--set", 'schedule={"mode":"all-at-once"}', "--profile", "P.json", "--out", "OUT"]
    assert sp.profiles_by_sweep(["a.json", "fig11-sls-s768=b.json"]) == {None: "a.json", "fig11-sls-s768": "b.json"}
    with pytest.raises(SystemExit, match="not one of"):
        sp.profiles_by_sweep(["fig9=b.json"])


def test_fd_sim_prediction_drawn_beside_the_runs(tmp_path, fd_bin_dir):
    """sls_predict.py runs fd-sim on the experiment each SLS point ran (the fixture's: the committed S = 1024 sweep's
    first repeats; checked against the run's config);
    fig11 draws it dashed and labelled MODELLED, and its numbers are what fd-sim's own steps give."""
    import shutil
    sp, fp = module("sls_predict"), module("fig_paper")
    paper = tmp_path / "paper"
    shutil.copytree(SLS_RUNS, paper / "fig11-sls-s1024")
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({"t_b": [[1, 1e-4], [64, 2e-4]], "r_s_per_token_layer": {"fp16": 1e-6}, "layers": 2}))
    assert sp.main(["--paper", str(paper), "--profile", str(prof), "--bin-dir", str(fd_bin_dir)]) == 0
    sim = fp.sls_data(str(paper), "fig11-sls-s1024", sim=True)
    assert set(sim) == {"all-at-once", "fixed-interval", "load-control"}
    out = paper / "fig11-sls-s1024-fdsim" / "sched-fixed-interval"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["cost"]["workers"] == 4 and summary["config"]["cost"]["rworkers"] == 12
    steps = [json.loads(l) for l in (out / "steps.jsonl").read_text().splitlines()]
    w = summary["results"]["steady_window"]
    dec = [s["step_ms"] for s in steps if s["prefill_tokens"] == 0 and s["decode_tokens"] > 0 and w["first_step"] <= s["step"] <= w["last_step"]]
    assert sim["fixed-interval"]["p99"] == pytest.approx(float(np.percentile(dec, 99)))
    # The run's fixed-interval placement is the engine's: fd-sim's busiest / mean worker KV is the run's, step for step.
    run = json.loads((paper / "fig11-sls-s1024" / "sched-fixed-interval" / "rep1" / "summary.json").read_text())
    assert summary["results"]["worker_kv_imbalance"]["steady"]["p50"] == pytest.approx(
        run["results"]["worker_kv_imbalance"]["steady"]["p50"], rel=1e-9)
    figs = {}
    import matplotlib.figure
    orig = matplotlib.figure.Figure.savefig
    matplotlib.figure.Figure.savefig = lambda self, fname, *a, **k: figs.setdefault(Path(fname).name, self)
    try:
        fp.fig11(type("A", (), {"paper": str(paper), "out": str(tmp_path), "formats": ("png",)})(), [])
    finally:
        matplotlib.figure.Figure.savefig = orig
    labels = [l.get_label() for ax in figs["fig11_sls_measured.png"].axes for l in ax.get_lines()]
    assert sum(l.startswith("MODELLED (fd-sim") for l in labels) == 3 and sum(l.startswith("measured ") for l in labels) == 3
    # A run whose config is not what its sweep spec gives now is refused, not predicted.
    s = paper / "fig11-sls-s1024" / "sched-load-control" / "rep1" / "summary.json"
    d = json.loads(s.read_text())
    d["config"]["schedule"]["w_lim"] += 1
    s.write_text(json.dumps(d))
    assert sp.main(["--paper", str(paper), "--profile", str(prof), "--bin-dir", str(fd_bin_dir)]) == 1


def test_claims_int4_speedup_median_of_repeats(tmp_path):
    """§4's int4 ratio from fd-attn-bench's Google Benchmark files: per (batch, context) the median of each ISA's
    repeats, then the best ISA; GQA rows and short contexts are not the claim's."""
    cl = module("claims")

    def b(isa, speed, ctx=4096, kvh=32):
        return {"name": "decode_attention/%s/int4/B:64/ctx:%d" % (isa, ctx), "batch": 64, "context": ctx,
                "n_heads": 32, "n_kv_heads": kvh, "speedup_vs_fp16": speed}
    paths = []
    for r, (vnni, f32) in enumerate([(2.5, 2.0), (2.6, 2.2), (9.0, 2.1)], 1):
        p = tmp_path / ("r%d.json" % r)
        p.write_text(json.dumps({"benchmarks": [b("avx512vnni", vnni), b("avx512", f32), b("avx512vnni", 1.0, kvh=8),
                                                b("avx512vnni", 1.0, ctx=512)]}))
        paths.append(str(p))
    assert cl.int4_speedups(paths) == [2.6]
