"""The reference engine through a KV format (engine.kv_format, kernels/cpu/kv_codec.h) against FastDecode's R-workers
storing that format: the study formats are judged on the reference engine, so its view of a served format must be the
R-workers' own. Also the formats' bad input and output.logits.full = N (every request scored, the first N written)."""

from __future__ import annotations

import json
import random
import subprocess

import numpy as np
import pytest

from conftest import MODELS_DIR, REPO_ROOT

SCORE = REPO_ROOT / "experiments" / "accuracy" / "score.json"
FD = '{"type":"fastdecode","backend":"cpu","mini_batches":2,"rworkers":{"spawn":2,"threads":1,"kv_dtype":"%s","query":"fp32","memory_gb":0.25}}'


@pytest.fixture(scope="module")
def score_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("kvf")
    rng = random.Random(7)
    with open(d / "score.jsonl", "w") as f:  # prompts over one block, continuations filling three more
        for i in range(3):
            f.write(json.dumps({"prompt": [rng.randrange(256) for _ in range(37 + 5 * i)],
                                "continuation": [rng.randrange(256) for _ in range(70)]}) + "\n")
    return d / "score.jsonl"


def score(fd_bin, out, score_file, engine, *extra):
    args = [str(fd_bin("fd-bench")), "run", str(SCORE), "--out", str(out), "--quiet",
            "--set", f"model.config={MODELS_DIR / 'tiny-llama.json'}", "--set", f"workload.score={score_file}",
            "--set", f"engine={engine}", *extra]
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def logits(run):
    return {json.loads(line)["request"]: np.load(run / "logits" / f"request_{json.loads(line)['request']}.npy")
            for line in open(run / "logits.jsonl")}


def kl_mean(a, b):
    out = []
    for rid in a:
        la = a[rid] - np.log(np.exp(a[rid] - a[rid].max(1, keepdims=True)).sum(1, keepdims=True)) - a[rid].max(1, keepdims=True)
        lb = b[rid] - np.log(np.exp(b[rid] - b[rid].max(1, keepdims=True)).sum(1, keepdims=True)) - b[rid].max(1, keepdims=True)
        out += (np.exp(la) * (la - lb)).sum(1).tolist()
    return float(np.mean(out))


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_reference_through_a_served_format_is_what_the_rworkers_compute(fd_bin, tmp_path, score_file, fmt):
    runs = {}
    for name, engine in [("fd", FD % fmt), ("ref", json.dumps({"type": "reference", "kv_format": fmt})),
                         ("ref16", '{"type":"reference","kv_dtype":"fp16"}'),
                         ("other", json.dumps({"type": "reference", "kv_format": "int4-ktoken-rot"}))]:
        p = score(fd_bin, tmp_path / name, score_file, engine)
        assert p.returncode == 0, p.stderr
        runs[name] = logits(tmp_path / name)
    same = kl_mean(runs["fd"], runs["ref"])
    fp16 = kl_mean(runs["fd"], runs["ref16"])
    other = kl_mean(runs["fd"], runs["other"])
    print(f"{fmt}: KL(fd || ref {fmt}) {same:.2e}, vs the fp16-KV reference {fp16:.2e}, vs int4-ktoken-rot {other:.2e}")
    # The R-workers hold exactly the format's values; only the fp32 sums' order differs (measured ~1e-8 for int4).
    assert same < fp16 / 20, "the reference through the format should be far closer to the R-workers than fp16 KV"
    assert same < other / 20, "another format's values should be farther from the R-workers than the format's own"
    summary = json.load(open(tmp_path / "ref" / "summary.json"))
    assert summary["config"]["engine"]["kv_format"] == fmt


def test_bad_formats_are_refused_before_any_work(fd_bin, tmp_path, score_file):
    p = score(fd_bin, tmp_path / "a", score_file, '{"type":"reference","kv_format":"int3"}')
    assert p.returncode == 2 and "int4-ktoken-rot" in p.stderr, p.stderr
    p = score(fd_bin, tmp_path / "b", score_file, '{"type":"reference","kv_format":"int4","kv_dtype":"fp32"}')
    assert p.returncode == 2 and "kv_dtype must be fp16" in p.stderr, p.stderr
    assert not (tmp_path / "a" / "summary.json").exists()


def test_full_logits_of_the_first_n_requests_and_every_score(fd_bin, tmp_path, score_file):
    p = score(fd_bin, tmp_path / "r", score_file, '{"type":"reference","kv_format":"int4-rot"}', "--set", "output.logits.full=1")
    assert p.returncode == 0, p.stderr
    assert sorted(x.name for x in (tmp_path / "r" / "logits").iterdir()) == ["request_0.npy"]
    lines = [json.loads(line) for line in open(tmp_path / "r" / "logits.jsonl")]
    assert [line.get("full", True) for line in lines] == [True, False, False]
    s = json.load(open(tmp_path / "r" / "summary.json"))["score"]
    assert s["requests"] == 3 and s["tokens"] == 210
