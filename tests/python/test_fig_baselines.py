"""analysis/fig_baselines.py (Figs. 9 and 10 with every baseline), also through analysis/figures.py --baselines.

Synthetic run folders in tmp_path (the layout <balance>/<model>/<engine>-b<B>/): both PNGs are written; what
is drawn equals what steps.jsonl holds (decode tokens/s, p1/p50/p99/mean of the decode-only step times,
paged-swap's swap steps one by one); the paper's numbers from experiments/paper/published.json are present as
unjoined markers labelled "paper, A10+Epyc" on an axis without measured lines; an engine without a folder is
reported as not measured and not drawn; no folder at all is a printed skip.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REQUIRE = os.environ.get("FD_REQUIRE_BINARIES", "") not in ("", "0")
try:
    import matplotlib
    import matplotlib.figure
except ImportError as e:  # same rule as test_figures.py
    if not REQUIRE:
        pytest.skip(f"matplotlib cannot be imported ({e}): analysis/fig_baselines.py is not tested", allow_module_level=True)
    raise

REPO_ROOT = Path(__file__).resolve().parents[2]
ANALYSIS = REPO_ROOT / "analysis"
PUBLISHED = REPO_ROOT / "experiments" / "paper" / "published.json"
PAPER = "paper, A10+Epyc"
FIG9, FIG10 = "fig9_baselines_throughput.png", "fig10_token_latency.png"


def make_run(root, bal, model, engine, B, decode_ms, swap=(), summary_engine=None, window=None, folder=None):
    """One run folder: a prefill step, then decode steps of B tokens taking decode_ms[i] ms each; the steps
    whose index is in `swap` carry paged-swap's counts."""
    d = root / bal / model / (window or "") / f"{folder or engine}-b{B}"
    d.mkdir(parents=True)
    steps = [{"step": 0, "step_ms": 50.0, "prefill_tokens": 10 * B, "decode_tokens": 0, "new_tokens": B}]
    for i, ms in enumerate(decode_ms):
        st = {"step": i + 1, "step_ms": ms, "prefill_tokens": 0, "decode_tokens": B, "new_tokens": B, "breakdown_ms": {}}
        if i in swap:
            st["counts"] = {"swap_out_bytes": 4096, "preempted_swap": 1}
        steps.append(st)
    (d / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    hw = {"memory_gb": 24.0, "sm_count": 16} if bal == "a10" else {"memory_gb": 0.0, "sm_count": 0}
    (d / "summary.json").write_text(json.dumps({"engine": summary_engine or engine, "config": {"hardware": {"gpu": hw}}}))
    return d


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "baselines"
    rng = np.random.default_rng(1)
    for B, base in ((64, 20.0), (256, 40.0)):
        make_run(r, "full", "llama-2-7b", "fastdecode", B, list(base + rng.random(12)))
        make_run(r, "full", "llama-2-7b", "gpu-only", B, list(base / 4 + rng.random(12)))
    make_run(r, "full", "llama-2-7b", "paged-swap", 64, list(5 + rng.random(10)) + [80.0, 95.0], swap=(10, 11))
    make_run(r, "a10", "llama-3-8b", "hf-transformers", 16, list(30 + rng.random(8)))
    return r


def module():
    sys.path.insert(0, str(ANALYSIS))
    try:
        spec = importlib.util.spec_from_file_location("fig_baselines_under_test", ANALYSIS / "fig_baselines.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(ANALYSIS))
    return mod


def drawn(tmp, *args):
    """fig_baselines.main in this process with savefig caught: ({PNG name: Figure}, stdout lines)."""
    caught = {}

    def catch(fig, fname, *a, **k):
        caught[Path(fname).name] = fig

    mod = module()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(matplotlib.figure.Figure, "savefig", catch)
        rc = mod.main(["--out", str(tmp), *map(str, args)])
    assert rc == 0
    return caught


def lines(ax):
    return [l for l in ax.get_lines()]


def script(path, *args):
    proc = subprocess.run([sys.executable, str(path), *map(str, args)], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_both_figures_written_by_figures_py(root, tmp_path):
    out = tmp_path / "figs"
    proc = script(ANALYSIS / "figures.py", "--artifacts", tmp_path / "empty-artifacts", "--baselines", root, "--out", out,
                  "--only", "fig9b", "fig10", "--format", "png")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {Path(l[len("wrote "):]).name for l in proc.stdout.splitlines() if l.startswith("wrote ")} == {FIG9, FIG10}
    for name in (FIG9, FIG10):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert "skipped fig9b" not in proc.stdout and "skipped fig10" not in proc.stdout


def test_no_run_folder_is_a_printed_skip(tmp_path):
    proc = script(ANALYSIS / "fig_baselines.py", "--baselines", tmp_path / "nothing", "--out", tmp_path / "o")
    assert proc.returncode == 1
    assert "skipped fig9b: " in proc.stdout and "skipped fig10: " in proc.stdout and "not found" in proc.stdout
    (tmp_path / "nothing" / "full" / "llama-2-7b").mkdir(parents=True)
    proc = script(ANALYSIS / "figures.py", "--artifacts", tmp_path, "--baselines", tmp_path / "nothing", "--out", tmp_path / "o",
                  "--only", "fig9b", "fig10")
    assert "skipped fig9b: no run folder" in proc.stdout and "skipped fig10: no run folder" in proc.stdout
    assert not list((tmp_path / "o").glob("*.png"))


def test_missing_engine_reported_not_invented(root, tmp_path, capsys):
    make_run(root, "full", "llama-2-7b", "vanilla", 16, [1.0, 2.0], summary_engine="gpu-only")  # mislabelled: left out
    figs = drawn(tmp_path, "--baselines", root)
    out = capsys.readouterr().out
    assert "fig9b: full H200 / llama-2-7b: not measured: vanilla, host-offload, hf-transformers" in out
    assert "fig10: A10-like / llama-3-8b: not measured: fastdecode, gpu-only, paged-swap, vanilla, host-offload" in out
    assert "summary.json says engine 'gpu-only', the folder 'vanilla'; left out" in out
    for fig in figs.values():
        for ax in fig.axes:
            for l in lines(ax):
                assert not l.get_label().startswith(("vanilla", "host-offload")), l.get_label()
            for xt in ax.get_xticklabels():
                assert not xt.get_text().startswith(("vanilla", "host-offload")), xt.get_text()
    texts = [t.get_text() for ax in figs[FIG9].axes for t in ax.texts]
    assert "not measured: vanilla, host-offload, hf-transformers" in texts


def decode_of(d):
    steps = [json.loads(l) for l in (d / "steps.jsonl").read_text().splitlines()]
    return [s for s in steps if s["prefill_tokens"] == 0 and s["decode_tokens"] > 0]


def test_fig9_values_and_paper_marks(root, tmp_path):
    figs = drawn(tmp_path, "--baselines", root)
    fig = figs[FIG9]
    panel = next(ax for ax in fig.axes if ax.get_title().startswith("llama-2-7b, full H200"))
    for engine in ("fastdecode", "gpu-only"):
        (l,) = [l for l in lines(panel) if l.get_label() == f"{engine} (measured)"]
        x, y = l.get_data()
        assert list(x) == [64, 256]
        for B, v in zip(x, y):
            dec = decode_of(root / "full" / "llama-2-7b" / f"{engine}-b{B}")
            assert v == pytest.approx(sum(s["decode_tokens"] for s in dec) / (sum(s["step_ms"] for s in dec) / 1e3))
    pub = json.loads(PUBLISHED.read_text(encoding="utf-8"))
    want = sorted(e["value"] for e in pub["entries"] if e["figure"] == "Fig. 9" and e["unit"] == "tokens/s" and e["model"] == "Llama-7b")
    assert len(want) >= 3
    marks = [(ax, l) for ax in fig.axes for l in lines(ax) if l.get_label().startswith(PAPER)]
    assert sorted(float(l.get_ydata()[0]) for _, l in marks) == pytest.approx(want)
    for ax, l in marks:
        assert l.get_linestyle() == "None" and len(l.get_xdata()) == 1  # never joined
        assert not any("(measured)" in m.get_label() for m in lines(ax)), "paper marks share an axis with measured lines"
    assert any("FastDecode Llama-7b, B=1024, > 2200 tokens/s (stated)" in l.get_label() for _, l in marks)
    # llama-3-8b has no paper number: said so, nothing drawn
    paper_8b = [ax for ax in fig.axes if ax.get_title().startswith(PAPER)][1]
    assert not lines(paper_8b) and any("no published tokens/s" in t.get_text() for t in paper_8b.texts)


def test_fig10_percentiles_swap_steps_and_paper_marks(root, tmp_path):
    fig = drawn(tmp_path, "--baselines", root)[FIG10]
    panel = next(ax for ax in fig.axes if ax.get_title().startswith("llama-2-7b, full H200"))
    ticks = [t.get_text() for t in panel.get_xticklabels()]
    assert ticks == ["fastdecode\nB=64", "fastdecode\nB=256", "gpu-only\nB=64", "gpu-only\nB=256", "paged-swap\nB=64\n2 swap steps"]
    ranges = [l for l in lines(panel) if len(l.get_xdata()) == 2]
    for x, tick in enumerate(ticks):
        engine, b = tick.split("\n2 swap steps")[0].split("\nB=")
        ms = [s["step_ms"] for s in decode_of(root / "full" / "llama-2-7b" / f"{engine}-b{b}")]
        (r,) = [l for l in ranges if list(l.get_xdata()) == [x, x]]
        assert list(r.get_ydata()) == pytest.approx([np.percentile(ms, 1), np.percentile(ms, 99)])
        pts = {l.get_marker(): l.get_ydata()[0] for l in lines(panel) if list(l.get_xdata()) == [x]}
        assert pts["o"] == pytest.approx(np.percentile(ms, 50)) and pts["D"] == pytest.approx(np.mean(ms))
    (swap,) = [l for l in lines(panel) if l.get_marker() == "x"]
    assert list(swap.get_ydata()) == [80.0, 95.0] and swap.get_label().startswith("a step that swapped KV blocks")
    pub = json.loads(PUBLISHED.read_text(encoding="utf-8"))
    want = sorted(e["value"] for e in pub["entries"] if e["figure"] == "Fig. 10" and e["unit"] == "ms" and e["model"] == "Llama-7b")
    marks = [l for ax in fig.axes for l in lines(ax) if l.get_label().startswith(PAPER)]
    assert sorted(float(l.get_ydata()[0]) for l in marks) == pytest.approx(want)
    assert any("FastDecode Llama-7b, B=128, 120.8 ms (stated)" in l.get_label() for l in marks)


def test_window_level_and_hf_folder_name(tmp_path, capsys):
    """scripts/baselines-bench.sh's layout: <balance>/<model>/<window>/<engine>-b<B>/, transformers runs as hf-b<B>."""
    r = tmp_path / "b"
    make_run(r, "full", "llama-2-7b", "fastdecode", 64, [20.0, 21.0], window="steady")
    make_run(r, "full", "llama-2-7b", "hf-transformers", 16, [30.0, 31.0], window="steady", folder="hf")
    make_run(r, "full", "llama-2-7b", "fastdecode", 32, [10.0, 12.0, 50.0], window="life")
    figs = drawn(tmp_path / "o", "--baselines", r)
    f9 = next(ax for ax in figs[FIG9].axes if ax.get_title().startswith("llama-2-7b"))
    got = {l.get_label(): list(l.get_xdata()) for l in lines(f9)}
    assert got == {"fastdecode (measured)": [64], "hf-transformers (measured)": [16]}  # steady only
    f10 = next(ax for ax in figs[FIG10].axes if ax.get_title().startswith("llama-2-7b"))
    assert [t.get_text() for t in f10.get_xticklabels()] == ["fastdecode\nB=32"]  # life only
    # Which runs each draws is in the caption, not the title (issue 45: "(measured, window steady/)" was in the title).
    caption = lambda f: " ".join(t.get_text() for t in f.texts)
    assert "/steady/" in caption(figs[FIG9]) and "/life/" in caption(figs[FIG10])
    assert "window" not in figs[FIG9]._suptitle.get_text() and "window" not in figs[FIG10]._suptitle.get_text()
    assert "not measured: gpu-only, paged-swap, vanilla, host-offload" in capsys.readouterr().out


def test_several_roots_and_packed_folders(tmp_path, capsys):
    """--baselines ROOT ROOT reads one tree (a point in both is drawn from the later root, printed); folders packed
    by analysis/pack_runs.py (gzipped steps/requests, prompts left out) draw the same as before packing."""
    a, b = tmp_path / "run1", tmp_path / "run3"
    make_run(a, "full", "llama-2-7b", "fastdecode", 64, [20.0, 20.0], window="steady")
    make_run(a, "full", "llama-2-7b", "gpu-only", 64, [99.0, 99.0], window="steady")
    make_run(b, "full", "llama-2-7b", "gpu-only", 64, [4.0, 4.0], window="steady")
    req = b / "full" / "llama-2-7b" / "steady" / "gpu-only-b64" / "requests.jsonl"
    req.write_text(json.dumps({"id": 0, "prompt": [1, 2, 3], "prompt_len": 3, "tokens": [7, 8]}) + "\n")
    before = drawn(tmp_path / "o1", "--baselines", a, b)
    assert "are the same point; drawing" in capsys.readouterr().out
    panel = next(ax for ax in before[FIG9].axes if ax.get_title().startswith("llama-2-7b"))
    got = {l.get_label(): list(l.get_ydata()) for l in lines(panel)}
    assert got["gpu-only (measured)"] == pytest.approx([64 / 4.0e-3]) and got["fastdecode (measured)"] == pytest.approx([64 / 20.0e-3])
    proc = script(ANALYSIS / "pack_runs.py", a, b)
    assert proc.returncode == 0 and "3 run folders" in proc.stdout
    d = req.parent
    assert sorted(p.name for p in d.iterdir()) == ["requests.jsonl.gz", "steps.jsonl.gz", "summary.json"]
    import gzip
    assert [json.loads(l) for l in gzip.open(d / "requests.jsonl.gz", "rt")] == [{"id": 0, "prompt_len": 3, "tokens": [7, 8]}]
    after = drawn(tmp_path / "o2", "--baselines", a, b)
    panel2 = next(ax for ax in after[FIG9].axes if ax.get_title().startswith("llama-2-7b"))
    assert {l.get_label(): list(l.get_ydata()) for l in lines(panel2)} == got
    assert script(ANALYSIS / "pack_runs.py", a).returncode == 0  # packing packed folders is a no-op
    assert sorted(p.name for p in d.iterdir()) == ["requests.jsonl.gz", "steps.jsonl.gz", "summary.json"]
    assert script(ANALYSIS / "pack_runs.py", tmp_path / "nope").returncode == 2


def test_fig9_one_unit_per_axis_no_empty_panel_one_legend(tmp_path):
    """Issue 45: no second axis of full-depth equivalents (one unit per axis: the panel title says how many layers ran);
    a panel without runs is no empty plot but its reason in words; one legend for the figure, not over the data."""
    r = tmp_path / "b"
    d = make_run(r, "full", "llama-2-7b", "fastdecode", 64, [20.0, 20.0])
    s = json.loads((d / "summary.json").read_text())
    s["model"] = {"layers": 2, "full_layers": 32}
    (d / "summary.json").write_text(json.dumps(s))
    make_run(r, "full", "llama-2-13b", "fastdecode", 64, [20.0, 20.0])  # no depths recorded
    make_run(r, "a10", "llama-2-7b", "gpu-only", 64, [5.0, 5.0])  # llama-2-13b at a10: nothing
    figs = drawn(tmp_path / "o", "--baselines", r)
    by_title = {ax.get_title(): ax for ax in figs[FIG9].axes}
    assert "llama-2-7b, full H200, 2 of 32 layers run" in by_title and "llama-2-13b, full H200" in by_title
    assert all(not ax.child_axes for ax in figs[FIG9].axes)
    assert all(ax.get_legend() is None for ax in figs[FIG9].axes if ax.get_title().startswith("llama")) and figs[FIG9].legends
    empty = [ax for ax in figs[FIG9].axes if not ax.axison]
    assert len(empty) == 1 and "not measured" in " ".join(t.get_text() for t in empty[0].texts)
