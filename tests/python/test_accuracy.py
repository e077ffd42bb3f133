"""analysis/accuracy.py on hand-made run folders whose answers are known: identical runs, a known KL, a
divergence, a scoring (forced) run, and bad input."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "analysis" / "accuracy.py"


def make_run(d: Path, reqs, forced=None, seeded=True):
    """reqs: {id: (picked tokens, logits [n, V])}; forced: {id: fed tokens} for a scoring run."""
    (d / "logits").mkdir(parents=True)
    with open(d / "logits.jsonl", "w") as f:
        for rid, (toks, lg) in reqs.items():
            np.save(d / "logits" / f"request_{rid}.npy", np.asarray(lg, dtype=np.float32))
            line = {"request": rid, "tokens": list(map(int, toks))}
            if forced is not None:
                line["forced"] = list(map(int, forced[rid]))
            f.write(json.dumps(line) + "\n")
    w = {"seed": 1} if seeded else {"dir": "x"}
    (d / "summary.json").write_text(json.dumps({"engine": "fastdecode", "config": {"model": {"weights": w}, "engine": {}}}))
    return d


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)


def kl(p_logits, q_logits):
    p = np.exp(p_logits - p_logits.max()); p /= p.sum()
    q = np.exp(q_logits - q_logits.max()); q /= q.sum()
    return float((p * (np.log(p) - np.log(q))).sum())


def test_identical_runs_agree_exactly(tmp_path):
    rng = np.random.default_rng(0)
    lg = rng.normal(size=(5, 11)).astype(np.float32)
    reqs = {0: (lg.argmax(1), lg)}
    a, b = make_run(tmp_path / "a", reqs), make_run(tmp_path / "b", reqs)
    proc = run(a, b, "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    res = json.loads((tmp_path / "out" / "accuracy.json").read_text())[0]["measures"]
    assert res["token_agreement"] == 1.0 and res["kl_max"] == 0.0 and res["logit_rel_err_max"] == 0.0
    assert res["ppl_delta"] == 0.0
    assert "seeded random" in proc.stdout
    assert (tmp_path / "out" / "accuracy.png").stat().st_size > 1000


def test_known_kl_error_and_perplexity(tmp_path):
    rng = np.random.default_rng(1)
    la = rng.normal(size=(4, 7)).astype(np.float32)
    lb = la.copy()
    lb[2, 3] += 0.5  # one position moved, without changing its argmax unless 3 was the argmax
    toks = (la.argmax(1) + 1) % 7  # the scored stream differs from the picks
    a = make_run(tmp_path / "a", {7: (la.argmax(1), la)}, forced={7: toks})
    b = make_run(tmp_path / "b", {7: (lb.argmax(1), lb)}, forced={7: toks})
    assert run(a, b, "--out", tmp_path / "o").returncode == 0
    m = json.loads((tmp_path / "o" / "accuracy.json").read_text())[0]["measures"]
    expect = [kl(la[i].astype(np.float64), lb[i].astype(np.float64)) for i in range(4)]
    assert m["kl_max"] == pytest.approx(max(expect), rel=1e-6)
    assert m["kl_mean"] == pytest.approx(np.mean(expect), rel=1e-6)
    assert m["logit_rel_err_max"] == pytest.approx(0.5 / np.abs(la[2]).max(), rel=1e-6)
    lsa = [la[i] - np.log(np.exp(la[i]).sum()) for i in range(4)]
    lsb = [lb[i] - np.log(np.exp(lb[i]).sum()) for i in range(4)]
    ppl_a = math.exp(-np.mean([lsa[i][toks[i]] for i in range(4)]))
    ppl_b = math.exp(-np.mean([lsb[i][toks[i]] for i in range(4)]))
    assert m["ppl_ref"] == pytest.approx(ppl_a, rel=1e-6) and m["ppl_run"] == pytest.approx(ppl_b, rel=1e-6)


def test_free_running_divergence_stops_the_comparison(tmp_path):
    rng = np.random.default_rng(2)
    la = rng.normal(size=(6, 9)).astype(np.float32)
    lb = rng.normal(size=(6, 9)).astype(np.float32)  # after the divergence: other contexts, other logits
    lb[:3] = la[:3]
    ta = la.argmax(1).tolist()
    tb = ta[:3] + [(ta[3] + 1) % 9] + ta[4:]
    a, b = make_run(tmp_path / "a", {1: (ta, la)}), make_run(tmp_path / "b", {1: (tb, lb)})
    assert run(a, b, "--out", tmp_path / "o").returncode == 0
    m = json.loads((tmp_path / "o" / "accuracy.json").read_text())[0]["measures"]
    assert m["first_divergences"] == [3]
    assert m["compared_positions"] == 4  # positions 0..3 saw the same prefix
    assert m["token_agreement"] == pytest.approx(5 / 6)


def test_bad_input_exit_2(tmp_path):
    a = make_run(tmp_path / "a", {0: ([1, 2], np.zeros((2, 4)))})
    (tmp_path / "empty").mkdir()
    proc = run(a, tmp_path / "empty")
    assert proc.returncode == 2 and "no logits.jsonl" in proc.stderr
    b = make_run(tmp_path / "b", {5: ([1, 2], np.zeros((2, 4)))})
    proc = run(a, b)
    assert proc.returncode == 2 and "no recorded request in common" in proc.stderr
    c = make_run(tmp_path / "c", {0: ([1, 2], np.zeros((2, 4)))})
    (c / "logits" / "request_0.npy").unlink()
    proc = run(a, c)
    assert proc.returncode == 2 and "request_0.npy is missing" in proc.stderr
    assert run(a).returncode == 2  # one run: nothing to compare
    f1 = make_run(tmp_path / "f1", {0: ([1, 2], np.zeros((2, 4)))}, forced={0: [3, 3]})
    f2 = make_run(tmp_path / "f2", {0: ([1, 2], np.zeros((2, 4)))}, forced={0: [3, 1]})
    proc = run(f1, f2)
    assert proc.returncode == 2 and "forced through different tokens" in proc.stderr
    proc = run(a, f1)
    assert proc.returncode == 2 and "compare like with like" in proc.stderr
