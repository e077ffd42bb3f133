"""analysis/figures.py from outside: the six figures (PNG and PDF) from the committed artifacts (default --artifacts, run from
the repository root), fig11 from fd-sim output folders (--sim-dir), and "skipped figN: why" lines instead of
a crash when inputs are missing (exit 1 when nothing was written).

And what is drawn: figures.py is imported and run in this process with Figure.savefig replaced, so each
Figure is caught as it would be saved, and the values of its artists (line data, bar heights and
positions, the numbers written in labels and annotations) are compared with the values read here,
independently of figures.py's helpers, from its input files (spart_*.json, e2e.json, validation.json,
e2e/*/steps.jsonl, fd-sim folders): a fixture, tests/fixtures/figures-gpu-machine/.

Without matplotlib the module is skipped (visibly, with the reason), and every test in it fails when
FD_REQUIRE_BINARIES is set to a non-empty value other than "0" (as ctest does).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# Same rule as conftest._require_binaries.
REQUIRE = os.environ.get("FD_REQUIRE_BINARIES", "") not in ("", "0")
try:
    import matplotlib  # noqa: F401
    import matplotlib.colors
    import matplotlib.figure
    MATPLOTLIB_MISSING = None
except ImportError as e:
    MATPLOTLIB_MISSING = f"matplotlib cannot be imported ({e}): analysis/figures.py is not tested"
    if not REQUIRE:
        pytest.skip(MATPLOTLIB_MISSING, allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def _require_matplotlib():
    if MATPLOTLIB_MISSING:
        pytest.fail(MATPLOTLIB_MISSING + " [FD_REQUIRE_BINARIES is set]", pytrace=False)


REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "analysis" / "figures.py"
# The figures' inputs as the GPU machine measured them (artifacts/sworker/gpu-machine, trimmed: tests/fixtures/README.md):
# what is drawn is checked against these, so the analysis can change with them. The committed figures regenerate from
# the committed results in test_all_figures_from_committed_artifacts and test_figures_committed.py.
ARTIFACTS = REPO_ROOT / "tests" / "fixtures" / "figures-gpu-machine"
PROFILE = ARTIFACTS / "profile_llama-2-7b_cuda_r12.json"
FIGS = {
    "fig1": "fig1_kv_memory.png",
    "fig3": "spart_vs_gemm.png",
    "fig9": "e2e_throughput.png",
    "fig15": "fig15_step_breakdown.png",
    "fig13": "rworker_scaling_model.png",
    "fig11": "per_step_latency.png",
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MEASURED_FIGS = [f for f in FIGS if f != "fig1"]  # fig1 is computed from experiments/models, always drawable


def figures(*args, cwd=REPO_ROOT):
    proc = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=120, cwd=cwd)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def check_png(path: Path):
    assert path.is_file(), f"{path} not written"
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG"
    assert len(data) > 10_000, f"{path} is only {len(data)} bytes"


def written(proc):
    return [line[len("wrote "):] for line in proc.stdout.splitlines() if line.startswith("wrote ")]


def skipped(proc):
    return {line.split(":")[0][len("skipped "):] for line in proc.stdout.splitlines() if line.startswith("skipped ")}


def test_all_figures_from_committed_artifacts(tmp_path):
    out = tmp_path / "figs"
    proc = figures("--out", out)  # default --artifacts, relative to the repository root; default --format png,pdf
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not skipped(proc), proc.stdout
    pdfs = [n[:-4] + ".pdf" for n in FIGS.values()]
    assert sorted(Path(p).name for p in written(proc)) == sorted(list(FIGS.values()) + pdfs)
    for name in FIGS.values():
        check_png(out / name)
    for name in pdfs:
        assert (out / name).read_bytes()[:5] == b"%PDF-", name


@pytest.fixture(scope="module")
def sim_dir(fd_bin, tmp_path_factory):
    """Two fd-sim output folders with step times (the GPU machine's profile)."""
    sim = tmp_path_factory.mktemp("sim")
    common = ["--batch", 64, "--seq", 64, "--requests", 128, "--profile", PROFILE, "--rworkers", 1]
    for name, mode in (("all-at-once", ["--mode", "all-at-once"]), ("fixed-interval", ["--mode", "fixed-interval", "--interval", 8])):
        subprocess.run([fd_bin("fd-sim"), *map(str, mode + common), "--out", str(sim / name)], check=True,
                       capture_output=True, timeout=60)
    return sim


def test_fig11_from_fd_sim_folders(tmp_path, fd_bin, sim_dir):
    sim = sim_dir
    out = tmp_path / "figs"
    # (the other figures from these artifacts: test_all_figures_from_committed_artifacts)
    proc = figures("--artifacts", ARTIFACTS, "--sim-dir", sim, "--out", out, "--format", "png", "--only", "fig11")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not skipped(proc), proc.stdout
    assert [Path(p).name for p in written(proc)] == [FIGS["fig11"]], proc.stdout
    check_png(out / FIGS["fig11"])

    # fd-sim without cost flags has no step times: fig11 is skipped with the reason, the rest still written.
    untimed = tmp_path / "untimed"
    untimed.mkdir()
    subprocess.run([fd_bin("fd-sim"), "--mode", "all-at-once", "--batch", "8", "--seq", "8", "--out", str(untimed / "a")],
                   check=True, capture_output=True, timeout=60)
    proc = figures("--artifacts", ARTIFACTS, "--sim-dir", untimed, "--out", tmp_path / "figs2", "--format", "png")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert skipped(proc) == {"fig11"}, proc.stdout
    assert "no step times" in proc.stdout
    assert len(written(proc)) == len(FIGS) - 1
    # ... and with --strict that is a failure naming the figure
    proc = figures("--artifacts", ARTIFACTS, "--sim-dir", untimed, "--out", tmp_path / "figs3", "--format", "png", "--strict",
                   "--only", "fig11")
    assert proc.returncode == 1, proc.stdout
    assert [l for l in proc.stdout.splitlines() if l.startswith("missing ")] == [
        l.replace("skipped", "missing", 1) for l in proc.stdout.splitlines() if l.startswith("skipped fig11")]


def test_missing_inputs_are_skipped_not_a_crash(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "figs"
    only = ["--only", *MEASURED_FIGS, "--format", "png"]
    proc = figures("--artifacts", empty, "--out", out, *only)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert skipped(proc) == set(MEASURED_FIGS), proc.stdout
    assert not written(proc)
    assert not list(out.glob("*.png"))

    # Unusable inputs are skipped with the reason too.
    (empty / "e2e.json").write_text("[]")
    (empty / "validation.json").write_text("{not json")
    proc = figures("--artifacts", empty, "--sim-dir", tmp_path / "no-such-dir", "--out", out, *only)
    assert proc.returncode == 1, proc.stdout
    assert "skipped fig9: e2e.json has no runs" in proc.stdout
    assert "skipped fig13: " in proc.stdout and "not valid JSON" in proc.stdout
    assert "skipped fig11: --sim-dir" in proc.stdout

    # Some inputs: the figures that have theirs are written, exit 0.
    (empty / "spart_llama-2-7b.json").write_bytes((ARTIFACTS / "spart_llama-2-7b.json").read_bytes())
    proc = figures("--artifacts", empty, "--out", out, *only)
    assert proc.returncode == 0, proc.stdout
    assert skipped(proc) == set(MEASURED_FIGS) - {"fig3"}
    check_png(out / FIGS["fig3"])


# ------------------------------------------------------------------------------------------------
# what is drawn equals what the input files hold
# ------------------------------------------------------------------------------------------------

def read_json(path: Path):
    return json.loads(path.read_text())


def read_jsonl(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def figures_module():
    """analysis/figures.py imported as a module (it imports fd_runs from its own folder)."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec = importlib.util.spec_from_file_location("fd_figures_under_test", SCRIPT)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return mod


def drawn(figures_module, tmp: Path, *args):
    """Runs figures.main in this process; {PNG name: the Figure as it was when saved}. Nothing is written."""
    caught = {}

    def catch(fig, fname, *a, **k):
        caught[Path(fname).name] = fig

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(matplotlib.figure.Figure, "savefig", catch)
        rc = figures_module.main(["--out", str(tmp), "--format", "png", *map(str, args)])
    assert rc == 0
    assert sorted(caught) == sorted(FIGS.values())
    return caught


@pytest.fixture(scope="module")
def committed(figures_module, tmp_path_factory):
    return drawn(figures_module, tmp_path_factory.mktemp("figs"), "--artifacts", ARTIFACTS)


@pytest.fixture(scope="module")
def from_sim(figures_module, tmp_path_factory, sim_dir):
    return drawn(figures_module, tmp_path_factory.mktemp("figs_sim"), "--artifacts", ARTIFACTS, "--sim-dir", sim_dir)


def same_xy(line, x, y, rel=1e-12):
    xy = line.get_xydata()
    assert xy.shape == (len(x), 2), (line.get_label(), xy.shape, len(x))
    np.testing.assert_allclose(xy[:, 0], np.asarray(x, dtype=float), rtol=rel, atol=0, err_msg=line.get_label())
    np.testing.assert_allclose(xy[:, 1], np.asarray(y, dtype=float), rtol=rel, atol=0, err_msg=line.get_label())


def rects(ax):
    """Bars as (x, y, width, height), in the order drawn."""
    return [(p.get_x(), p.get_y(), p.get_width(), p.get_height()) for p in ax.patches]


def one_line(text):
    return " ".join(text.split())


def test_fig3_draws_the_spart_files(committed):
    fig = committed[FIGS["fig3"]]
    ax1, ax2 = fig.axes
    files = sorted(ARTIFACTS.glob("spart_*.json"))
    assert len(files) >= 2
    l1, l2 = ax1.get_lines(), ax2.get_lines()
    assert len(l1) == len(l2) == 2 * len(files)
    colors = []
    for k, f in enumerate(files):
        d = read_json(f)
        rows = sorted(d["rows"], key=lambda r: r["B"])
        B = np.array([r["B"] for r in rows], dtype=float)
        sp = np.array([r["spart_ms"] for r in rows])
        gm = np.array([r["gemm_ms"] for r in rows])
        spart, gemm = l1[2 * k], l1[2 * k + 1]
        same_xy(spart, B, sp)
        same_xy(gemm, B, gm)
        same_xy(l2[2 * k], B, 1e3 * sp / B)
        same_xy(l2[2 * k + 1], B, 1e3 * gm / B)
        # The label says what the JSON says: model, dtype, SMs used (of the GPU's when fewer), and the
        # commit when another file has the same model, dtype and SMs (the bf16 run is not the fp16 one).
        total = d["provenance"]["gpus"][0]["sm_count"]
        sms = f"{d['sm_count']} SMs" if d["sm_count"] == total else f"{d['sm_count']} of {total} SMs"
        twins = [g for g in files if (read_json(g)["model"], read_json(g)["dtype"], read_json(g)["sm_count"])
                 == (d["model"], d["dtype"], d["sm_count"])]
        who = f"{d['model']} {d['dtype']}, {sms}" + (f" @{d['provenance']['git_commit']}" if len(twins) > 1 else "")
        m = re.fullmatch(re.escape(who) + r": S-Part \(([0-9.]+)× the GEMMs at B=(\d+)\)", spart.get_label())
        assert m, spart.get_label()
        assert float(m.group(1)) == pytest.approx(sp[-1] / gm[-1], abs=0.005) and int(m.group(2)) == B[-1]
        assert gemm.get_label() == who + ": cuBLAS GEMMs alone"
        assert len({l.get_color() for l in (spart, gemm, l2[2 * k], l2[2 * k + 1])}) == 1
        colors.append(spart.get_color())
    assert len(set(colors)) == len(files)
    caption = fig.texts[-1].get_text()
    assert all(f.name in caption for f in files), caption
    dtypes = sorted({read_json(f)["dtype"] for f in files})
    assert dtypes == ["bf16", "fp16"]  # the committed files hold both: the title names both
    assert "bf16" in fig._suptitle.get_text() and "fp16" in fig._suptitle.get_text()
    prov = read_json(files[0])["provenance"]  # the machine, named over the measured series
    title = ax1.get_legend().get_title().get_text()
    assert title.startswith("measured on %s (%d SMs), %d-core %s" % (prov["gpus"][0]["name"], prov["gpus"][0]["sm_count"],
                                                                    prov["cpu_cores"], prov["cpu_model"])), title
    bf16 = [l.get_label() for l in l1 if " bf16, " in l.get_label()]
    assert len(bf16) == 2 * sum(read_json(f)["dtype"] == "bf16" for f in files)


def test_fig9_draws_e2e_throughput(committed):
    fig = committed[FIGS["fig9"]]
    (ax,) = fig.axes
    rows = [r for r in read_json(ARTIFACTS / "e2e.json") if r["name"].endswith(("-full", "-a10"))]
    assert {r["engine"] for r in rows} == {"fastdecode", "gpu-only"}
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    bars = rects(ax)
    assert len(bars) == len(rows)
    notes = [(np.array(t.xy, dtype=float), t.get_text()) for t in ax.texts]
    seen = []
    for (x, y, w, h), patch in zip(bars, ax.patches):
        xc = x + w / 2
        i = int(round(xc))
        engine = "fastdecode" if xc < i else "gpu-only"
        tick = ticks[i]
        match = [r for r in rows if r["engine"] == engine and tick.split("\n")[0] == r["model"]
                 and one_line(r["balance"]) in one_line(tick)]
        assert len(match) == 1, (tick, engine)
        r = match[0]
        assert y == 0 and h == r["decode_tokens_per_s"], r["name"]
        assert matplotlib.colors.same_color(patch.get_facecolor(), "tab:blue" if engine == "fastdecode" else "tab:orange")
        note = [text for xy, text in notes if np.allclose(xy, (xc, h), rtol=1e-12, atol=1e-12)]
        assert len(note) == 1, r["name"]
        note = note[0].split("\n")
        assert note[0] == format(round(r["decode_tokens_per_s"]), ",").replace(",", " ")
        assert note[1] == "B=%.0f" % r["mean_batch"]
        assert note[2:-1] == (["P=%d CPUs" % r["rworker_cpus"]] if r.get("rworker_cpus") else [])
        # the full-depth equivalent: tokens/s × N/L, L from the model's config
        full = read_json(REPO_ROOT / "experiments" / "models" / (r["model"] + ".json"))["num_hidden_layers"]
        assert r["layers"] < full
        assert note[-1] == "≈%s full-depth" % format(round(r["decode_tokens_per_s"] * r["layers"] / full), ",").replace(",", " ")
        seen.append(r["name"])
    assert sorted(seen) == sorted(r["name"] for r in rows)
    for tick in ticks:  # the ratio under each pair
        pair = {r["engine"]: r["decode_tokens_per_s"] for r in rows
                if tick.split("\n")[0] == r["model"] and one_line(r["balance"]) in one_line(tick)}
        if len(pair) == 2:
            assert ("FD / GPU-only = %.3f" % (pair["fastdecode"] / pair["gpu-only"])) in tick
        else:
            assert "FD / GPU-only" not in tick
    assert not ax.child_axes  # one unit per axis (issue 45): the full-depth equivalent is in each bar's label


def test_fig15_draws_the_step_breakdown(committed):
    fig = committed[FIGS["fig15"]]
    ax1, ax2 = fig.axes
    rows = [r for r in read_json(ARTIFACTS / "e2e.json")
            if r["engine"] == "fastdecode" and r.get("breakdown_ms") and r.get("mean_step_ms")]
    assert len(rows) >= 2
    labels = [t.get_text() for t in ax1.get_yticklabels()]
    assert len(labels) == len(rows)
    for ax, unit in ((ax1, "ms"), (ax2, "%")):
        bars = rects(ax)
        assert len(bars) == 4 * len(rows)
        for i, r in enumerate(rows):
            step, bd = r["mean_step_ms"], r["breakdown_ms"]
            s, rw, rc = bd["s_compute"], bd["r_wait"], bd["r_compute_max"]
            other = max(step - s - rw, 0.0)  # drawn as 0 (with a message) if the parts exceed the step
            scale = 1.0 if unit == "ms" else 100.0 / step
            upper, lower = bars[4 * i:4 * i + 3], bars[4 * i + 3]
            cy = [y + h / 2 for _, y, _, h in upper]
            assert max(cy) < i < lower[1] + lower[3] / 2 and max(cy) == min(cy)
            np.testing.assert_allclose([w for _, _, w, _ in upper], np.array([s, rw, other]) * scale, rtol=1e-12)
            np.testing.assert_allclose([x for x, _, _, _ in upper], np.array([0, s, s + rw]) * scale, rtol=1e-12, atol=1e-12)
            assert upper[2][0] + upper[2][2] == pytest.approx(max(step, s + rw) * scale, rel=1e-12)
            assert (lower[0], lower[2]) == (0, pytest.approx(rc * scale, rel=1e-12))
    notes = [t.get_text() for t in ax1.texts]
    for i, r in enumerate(rows):
        assert "step %.1f ms" % r["mean_step_ms"] in notes and "%.1f ms" % r["breakdown_ms"]["r_compute_max"] in notes
        head = labels[i].split("\n")
        assert head[0] == "%s (%s)" % (r["name"], r["balance"]) and head[1] == "B=%.0f, P=%s CPUs" % (r["mean_batch"], r["rworker_cpus"])
        steps = read_jsonl(ARTIFACTS / "e2e" / r["name"] / "steps.jsonl")
        dec = [x for x in steps if x["prefill_tokens"] == 0 and x["decode_tokens"] > 0]
        other = [x["step_ms"] - x["breakdown_ms"]["s_compute"] - x["breakdown_ms"]["r_wait"] for x in dec]
        assert head[2] == "other: median %.1f, last step %.0f ms" % (sorted(other)[len(other) // 2], other[-1])


FIG13_RUNS = ("llama-2-7b-fastdecode-p6", "llama-2-7b-fastdecode-full")  # the P = 6 and P = 12 runs, same B


def test_fig13_draws_validation(committed):
    fig = committed[FIGS["fig13"]]
    (ax,) = fig.axes
    rows = [r for r in read_json(ARTIFACTS / "validation.json") if r["run"] in FIG13_RUNS]
    threads = sorted({r["r_threads"] for r in rows})
    assert len(rows) == 2 * len(threads) >= 4
    lines = ax.get_lines()
    predicted = [l for l in lines if l.get_marker() == "s"]
    model = [l for l in lines if l.get_linestyle() == "--"]
    measured = [l for l in lines if l.get_label().startswith("measured (decode-only steps), ")]
    linear = [l for l in lines if l.get_linestyle() == ":"]
    assert len(predicted) == len(model) == len(threads) and len(measured) == len(linear) == 1
    assert len(lines) == 2 * len(threads) + 2
    pmax = max(16, max(r["P"] for r in rows))
    for k, rt in enumerate(threads):
        sub = sorted((r for r in rows if r["r_threads"] == rt), key=lambda r: r["P"])
        same_xy(predicted[k], [r["P"] for r in sub], [r["predicted_tok_s"] for r in sub])
        assert f"{rt}-CPU profile ({sub[0]['profile']})" in predicted[k].get_label()
        for r in sub:
            assert "%.0f at P=%d" % (r["predicted_tok_s"], r["P"]) in predicted[k].get_label()
        x = model[k].get_xdata()
        assert x[0] == 1 and x[-1] == pytest.approx(pmax) and len(x) > 100
        r0 = sub[0]
        same_xy(model[k], x, [r0["B"] / (r0["N"] * max(r0["t_s_ms"] / 1e3, r0["W"] * r0["R"] / p)) for p in x])
        for r in sub:  # the model curve passes through the predicted points of its B and W
            if (r["B"], r["W"], r["t_s_ms"]) == (r0["B"], r0["W"], r0["t_s_ms"]):
                assert np.interp(r["P"], x, model[k].get_ydata()) == pytest.approx(r["predicted_tok_s"], rel=1e-6)
    meas = sorted({(r["P"], r["measured_tok_s"], r["run"]) for r in rows})
    same_xy(measured[0], [m[0] for m in meas], [m[1] for m in meas])
    (p0, t0, _), (p1, t1, _) = meas[0], meas[-1]
    same_xy(linear[0], [0, pmax], [0, t0 * pmax / p0])
    notes = [t.get_text() for t in ax.texts]
    for p, t, run in meas:
        pred = next(r["predicted_tok_s"] for r in rows if r["run"] == run and r["r_threads"] == threads[-1])
        assert "%.0f\n%s\n= %.2f × MODELLED (%d-CPU R)" % (t, run, t / pred, threads[-1]) in notes
    assert "P %d → %d: measured ×%.2f (scaling efficiency %.0f %%)" % (p0, p1, t1 / t0, 100 * (t1 / t0) / (p1 / p0)) in notes
    prov = read_json(ARTIFACTS / "e2e" / rows[0]["run"] / "summary.json")["provenance"]
    label = measured[0].get_label()  # the machine and the balance of the measured series
    assert prov["gpus"][0]["name"] in label and prov["cpu_model"] in label and label.endswith(", full GPU"), label
    assert not ax.child_axes  # one unit per axis (issue 45): the caption gives the full-depth factor
    full = read_json(REPO_ROOT / "experiments" / "models" / "llama-2-7b.json")["num_hidden_layers"]
    assert "full-depth equiv. = tokens/s × N/L (× %.4g here)" % (rows[0]["N"] / full) in " ".join(t.get_text() for t in fig.texts)


def test_fig11_draws_the_e2e_steps(committed):
    fig = committed[FIGS["fig11"]]
    ax1, ax2 = fig.axes
    runs = [d for d in sorted((ARTIFACTS / "e2e").iterdir())
            if (d / "steps.jsonl").is_file() and (d / "summary.json").is_file()
            and read_json(d / "summary.json")["engine"] == "fastdecode"]
    assert len(runs) >= 2
    l1, l2 = ax1.get_lines(), ax2.get_lines()
    assert len(l1) == 3 * len(runs) + 2 and len(l2) == len(runs)
    for k, d in enumerate(runs):
        steps = read_jsonl(d / "steps.jsonl")
        every, pre, dec = l1[3 * k:3 * k + 3]
        s = read_json(d / "summary.json")
        gpu = s["config"]["hardware"]["gpu"]
        bal = "full GPU" if not gpu["sm_count"] else "GPU capped at %g GB, %d SMs" % (gpu["memory_gb"], gpu["sm_count"])
        assert every.get_label() == "%s (%s)" % (s["name"], bal)
        same_xy(every, [s["step"] for s in steps], [s["step_ms"] for s in steps])
        p = [s for s in steps if s["prefill_tokens"] > 0]
        q = [s for s in steps if s["prefill_tokens"] == 0 and s["decode_tokens"] > 0]
        assert p and q and len(p) + len(q) == len(steps)
        same_xy(pre, [s["step"] for s in p], [s["step_ms"] for s in p])
        same_xy(dec, [s["step"] for s in q], [s["step_ms"] for s in q])
        same_xy(l2[k], [s["step"] for s in steps], [s["decode_tokens"] for s in steps])
        assert len({l.get_color() for l in (every, pre, dec, l2[k])}) == 1
    assert all(len(l.get_xdata()) == 0 for l in l1[3 * len(runs):])  # the legend's markers only


def test_fig11_draws_the_fd_sim_steps(from_sim, sim_dir):
    fig = from_sim[FIGS["fig11"]]
    ax1, ax2 = fig.axes
    folders = sorted(d for d in sim_dir.iterdir() if (d / "steps.jsonl").is_file())
    assert [d.name for d in folders] == ["all-at-once", "fixed-interval"]
    l1, l2 = ax1.get_lines(), ax2.get_lines()
    assert len(l1) == 2 * len(folders) and len(l2) == len(folders)
    for k, d in enumerate(folders):
        steps = read_jsonl(d / "steps.jsonl")
        res = read_json(d / "summary.json")["results"]
        every, peak = l1[2 * k], l1[2 * k + 1]
        same_xy(every, [s["step"] for s in steps], [s["step_ms"] for s in steps])
        same_xy(l2[k], [s["step"] for s in steps], [s["total_context"] for s in steps])
        assert list(peak.get_ydata()) == [res["peak_step_ms"]] * 2 == [max(s["step_ms"] for s in steps)] * 2
        label = every.get_label()
        assert label.startswith("MODELLED " + d.name) and label.endswith(": %.0f tok/s" % res["tokens_per_s"])
        assert l2[k].get_label() == label and every.get_color() == l2[k].get_color() == peak.get_color()


# ------------------------------------------------------------------------------------------------
# honest labels, Fig. 1, Fig. 15's timeline (synthetic inputs; no binaries)
# ------------------------------------------------------------------------------------------------

def caught_figures(figures_module, tmp: Path, *args):
    """figures.main(--only ...) in this process with savefig caught: {file name: Figure}."""
    caught = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(matplotlib.figure.Figure, "savefig", lambda fig, fname, *a, **k: caught.__setitem__(Path(fname).name, fig))
        rc = figures_module.main(["--out", str(tmp), "--format", "png", "--strict", *map(str, args)])
    assert rc == 0
    return caught


def test_fig11_sim_dir_tells_measured_runs_from_fd_sim(figures_module, tmp_path):
    """A folder under --sim-dir that is an fd-bench run is drawn as measured (machine, balance), not MODELLED."""
    sim = tmp_path / "sim"
    fake = sim / "a-sim"
    fake.mkdir(parents=True)
    steps = [{"step": i, "step_ms": 10.0 + i, "total_context": 100 * i} for i in range(5)]
    (fake / "steps.jsonl").write_text("".join(json.dumps(x) + "\n" for x in steps))
    (fake / "summary.json").write_text(json.dumps({"program": "fd-sim", "config": {"mode": "all-at-once", "batch": 4, "seq": 8,
                                                                                   "cost": {"layers": 2, "rworkers": 1}},
                                                   "results": {"duration_s": 0.06, "tokens_per_s": 321.0, "peak_step_ms": 14.0}}))
    run = ARTIFACTS / "e2e" / "llama-2-7b-fastdecode-a10"
    real = sim / "b-run"
    real.mkdir()
    for n in ("summary.json", "steps.jsonl"):
        (real / n).write_bytes((run / n).read_bytes())
    fig = caught_figures(figures_module, tmp_path / "figs", "--artifacts", ARTIFACTS, "--sim-dir", sim, "--only", "fig11")[FIGS["fig11"]]
    ax1 = fig.axes[0]
    labels = [l.get_label() for l in ax1.get_lines() if not l.get_label().startswith("_")]
    s = read_json(run / "summary.json")
    assert labels[0] == "MODELLED all-at-once, B=4, S=8: 321 tok/s"
    assert labels[1].startswith("measured %s (fastdecode, all-at-once; " % s["name"]) and "MODELLED" not in labels[1], labels[1]
    for what in (s["provenance"]["gpus"][0]["name"], s["provenance"]["cpu_model"], "GPU capped at 24 GB, 16 SMs"):
        assert what in labels[1], labels[1]
    assert labels[1].endswith(": %.0f tok/s" % s["results"]["output_throughput"])
    same_xy(ax1.get_lines()[2], [x["step"] for x in read_jsonl(run / "steps.jsonl")], [x["step_ms"] for x in read_jsonl(run / "steps.jsonl")])
    assert "measured (fd-bench) and MODELLED (fd-sim)" in fig._suptitle.get_text()


# Published parameter counts (the models' cards); the figure counts them from the configs.
PARAMS = {"llama-2-7b": 6_738_415_616, "llama-2-13b": 13_015_864_320}
GPUS = {"A10": 24.0, "A100": 80.0, "H200": 141.0}


def test_fig1_kv_memory_is_computed_from_the_configs(figures_module, tmp_path):
    fig = caught_figures(figures_module, tmp_path, "--only", "fig1")[FIGS["fig1"]]
    models = ["llama-2-7b", "llama-2-13b", "opt-175b"]
    assert len(fig.axes) == 2 * len(models)
    assert "COMPUTED" in fig._suptitle.get_text() and "not measured" in fig._suptitle.get_text()
    for j, m in enumerate(models):
        cfg = read_json(REPO_ROOT / "experiments" / "models" / f"{m}.json")
        kv_heads = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
        per_token = 2 * cfg["num_hidden_layers"] * kv_heads * (cfg["hidden_size"] // cfg["num_attention_heads"]) * 2  # fp16
        top, bottom = fig.axes[j], fig.axes[len(models) + j]
        lines = {l.get_label(): l for l in top.get_lines() + bottom.get_lines() if l.get_label().startswith("COMPUTED")}
        s1024 = lines["COMPUTED fp16, S=1024"]
        x = s1024.get_xdata()
        assert list(x) == [2 ** i for i in range(11)]
        same_xy(s1024, x, x * 1024 * per_token / 1e9)
        same_xy(lines["COMPUTED int8, S=1024 (scales not counted)"], x, x * 1024 * per_token / 2 / 1e9)
        same_xy(lines["COMPUTED int4, S=1024 (scales not counted)"], x, x * 1024 * per_token / 4 / 1e9)
        b64 = lines["COMPUTED fp16, B=64"]
        same_xy(b64, b64.get_xdata(), 64 * b64.get_xdata() * per_token / 1e9)
        caps = sorted(l.get_ydata()[0] for l in top.get_lines() if not l.get_label().startswith("COMPUTED"))
        if m in PARAMS:
            w = 2 * PARAMS[m] / 1e9
            assert caps == pytest.approx(sorted(c - w for c in GPUS.values() if c > w), rel=1e-9), m
        else:  # OPT-175B: ~350 GB of fp16 weights exceed every GPU named: no line, and the title says so
            assert caps == [] and "exceed A10, A100, H200" in top.get_title()


def write_trace_run(d: Path, steady=None):
    """A run folder with a synthetic trace.json: step 0 prefill, steps 1-3 decode; step 3's spans are known."""
    d.mkdir(parents=True)
    ev = [{"ph": "M", "name": "thread_name", "tid": t, "args": {"name": n}}
          for t, n in ((1, "s-worker"), (2, "harness"), (3, "s-part"), (4, "rworker 0"), (5, "rworker 1"), (6, "wire"))]

    def x(tid, name, ts, dur):
        ev.append({"ph": "X", "pid": 1, "tid": tid, "name": name, "ts": ts, "dur": dur})
    for k in range(4):  # step k: [k*1000, k*1000 + 1000) µs; step 0 is a prefill
        x(2, "step %d" % k, 1000.0 * k, 1000.0)
        x(1, "prefill" if k == 0 else "decode step", 1000.0 * k, 1000.0)
        if k != 3:
            x(3, "L0 mb0 attention input", 1000.0 * k, 500.0)
    x(3, "L0 mb0 attention input", 3000, 100)
    x(3, "L0 mb1 attention input", 3100, 100)
    x(6, "send L0 mb0", 3200, 10)
    x(4, "L0 mb0", 3150, 250)
    x(5, "L0 mb0", 3180, 210)
    x(3, "L0 mb0 output+MLP", 3400, 100)
    x(3, "L0 mb1 output+MLP", 3500, 100)
    prov = {"gpus": [{"name": "Test GPU", "sm_count": 8}], "cpu_model": "Test CPU", "cpu_cores": 4}
    (d / "trace.json").write_text(json.dumps({"traceEvents": ev, "otherData": prov}))
    steps = [{"step": k, "step_ms": 1.0, "prefill_tokens": 64 if k == 0 else 0, "decode_tokens": 0 if k == 0 else 8} for k in range(4)]
    (d / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    summary = {"name": "synthetic", "provenance": prov, "model": {"layers": 1, "full_layers": 32},
               "config": {"hardware": {"gpu": {"memory_gb": 0, "sm_count": 0}}}, "results": {}}
    if steady:
        summary["results"]["steady"] = {"first_step": steady[0], "last_step": steady[1]}
    (d / "summary.json").write_text(json.dumps(summary))
    return d / "trace.json"


def test_fig15_timeline_from_a_trace(figures_module, tmp_path):
    trace = write_trace_run(tmp_path / "run", steady=(2, 3))
    fig = caught_figures(figures_module, tmp_path / "figs", "--artifacts", ARTIFACTS, "--trace", trace, "--only", "fig15")[FIGS["fig15"]]
    assert len(fig.axes) == 3  # the bars (absolute, share) and the timeline
    tl = fig.axes[2]
    names = [t.get_text() for t in tl.get_yticklabels()]
    assert names == ["S-Part: attention input", "S-Part: output+MLP", "wire", "rworker 0", "rworker 1", "wait"]
    want = {"S-Part: attention input": [(0, 0.1), (0.1, 0.1)], "S-Part: output+MLP": [(0.4, 0.1), (0.5, 0.1)],
            "wire": [(0.2, 0.01)], "rworker 0": [(0.15, 0.25)], "rworker 1": [(0.18, 0.21)],
            "wait": [(0.21, 0.19), (0.6, 0.4)]}  # the decode step's time outside S-Part and wire spans
    got = {}
    for p in tl.patches:
        got.setdefault(names[int(round(p.get_y() + p.get_height() / 2))], []).append((p.get_x(), p.get_width()))
    assert sorted(got) == sorted(want)
    for n in want:
        np.testing.assert_allclose(sorted(got[n]), want[n], rtol=1e-9, atol=1e-9, err_msg=n)
    title = tl.get_title()
    # step 3: the middle decode-only step of the steady window (2-3), not of the run (which would be step 2)
    assert title.startswith("one decode iteration (step 3, 1.0 ms; middle decode-only step of the steady window (steps 2-3))"), title
    assert "measured, Test GPU (8 SMs), 4-core Test CPU, full GPU, 1 of 32 layers" in title
    totals = [t.get_text() for t in tl.texts]
    assert totals == ["%.2f ms" % sum(w for _, w in want[n]) for n in names]

    # Without a steady window, the middle decode-only step of the run
    trace = write_trace_run(tmp_path / "run2")
    fig = caught_figures(figures_module, tmp_path / "figs2", "--artifacts", ARTIFACTS, "--trace", trace, "--only", "fig15")[FIGS["fig15"]]
    assert fig.axes[2].get_title().startswith("one decode iteration (step 2, 1.0 ms; middle decode-only step of the run)")

    # With --paper ROOT (scripts/reproduce.sh's output) the trace of its fig15-breakdown sweep is drawn; none there is a skip
    paper = tmp_path / "paper"
    write_trace_run(paper / "fig15-breakdown" / "layers-8" / "rep1", steady=(2, 3))
    fig = caught_figures(figures_module, tmp_path / "figs3", "--artifacts", ARTIFACTS, "--paper", paper, "--only", "fig15")[FIGS["fig15"]]
    assert fig.axes[2].get_title().startswith("one decode iteration (step 3, 1.0 ms;")
    (tmp_path / "empty-paper").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(matplotlib.figure.Figure, "savefig", lambda *a, **k: None)
        assert figures_module.main(["--out", str(tmp_path / "f4"), "--artifacts", str(ARTIFACTS), "--paper", str(tmp_path / "empty-paper"),
                                    "--only", "fig15", "--strict"]) == 1
