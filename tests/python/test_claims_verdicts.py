"""The claims' verdicts (issue 41): experiments/paper/claims.spec.json gives each claim of the paper the bands in which
it holds, holds in shape, and (outside both) does not hold; analysis/claims.py judges every claim with one function.

Checked here, from synthetic values: every outcome of every claim is reached, each at values worked out by hand from
the paper's number and the spec's stated rules (this file's table, not the spec's bands: a band moved in the spec
turns a case here red); a claim without a value is "not measured", an untestable one "cannot be tested here"; every
claim can come out "does not hold"; every number the paper states (experiments/paper/published.json) is judged by a
claim or listed as not a claim, with why; every claim cites the paper by its arXiv id; nothing cites a file outside
the repository.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import load_analysis

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "experiments" / "paper" / "claims.spec.json"
PUBLISHED = REPO / "experiments" / "paper" / "published.json"


def claims_module():
    return load_analysis("claims")


H, S, N = "holds", "holds in shape", "does not hold"

# Per claim: ({metric: value}, expected verdict), from the paper's value and the spec's rules:
#   about v: holds [0.8 v, 1.2 v], in shape [v/2, 2 v]; at least v: holds >= 0.9 v, in shape >= v/2;
#   at most v: holds <= 1.1 v, in shape <= 2 v; a gain c x: holds >= 0.8 c, in shape (1, 0.8 c); a gain +c %: holds
#   >= 0.9 c, in shape (0, 0.9 c); R²: holds >= 0.99, in shape >= 0.95; directions never in shape across 1.
CASES = {
    "fig9-fd-7b-max-throughput": [({"tok_s": 2500}, H), ({"tok_s": 1980}, H), ({"tok_s": 1979}, S), ({"tok_s": 1100}, S),
                                  ({"tok_s": 1099}, N), ({"tok_s": 271}, N)],
    "fig9-fd-7b-over-vllm": [({"ratio": 4.0}, H), ({"ratio": 3.2}, H), ({"ratio": 3.19}, S), ({"ratio": 1.01}, S),
                             ({"ratio": 1.0}, N), ({"ratio": 0.24}, N)],
    "fig9-fd-7b-over-trt": [({"ratio": 8.7}, H), ({"ratio": 6.96}, H), ({"ratio": 6.9}, S), ({"ratio": 1.0}, N)],
    "fig9-fd-13b-over-vllm": [({"ratio": 4.12}, H), ({"ratio": 3.3}, H), ({"ratio": 3.29}, S), ({"ratio": 0.05}, N)],
    "fig9-fd-over-vllm-b128": [({"ratio": 2.0}, H), ({"ratio": 1.51}, H), ({"ratio": 1.5}, S), ({"ratio": 1.0}, N)],
    "fig9-gpu-only-batch": [({"batch": 16}, H), ({"batch": 17}, H), ({"batch": 17.7}, S), ({"batch": 32}, S), ({"batch": 33}, N)],
    "fig10-fd-7b-latency-b128": [({"ms": 120.8}, H), ({"ms": 97}, H), ({"ms": 144}, H), ({"ms": 96}, S), ({"ms": 61}, S),
                                 ({"ms": 240}, S), ({"ms": 60}, N), ({"ms": 242}, N), ({"ms": 497}, N)],
    "fig10-fd-13b-latency-b128": [({"ms": 191.6}, H), ({"ms": 230.5}, S), ({"ms": 95}, N), ({"ms": 384}, N)],
    "fig10-vllm-latency-above-fd": [({"ratio": 1.5}, H), ({"ratio": 1.0}, N), ({"ratio": 0.06}, N)],
    "fig10-latency-for-throughput": [({"latency_ratio": 2.5, "throughput_ratio": 4.5}, H),
                                     ({"latency_ratio": 2.7, "throughput_ratio": 3.7}, H),
                                     ({"latency_ratio": 4.0, "throughput_ratio": 4.5}, S),  # more latency than said
                                     ({"latency_ratio": 2.0, "throughput_ratio": 2.0}, S),  # less gain than said
                                     ({"latency_ratio": 6.0, "throughput_ratio": 4.5}, N),
                                     ({"latency_ratio": 2.0, "throughput_ratio": 1.0}, N),  # no gain
                                     ({"latency_ratio": 27.5, "throughput_ratio": 0.29}, N)],
    "fig10-step-latency-increase": [({"ratio": 3.5}, H), ({"ratio": 2.9}, H), ({"ratio": 4.1}, H), ({"ratio": 2.0}, S),
                                    ({"ratio": 6.9}, S), ({"ratio": 1.7}, N), ({"ratio": 7.11}, N)],
    "fig3-spart-growth": [({"ratio": 5.0}, H), ({"ratio": 4.0}, H), ({"ratio": 6.0}, H), ({"ratio": 3.96}, S), ({"ratio": 2.5}, S),
                          ({"ratio": 10.0}, S), ({"ratio": 2.4}, N), ({"ratio": 11.0}, N)],
    "fig3-attention-gpu-vs-cpu": [({"ratio": 1.0}, H), ({"ratio": 0.81}, H), ({"ratio": 1.24}, H), ({"ratio": 0.5}, S),
                                  ({"ratio": 1.9}, S), ({"ratio": 0.49}, N), ({"ratio": 37.0}, N)],
    "fig8-linear-in-layers": [({"r2": 0.9987}, H), ({"r2": 0.99}, H), ({"r2": 0.97}, S), ({"r2": 0.8962}, N)],
    "fig11-sls-latency": [({"ratio": 0.68}, H), ({"ratio": 0.6}, H), ({"ratio": 0.77}, H), ({"ratio": 0.5}, S), ({"ratio": 0.9}, S),
                          ({"ratio": 1.0}, N), ({"ratio": 1.12}, N)],
    "fig11-sls-gain": [({"gain": 0.09}, H), ({"gain": 0.073}, H), ({"gain": 0.039}, S), ({"gain": 0.001}, S), ({"gain": 0.0}, N),
                       ({"gain": -0.218}, N)],
    "fig12-sls-gain": [({"gain": 0.13}, H), ({"gain": 0.118}, H), ({"gain": 0.014}, S), ({"gain": 0.0}, N), ({"gain": -0.175}, N)],
    "sls-load-control": [({"vs_fixed": 0.02}, H), ({"vs_fixed": 0.0}, H), ({"vs_fixed": -0.001}, N), ({"vs_fixed": -0.05}, N)],
    "fig13-scaling-s1024": [({"efficiency": 0.728}, H), ({"efficiency": 0.66}, H), ({"efficiency": 0.64}, S),
                            ({"efficiency": 0.37}, S), ({"efficiency": 0.36}, N)],
    "fig13-scaling-s128": [({"efficiency": 0.376}, H), ({"efficiency": 0.31}, H), ({"efficiency": 0.45}, H), ({"efficiency": 0.5}, S),
                           ({"efficiency": 0.19}, S), ({"efficiency": 0.75}, S), ({"efficiency": 0.18}, N), ({"efficiency": 0.8}, N)],
    "fig15-busy": [({"r_busy": 0.97, "s_busy": 0.05}, H), ({"r_busy": 0.68, "s_busy": 0.54}, H),
                   ({"r_busy": 0.6, "s_busy": 0.05}, S), ({"r_busy": 0.97, "s_busy": 0.7}, S),
                   ({"r_busy": 0.3, "s_busy": 0.05}, N), ({"r_busy": 0.97, "s_busy": 0.8}, N)],
    "fig15-transfer-share": [({"share": 0.25}, H), ({"share": 0.21}, H), ({"share": 0.13}, S), ({"share": 0.45}, S),
                             ({"share": 0.12}, N), ({"share": 0.51}, N)],
    "s4-int4-speedup": [({"speedup": 4.0}, H), ({"speedup": 3.2}, H), ({"speedup": 3.11}, S), ({"speedup": 2.0}, S),
                        ({"speedup": 1.9}, N), ({"speedup": 8.1}, N)],
    "s4-cpus-inverse-hidden": [({"ratio": 1.0}, H), ({"ratio": 1.2}, H), ({"ratio": 0.6}, S), ({"ratio": 0.4}, N), ({"ratio": 2.1}, N)],
}
UNTESTABLE = {"fig14-model-parallel"}


@pytest.fixture(scope="module")
def cl():
    return claims_module()


@pytest.fixture(scope="module")
def spec(cl):
    return cl.load_spec(str(SPEC))


def test_every_claim_has_its_cases(spec):
    assert set(spec) == set(CASES) | UNTESTABLE, "a claim of the spec without cases here, or cases for no claim"


@pytest.mark.parametrize("cid", sorted(CASES))
def test_every_outcome_of_every_claim(cl, spec, cid):
    c = spec[cid]
    for values, want in CASES[cid]:
        assert cl.judge(c, values) == want, f"{cid} at {values}"
    reached = {want for _, want in CASES[cid]}
    assert N in reached and H in reached, f"{cid}: the cases reach neither 'holds' nor 'does not hold'"
    if all(m.get("in_shape") for m in c["metrics"].values()):
        assert S in reached, f"{cid} has in-shape bands: a case must reach them"
    # No value for any one metric: not measured.
    for name in c["metrics"]:
        values = dict(CASES[cid][0][0])
        values[name] = None
        assert cl.judge(c, values) == "not measured"


def test_untestable_claims_say_so(cl, spec):
    for cid in UNTESTABLE:
        assert spec[cid].get("testable") is False and spec[cid].get("why")
        assert cl.judge(spec[cid], {"gain": 1.84}) == "cannot be tested here"


def test_bands_are_well_formed(spec):
    for cid, c in spec.items():
        assert c["metrics"], cid
        for name, m in c["metrics"].items():
            for key in ("holds", "in_shape"):
                band = m.get(key)
                if band is None:
                    continue
                lo, hi = band
                assert lo is None or hi is None or lo <= hi, f"{cid}.{name}.{key}: {band}"
            assert set(m.get("open", [])) <= {"holds.low", "holds.high", "in_shape.low", "in_shape.high"}, cid
            assert m.get("what") and m.get("rule"), f"{cid}.{name}: say what is measured and by which rule the bands were set"


def test_every_stated_number_is_judged_or_set_aside(spec):
    doc = json.loads(PUBLISHED.read_text(encoding="utf-8"))
    entries = {e["id"]: e for e in doc["entries"]}
    assert len(entries) == len(doc["entries"]), "published entry ids are not unique"
    named = {i for c in spec.values() for i in c.get("published", [])}
    assert named <= set(entries), f"claims name entries that do not exist: {sorted(named - set(entries))}"
    aside = json.loads(SPEC.read_text(encoding="utf-8"))["not_claims"]
    for i, e in entries.items():
        if e["kind"] == "stated":
            assert i in named or i in aside, f"the paper's {e['figure']} {e['metric']} = {e['value']} has no claim row"
    for i, why in aside.items():
        assert i in entries and why, i


def test_cited_by_arxiv_id_and_nothing_outside_the_repository(spec):
    for cid, c in spec.items():
        assert c["cite"].startswith("arXiv:2403.11421, "), cid
    doc = json.loads(PUBLISHED.read_text(encoding="utf-8"))
    assert doc["paper"] == "arXiv:2403.11421"
    text = PUBLISHED.read_text(encoding="utf-8") + SPEC.read_text(encoding="utf-8")
    for outside in ("shared/", "../", "/work/"):
        assert outside not in text, f"a reference to {outside!r}: cite the paper, or files in this repository"


def test_a_note_never_changes_a_verdict(cl, tmp_path):
    """CLAIMS.md's verdict column starts with the spec's verdict; what follows ' — ' is a note."""
    out = tmp_path / "CLAIMS.md"
    assert cl.main(["--out", str(out)]) == 0
    spec = cl.load_spec(str(SPEC))
    rows = [l.split(" | ") for l in out.read_text(encoding="utf-8").splitlines() if l.startswith("| ") and " | arXiv:" in l]
    assert len(rows) >= len(spec)
    outcomes = (H, S, N, "not measured", "cannot be tested here")
    for r in rows:
        verdict = r[5]
        assert any(verdict == o or verdict.startswith(o + " — ") or verdict.startswith(o + ": ") or verdict.startswith(o + ";")
                   for o in outcomes), verdict
