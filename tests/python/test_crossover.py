"""analysis/crossover.py (issue 41, step 5): the crossover grid predicted from profiles, then measured.

Checked: the committed report (artifacts/paper/crossover/) is what the script makes of the committed predictions and
runs; every committed prediction is what `fd-bench predict` says from the committed profiles alone (nothing taken from
the runs); the point names the script reads are the ones `fd-bench sweep --dry-run` gives the specs; and on synthetic
runs both outcomes of the crossover verdict and of the prediction band are reached, with expectations computed here.
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import pytest
from conftest import FIXTURES, load_analysis

REPO = Path(__file__).resolve().parents[2]
ART = REPO / "artifacts" / "paper" / "crossover"
GROUPS = [("h100-c", 24)] + [("h100-d", m) for m in (24, 22, 20, 16)]


# `fd-bench predict`'s answers in this session, by its arguments (the committed profiles' paths and the numbers asked):
# the five groups' calls repeat predictions (h100-d's FastDecode point at every memory size, gpu-only and paged-swap
# points predicted alike), each an fd-bench start (~1 s of CPU, LibTorch); a repeat gets the answer fd-bench gave.
_PREDICTED = {}


def crossover_cached():
    cx = load_analysis("crossover")
    ask = cx.fd_bench_json

    def cached(fd_bench, args):
        key = (fd_bench, tuple(args))
        if key not in _PREDICTED:
            _PREDICTED[key] = ask(fd_bench, args)
        return copy.deepcopy(_PREDICTED[key])
    cx.fd_bench_json = cached
    return cx


def group_args(root: Path):
    out = []
    for g, m in GROUPS:
        out += ["--group", g, str(root / g / f"predictions_mem-{m}.json"), str(root / g / "runs" / f"mem-{m}")]
    return out


def test_committed_report_is_current(tmp_path):
    load_analysis("crossover").main(["report", *group_args(ART), "--out", str(tmp_path)])
    for f in ("CROSSOVER.md", "crossover.json"):
        assert (tmp_path / f).read_text() == (ART / f).read_text(), \
            f"{f} is stale: rerun the command in artifacts/paper/crossover/README.md"


@pytest.mark.parametrize("group,mem", GROUPS)
def test_committed_predictions_come_from_the_profiles_alone(fd_bin, tmp_path, group, mem):
    committed = json.loads((ART / group / f"predictions_mem-{mem}.json").read_text())
    only = sorted({"kv=" + p["kv"] for p in committed["points"] if p["engine"] == "fastdecode"})
    args = ["predict", "--fd-bench", fd_bin("fd-bench"), "--profiles", str(ART / group / "profiles"),
            "--balance-bench", str(ART / group / "profiles" / "balance_bench.json"), "--memory-gb", str(mem),
            "--out", str(tmp_path / "p.json")]
    if group == "h100-d":  # its call predicted the int4 subset only (CROSSOVER_ONLY)
        args += ["--only", "kv=int4", "b=256", "maxctx=544"]
    crossover_cached().main(args)
    again = json.loads((tmp_path / "p.json").read_text())
    key = lambda p: (p["sweep"], p["point"])  # noqa: E731
    assert sorted(map(key, again["points"])) == sorted(map(key, committed["points"])), only
    for a, c in zip(sorted(again["points"], key=key), sorted(committed["points"], key=key)):
        assert a["predicted"]["tokens_per_s"] == pytest.approx(c["predicted"]["tokens_per_s"], rel=1e-9), key(a)
        assert a["predicted"]["batch"] == c["predicted"]["batch"]


def test_point_names_are_the_sweeps(fd_bin, tmp_path):
    """The point names the script reads are the ones `fd-bench sweep` gives each sweep spec now (--dry-run prints them)."""
    import subprocess
    cx = load_analysis("crossover")
    names = {(s, n) for s, n, _ in cx.points()}
    written = set()
    for sweep, spec in cx.SPECS.items():
        p = subprocess.run([fd_bin("fd-bench"), "sweep", spec, "--out", str(tmp_path / sweep), "--dry-run"], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        written |= {(sweep, line.split(":")[0].strip()) for line in p.stdout.splitlines() if line.startswith("  ") and ":" in line}
    assert written and written == names


def fake_run(d: Path, tok_s: float, batch: int, fastdecode: bool):
    """A run folder of 10 decode-only steps at `batch` that make `tok_s` decode tokens/s (and one prefill step)."""
    d.mkdir(parents=True)
    step_ms = 1e3 * batch / tok_s
    steps = [{"step": 0, "prefill_tokens": 512 * batch, "decode_tokens": 0, "step_ms": 50.0, "total_context": 512 * batch}]
    for i in range(1, 11):
        s = {"step": i, "prefill_tokens": 0, "decode_tokens": batch, "step_ms": step_ms, "total_context": (512 + i) * batch}
        if fastdecode:
            s["breakdown_ms"] = {"r_compute_max": 0.8 * step_ms, "s_compute": 0.2 * step_ms, "r_wait": 0.7 * step_ms}
        steps.append(s)
    with gzip.open(d / "steps.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(s) + "\n" for s in steps))
    (d / "summary.json").write_text(json.dumps({"results": {"output_throughput": tok_s / 2},
                                                "provenance": {"git_commit": "x", "date_utc": "d", "cpu_model": "c", "gpus": []}}))


@pytest.mark.parametrize("fd_tok_s,expect_win", [(9100.0, False), (12500.0, True)])
def test_verdicts_reach_both_outcomes(tmp_path, fd_tok_s, expect_win):
    cx = load_analysis("crossover")
    pts = [(s, n, v) for s, n, v in cx.points(["kv=int4", "b=256", "maxctx=544,1024"])]
    predicted = {"crossover-fastdecode": 10000.0, "crossover-gpu-only": 11000.0, "crossover-paged-swap": 11000.0}
    measured = {("crossover-fastdecode", "kv-int4_b-256"): fd_tok_s, ("crossover-gpu-only", "maxctx-544_b-256"): 11500.0,
                ("crossover-gpu-only", "maxctx-1024_b-256"): 8000.0, ("crossover-paged-swap", "b-256"): 9000.0}
    rows = []
    for s, n, v in pts:
        fake_run(tmp_path / "runs" / s / n / "rep1", measured[(s, n)], 256 if s == "crossover-fastdecode" else 32,
                 s == "crossover-fastdecode")
        rows.append({"sweep": s, "point": n, "engine": "fastdecode" if s == "crossover-fastdecode" else s[len("crossover-"):],
                     "kv": v.get("kv", "fp16"), "b": v["b"], "maxctx": v.get("maxctx"),
                     "predicted": {"tokens_per_s": predicted[s], "step_ms": 1.0, "batch": 32, "binds": "R", "model": {}}})
    pred = {"criteria": cx.CRITERIA, "memory_gb": 24, "context": 528.0, "profiles": {"gpu": "g.json", "service": "s.json"},
            "gpu_attn_gbps": 600.0, "points": rows}
    (tmp_path / "p.json").write_text(json.dumps(pred))
    cx.main(["report", "--group", "m", str(tmp_path / "p.json"), str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    out = json.loads((tmp_path / "out" / "crossover.json").read_text())
    (v,) = out["verdicts"]
    assert v["best_gpu"] == "gpu-only maxctx-544_b-256"  # the strongest GPU side, not the first
    assert v["ratio"] == pytest.approx(fd_tok_s / 11500.0)
    assert v["out_generates"] is expect_win
    assert bool(out["summary"]["crossover_measured"]) is expect_win
    # The band: |m/p - 1| <= 10 % for gpu-only 544 (11500 / 11000) and for FastDecode only at 9100 (9100 / 10000);
    # gpu-only 1024 (8000 / 11000) and paged-swap (9000 / 11000) are outside.
    errs = [abs(fd_tok_s / 10000 - 1), abs(11500 / 11000 - 1), abs(8000 / 11000 - 1), abs(9000 / 11000 - 1)]
    assert out["summary"]["within_band"] == sum(e <= 0.10 for e in errs)
    assert out["summary"]["max_abs_err"] == pytest.approx(max(errs))
    md = (tmp_path / "out" / "CROSSOVER.md").read_text()
    assert ("| yes |" in md) is expect_win and ("| no |" in md) is (not expect_win)


def test_predict_gpu_only_refuses_what_it_cannot_model(fd_bin):
    """`fd-bench predict --engine gpu-only`: what is missing or FastDecode's alone is an error (exit 2) that names it;
    a memory that holds no sequence is said, not predicted as zero."""
    import subprocess
    prof = str(FIXTURES / "profiles" / "profile_llama-2-7b_cuda_sm8.json")
    model = str(REPO / "experiments" / "models" / "llama-2-7b.json")
    base = [fd_bin("fd-bench"), "predict", "--profile", prof, "--batch", "256", "--context", "528", "--layers", "2",
            "--engine", "gpu-only"]
    full = ["--gpu-attn-gbps", "600", "--model", model, "--gpu-mem-gb", "24", "--max-context", "544"]
    ok = subprocess.run(base + full, capture_output=True, text=True)
    assert ok.returncode == 0 and "MODELLED gpu-only: 33 sequences" in ok.stdout, ok.stdout + ok.stderr
    for extra, needle in [(full[:2], "needs --gpu-attn-gbps, --model, --gpu-mem-gb and --max-context"),
                          (full + ["--kv-dtype", "int4"], "--service and --kv-dtype are FastDecode's"),
                          (full[:-3] + ["14", "--max-context", "544"], "holds no sequence")]:
        r = subprocess.run(base + extra, capture_output=True, text=True)
        assert r.returncode == 2 and needle in r.stderr, (extra, r.returncode, r.stderr)
