"""analysis/balance_map.py: the measured points and the MODELLED crossover.

Synthetic FastDecode / gpu-only run folders (the baselines layout) with planted step times, contexts and busiest
R-worker compute: x (the run's CPU KV bandwidth over the GPU's HBM rate), the measured ratio, GPU-only's
efficiency against its roofline and the crossover equal what the docstring's formulas give by hand; the committed
BALANCE_MAP.md is the script's output on the committed runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

REQUIRE = os.environ.get("FD_REQUIRE_BINARIES", "") not in ("", "0")
try:
    import matplotlib  # noqa: F401
except ImportError as e:
    if not REQUIRE:
        pytest.skip(f"matplotlib cannot be imported ({e}): analysis/balance_map.py is not tested", allow_module_level=True)
    raise

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "analysis"))


def module():
    spec = importlib.util.spec_from_file_location("balance_map", REPO / "analysis" / "balance_map.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


KV = 2 * 4096 * 2  # llama-2-7b, bytes per token per layer
W = 2 * 202.4e6     # bytes of one layer's fp16 weights


def run(root, engine, B, ctx, step_ms, r_ms=None):
    d = root / "full" / "llama-2-7b" / "steady" / f"{engine}-b{B}"
    d.mkdir(parents=True)
    bd = {"r_compute_max": r_ms} if r_ms is not None else {}
    steps = [{"step": 0, "step_ms": 100.0, "prefill_tokens": B * ctx, "decode_tokens": 0, "new_tokens": B, "total_context": B * ctx}]
    steps += [{"step": i, "step_ms": step_ms, "prefill_tokens": 0, "decode_tokens": B, "new_tokens": B,
               "total_context": B * ctx, "breakdown_ms": bd} for i in range(1, 6)]
    (d / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    (d / "summary.json").write_text(json.dumps({"engine": engine, "model": {"name": "llama-2-7b", "layers": 2, "full_layers": 32},
                                                "config": {"hardware": {"gpu": {"memory_gb": 0, "sm_count": 0}}}}))


def test_point_and_crossover(tmp_path):
    bm = module()
    root = tmp_path / "b"
    run(root, "fastdecode", 1024, 500, step_ms=110.0, r_ms=100.0)
    run(root, "gpu-only", 1024, 500, step_ms=2.0)
    bench = tmp_path / "balance.json"
    bench.write_text(json.dumps({"benchmarks": [{"name": "balance/read/all/iterations:3", "bytes_per_second": 4.0e12}]}))
    out = tmp_path / "o"
    assert bm.main(["--baselines", str(root), "--paper", str(tmp_path / "none"), "--balance-bench", str(bench), "--hybrid",
                    "--crossover", "", "--out", str(out)]) == 0
    hbm = bm.hbm_rates(str(bench))
    import argparse
    a = argparse.Namespace(baselines=[str(root)], paper=None)
    (p,) = bm.measured_points(a, hbm)
    bw_cpu = 1024 * 500 * 2 * KV / 0.100  # KV bytes read per decode step / the busiest R-worker's 100 ms
    assert p["bw_cpu"] == pytest.approx(bw_cpu) and p["x"] == pytest.approx(bw_cpu / 4.0e12)
    assert p["ratio"] == pytest.approx(2.0 / 110.0)  # decode tok/s: B / step, both
    roof_ms = 1e3 * 2 * (W + 1024 * 500 * KV) / 4.0e12
    assert p["eta"] == pytest.approx(roof_ms / 2.0)
    kvb = 1024 * 500 * KV
    assert bm.modelled_ratio("llama-2-7b", 500, 1024, p["x"], p["eta"]) == pytest.approx(p["x"] * (W + kvb) / kvb / p["eta"])
    # the A10 (24 GB): 0.9 * 24 GB - 13.5 GB of weights over 1024 positions x 32 layers of KV = 15 sequences
    assert bm.gpu_only_batch("llama-2-7b", 24e9, 1024) == 15
    assert bm.crossover("llama-2-7b", 512, 15) == pytest.approx(15 * 512 * KV / (W + 15 * 512 * KV))
    assert bm.gpu_only_batch("llama-2-13b", 24e9, 1024) == 0
    text = (out / "BALANCE_MAP.md").read_text(encoding="utf-8")
    assert "| A10 | llama-2-13b | 1024 | 0 (the weights leave no room) |" in text
    assert (out / "balance_map.png").stat().st_size > 10_000
    # Issue 45: the title says which parts are measured and which MODELLED, and the legend names each group and each
    # style once, below the plot, not one line per point running off the figure.
    import matplotlib.figure
    figs = []
    orig = matplotlib.figure.Figure.savefig
    matplotlib.figure.Figure.savefig = lambda self, *a, **k: figs.append(self)
    try:
        a.out = str(tmp_path)
        bm.draw([p, {**p, "label": p["label"].replace("B = 1024", "B = 256")}], a, 0.9)
    finally:
        matplotlib.figure.Figure.savefig = orig
    (fig,) = figs
    assert "measured points, MODELLED curves" in fig._suptitle.get_text()
    labels = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert len(labels) == 1 + 2 + 2 and not any(ax.get_legend() for ax in fig.axes), labels  # 1 group, 2 styles, 2 B


def test_committed_balance_map_is_current(tmp_path):
    bm = module()
    assert bm.main(["--out", str(tmp_path)]) == 0
    assert (tmp_path / "BALANCE_MAP.md").read_text(encoding="utf-8") == \
        (REPO / "artifacts" / "paper" / "BALANCE_MAP.md").read_text(encoding="utf-8"), \
        "artifacts/paper/BALANCE_MAP.md is stale: run analysis/balance_map.py --out artifacts/paper"


def test_modelled_hybrid_is_gpu_only_plus_the_cpus_share():
    """The hybrid's MODELLED ratio is 1 + FastDecode's: never below GPU-only, equal to it with no CPU bandwidth, and
    it grows with x as FastDecode's does."""
    bm = module()
    ctx, b = 528, 126
    assert bm.modelled_hybrid("llama-2-7b", ctx, b, 0.0) == 1.0
    for x in (0.01, 0.1, 1.0):
        assert bm.modelled_hybrid("llama-2-7b", ctx, b, x) == pytest.approx(1.0 + bm.modelled_ratio("llama-2-7b", ctx, b, x))
    assert bm.modelled_hybrid("llama-2-7b", ctx, b, 0.1) < bm.modelled_hybrid("llama-2-7b", ctx, b, 1.0)
    # At the crossover FastDecode equals GPU-only, so the hybrid models twice GPU-only.
    assert bm.modelled_hybrid("llama-2-7b", ctx, b, bm.crossover("llama-2-7b", ctx, b)) == pytest.approx(2.0)
