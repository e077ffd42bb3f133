"""analysis/kv_formats.py on hand-made studies whose answers are known: each verdict outcome at its limit, each outcome
of the format choice, the transformers check both ways, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "analysis" / "kv_formats.py"


def run_desc(label, ppl, kv_dtype=None, kv_format=None, engine="fastdecode"):
    return {"label": label, "engine": engine, "kv_dtype": kv_dtype, "kv_format": kv_format, "scored_ppl": ppl,
            "scored_tokens": 1000}


def make_study(d, ppls, name="mha", hf=None):
    """ppls: {label: ppl}; labels follow accuracy-study.sh (reference-fp32 first)."""
    d.mkdir(parents=True)
    ref = run_desc("reference-fp32", ppls["reference-fp32"], engine="reference")
    acc = []
    for label, p in ppls.items():
        if label == "reference-fp32":
            continue
        if label.startswith("ref-"):
            r = run_desc(label, p, kv_format=label[4:], engine="reference")
        elif label == "reference-fp16kv":
            r = run_desc(label, p, engine="reference")
        else:
            r = run_desc(label, p, kv_dtype=label.split("-")[-1].replace("kv", "").replace("q8", "") or None)
            r["kv_dtype"] = [k for k in ("fp16", "int8", "int4") if k in label][0]
        acc.append({"ref": ref, "run": r, "measures": {"token_agreement": 0.99, "kl_mean": 1e-4}})
    (d / "accuracy.json").write_text(json.dumps(acc))
    (d / "train_report.json").write_text(json.dumps({"variant": name, "params": 123}))
    if hf is not None:
        (d / "hf_score.json").write_text(json.dumps({"tokens": 1000, "runs": {"fp32": {"perplexity": hf}}}))
    return d


def report(tmp_path, *studies):
    p = subprocess.run([sys.executable, str(SCRIPT), *map(str, studies), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads((tmp_path / "out" / "kv_formats.json").read_text()), p.stdout


def rows(res, model=0):
    return {r["label"]: r for r in res["models"][model]["rows"]}


BASE = {"reference-fp32": 10.0, "reference-fp16kv": 10.0, "fd-cpu-fp16kv": 20.0}


def test_each_verdict_at_its_limit(tmp_path):
    s = make_study(tmp_path / "s", {**BASE, "fd-cpu-int8kv": 20.0 * 1.0009, "fd-cpu-int8kv-q8": 20.0 * 1.0012,
                                    "fd-cpu-int4kv": 20.0 * 1.0099, "ref-int4": 10.0 * 1.0101})
    res, md = report(tmp_path, s)
    r = rows(res)
    assert r["fd-cpu-int8kv"]["verdict"] == "met" and abs(r["fd-cpu-int8kv"]["delta"] - 0.0009) < 1e-9
    assert r["fd-cpu-int8kv-q8"]["verdict"] == "not met"
    assert r["fd-cpu-int4kv"]["verdict"] == "met"
    assert r["ref-int4"]["verdict"] == "not met" and r["ref-int4"]["baseline"] == "reference-fp16kv"
    assert r["fd-cpu-fp16kv"]["verdict"] is None  # a baseline is not judged
    assert "not met" in md


def test_the_choice_keeps_the_served_int4_unless_a_format_wins_by_the_margin(tmp_path):
    a = make_study(tmp_path / "a", {**BASE, "ref-int4": 10.05, "ref-int4-ktoken": 10.30, "ref-int4-ktoken-rot": 10.045})
    res, _ = report(tmp_path, a)
    assert res["choice"]["best"] == "int4-ktoken-rot" and res["choice"]["chosen"] == "int4"  # 0.05 % < 0.1 %
    b = make_study(tmp_path / "b", {**BASE, "ref-int4": 10.05, "ref-int4-ktoken-rot": 10.02})
    res, md = report(tmp_path / "x", b)
    assert res["choice"]["chosen"] == "int4-ktoken-rot" and "**int4-ktoken-rot**" in md  # 0.3 % better
    c = make_study(tmp_path / "c", {**BASE, "ref-int4": 10.01, "ref-int4-rot": 10.02})
    res, _ = report(tmp_path / "y", c)
    assert res["choice"]["chosen"] == "int4" and res["choice"]["best"] == "int4"


def test_the_choice_averages_over_models_and_needs_every_model(tmp_path):
    mha = make_study(tmp_path / "m", {**BASE, "ref-int4": 10.10, "ref-int4-rot": 10.00}, name="mha")
    gqa = make_study(tmp_path / "g", {**BASE, "ref-int4": 10.00, "ref-int4-rot": 10.20, "ref-int4-ktoken": 9.0}, name="gqa")
    res, _ = report(tmp_path, mha, gqa)
    # int4: (+1.0 % + 0 %) / 2 = 0.5 %; int4-rot: (0 % + 2 %) / 2 = 1 %; int4-ktoken only in one model: not a candidate
    assert abs(res["choice"]["mean_delta"]["int4"] - 0.005) < 1e-9 and "int4-ktoken" not in res["choice"]["mean_delta"]
    assert res["choice"]["chosen"] == "int4"


def test_reference_against_transformers_both_ways(tmp_path):
    res, md = report(tmp_path, make_study(tmp_path / "a", BASE, hf=10.005))
    assert res["models"][0]["hf_check"]["agree"] and "agree within" in md
    res, md = report(tmp_path / "z", make_study(tmp_path / "b", BASE, hf=10.02))
    assert not res["models"][0]["hf_check"]["agree"] and "DISAGREE" in md


def test_bad_input(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    p = subprocess.run([sys.executable, str(SCRIPT), str(d)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no accuracy.json" in p.stderr
    s = make_study(tmp_path / "s", BASE)
    acc = json.loads((s / "accuracy.json").read_text())
    acc[0]["run"]["scored_ppl"] = None
    (s / "accuracy.json").write_text(json.dumps(acc))
    p = subprocess.run([sys.executable, str(SCRIPT), str(s)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no scored perplexity" in p.stderr
