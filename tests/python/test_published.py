"""experiments/paper/published.json: the numbers the FastDecode paper states in its text, as data.

Checked here: the file loads, says that the figures' curves were not digitised, every entry has the fields
analysis/fig_baselines.py reads, every stated value is written in its quote (so a mistyped number shows),
and every derived value equals its arithmetic (the expression is evaluated here, numbers and + - * / only).
"""

from __future__ import annotations

import ast
import json
import math
import operator
from pathlib import Path

import pytest

PUBLISHED = Path(__file__).resolve().parents[2] / "experiments" / "paper" / "published.json"
FIELDS = ("id", "figure", "system", "model", "metric", "value", "unit", "batch", "seq_len", "hardware", "kind", "derivation",
          "bound", "quote", "note")
SYSTEMS = {"FastDecode", "vLLM", "TensorRT-LLM", "FastLLM", "Vanilla"}
HARDWARE = "1x A10 + up to 4 nodes of 2x AMD Epyc"
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def arithmetic(expr: str) -> float:
    """Value of a plain arithmetic expression; anything else (names, calls, powers) is refused."""
    def ev(n):
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) and not isinstance(n.value, bool):
            return float(n.value)
        if isinstance(n, ast.BinOp) and type(n.op) in OPS:
            return OPS[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return -ev(n.operand)
        raise ValueError(f"not plain arithmetic: {ast.dump(n)}")
    return ev(ast.parse(expr, mode="eval"))


@pytest.fixture(scope="module")
def doc():
    return json.loads(PUBLISHED.read_text(encoding="utf-8"))


def test_loads_and_says_curves_not_digitised(doc):
    assert "not digitised" in doc["note"].lower() or "not digitized" in doc["note"].lower()
    assert doc["hardware"] == HARDWARE
    assert len(doc["entries"]) >= 30


def test_every_entry_has_the_fields(doc):
    for i, e in enumerate(doc["entries"]):
        where = f"entry {i} ({e.get('figure')} {e.get('system')} {e.get('metric')})"
        assert set(e) == set(FIELDS), where + f": keys {sorted(e)}"
        assert e["system"] in SYSTEMS, where
        assert e["kind"] in ("stated", "derived"), where
        assert e["bound"] in (None, "lower", "upper"), where
        assert e["hardware"] == HARDWARE, where
        assert isinstance(e["value"], (int, float)) and not isinstance(e["value"], bool), where
        assert e["quote"] and e["figure"] and e["metric"] and e["unit"], where
        assert e["batch"] is None or isinstance(e["batch"], int), where


def test_stated_values_are_in_their_quotes(doc):
    stated = [e for e in doc["entries"] if e["kind"] == "stated"]
    assert stated
    for e in stated:
        assert e["derivation"] is None, e
        assert "%g" % e["value"] in e["quote"], f"{e['metric']} = {e['value']} is not written in its quote: {e['quote']}"


def test_derived_values_equal_their_arithmetic(doc):
    derived = [e for e in doc["entries"] if e["kind"] == "derived"]
    assert len(derived) >= 5
    for e in derived:
        v = arithmetic(e["derivation"])
        # Values are rounded to at most 3 decimals (or 4 significant digits) when written.
        assert math.isclose(e["value"], v, rel_tol=5e-4, abs_tol=5e-3), f"{e['metric']}: {e['derivation']} = {v}, file says {e['value']}"


def test_the_headline_numbers(doc):
    """The claims table of BENCHMARKING.md, looked up by what they are (not by position)."""
    def one(**kw):
        hits = [e for e in doc["entries"] if all(e[k] == v for k, v in kw.items())]
        assert len(hits) == 1, kw
        return hits[0]["value"]
    assert one(system="FastDecode", model="Llama-7b", metric="max_throughput") == 2200
    assert one(system="vLLM", model="Llama-7b", metric="max_throughput") == pytest.approx(2200 / 4)
    assert one(system="TensorRT-LLM", model="Llama-7b", metric="max_throughput") == pytest.approx(2200 / 8.7, rel=1e-4)
    assert one(system="FastDecode", model="Llama-7b", metric="mean_token_latency") == 120.8
    assert one(system="FastDecode", model="Llama-13b", metric="mean_token_latency") == 191.6
    assert sorted(e["value"] for e in doc["entries"] if e["metric"] == "throughput_ratio_vs_vLLM" and e["model"] == "Llama-13b") == [4.12, 5.04]


def test_arithmetic_refuses_anything_else():
    assert arithmetic("(3 + 7.4) / 43 * 100") == pytest.approx(24.186, rel=1e-4)
    for bad in ("__import__('os')", "2 ** 10", "x + 1"):
        with pytest.raises(ValueError):
            arithmetic(bad)
