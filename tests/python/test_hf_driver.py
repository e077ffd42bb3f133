"""baselines/hf/run_hf.py, the transformers driver: its pure parts here (no torch needed), end to end where
torch and transformers import (a visible skip elsewhere).

Pure parts: it imports without torch; it reads the workload and the resolved config from fd-bench (a fake
fd-bench here, so the test pins the interface, not the C++); static batches in arrival order; left padding
and masks; the latency distributions against numpy and against the names of our own summary.json; the
steps / requests records a fake generator's output gives (tokens past gen_len or eos dropped, times from the
step ends); and a run folder that analysis/e2e_report.py reads as it reads ours.
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

REPO_ROOT = Path(__file__).resolve().parents[2]
DRIVER = REPO_ROOT / "baselines" / "hf" / "run_hf.py"
# The results section of an fd-bench run's summary.json (a GPU-only run; tests/fixtures/README.md says which).
OUR_SUMMARY = REPO_ROOT / "tests" / "fixtures" / "hf-driver" / "gpu_only_summary_results.json"
sys.path.insert(0, str(REPO_ROOT / "analysis"))


def load_driver():
    spec = importlib.util.spec_from_file_location("run_hf", DRIVER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


hf = load_driver()

RESOLVED = {"name": "fake", "model": {"config": "experiments/models/tiny-llama.json", "layers": 2,
                                      "weights": {"seed": 1, "dtype": "fp16"}},
            "workload": {"requests": 3, "stop_at_eos": False}, "sampling": {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0},
            "engine": {"type": "gpu-only"}, "hardware": {"gpu": {"memory_gb": 0.0, "sm_count": 0}}}
WORKLOAD = [{"id": 0, "arrival_s": 0.2, "prompt": [5, 6, 7], "gen_len": 3, "stop_at_eos": False},
            {"id": 1, "arrival_s": 0.0, "prompt": [8], "gen_len": 2, "stop_at_eos": False},
            {"id": 2, "arrival_s": 0.1, "prompt": [9, 10], "gen_len": 4, "stop_at_eos": False}]

FAKE_FD_BENCH = r'''#!/usr/bin/python3
import json, sys
args = sys.argv[1:]
sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
if any("bad" in s for s in sets):
    print("fd-bench: error: --set %s: bad key" % sets[0], file=sys.stderr)
    sys.exit(2)
if args[0] == "run" and "--check" in args:
    print(json.dumps(RESOLVED))
elif args[0] == "workload":
    open(args[args.index("-o") + 1], "w").write("".join(json.dumps(r) + "\n" for r in WORKLOAD))
else:
    sys.exit(1)
'''


@pytest.fixture
def fake_bin(tmp_path):
    d = tmp_path / "bin"
    d.mkdir()
    p = d / "fd-bench"
    p.write_text(FAKE_FD_BENCH.replace("RESOLVED", repr(RESOLVED)).replace("WORKLOAD", repr(WORKLOAD)))
    p.chmod(0o755)
    return d


def test_imports_without_torch():
    code = "import importlib.util, sys; s = importlib.util.spec_from_file_location('m', %r); m = importlib.util.module_from_spec(s); " \
           "s.loader.exec_module(m); print(sorted(k for k in ('torch', 'transformers') if k in sys.modules))" % str(DRIVER)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_workload_and_config_from_fd_bench(fake_bin, tmp_path):
    assert hf.resolved_config(fake_bin, "cfg.json", ["workload.requests=3"]) == RESOLVED
    reqs = hf.fd_bench_workload(fake_bin, "cfg.json", [], str(tmp_path / "w.jsonl"))
    assert reqs == WORKLOAD
    with pytest.raises(hf.DriverError, match="bad key"):
        hf.fd_bench_workload(fake_bin, "cfg.json", ["workload.bad=1"], str(tmp_path / "w2.jsonl"))
    with pytest.raises(hf.DriverError, match="not found"):
        hf.resolved_config(tmp_path, "cfg.json", [])


def test_read_workload_is_strict(tmp_path):
    p = tmp_path / "w.jsonl"
    p.write_text('{"id": 0, "arrival_s": 0, "prompt": [1], "gen_len": 1, "stop_at_eos": false, "extra": 1}\n')
    with pytest.raises(hf.DriverError, match="extra"):
        hf.read_workload(p)
    p.write_text('{"id": 0, "arrival_s": 0, "prompt": [1], "stop_at_eos": false}\n')
    with pytest.raises(hf.DriverError, match="gen_len"):
        hf.read_workload(p)


def test_unsupported_requests_refused():
    run = RESOLVED["sampling"]
    with pytest.raises(hf.DriverError, match="request 4: teacher-forced"):
        hf.check_supported([dict(WORKLOAD[0], id=4, forced=[1, 2, 3])], run)
    with pytest.raises(hf.DriverError, match="request 0: its own sampling"):
        hf.check_supported([dict(WORKLOAD[0], sampling=dict(run, temperature=0.5))], run)
    hf.check_supported(WORKLOAD + [dict(WORKLOAD[0], sampling=dict(run))], run)  # the run's own: fine


def test_batches_in_arrival_order():
    b = hf.batches_in_arrival_order(WORKLOAD, 2)
    assert [[r["id"] for r in x] for x in b] == [[1, 2], [0]]
    same = [dict(r, arrival_s=0.0) for r in WORKLOAD]
    assert [[r["id"] for r in x] for x in hf.batches_in_arrival_order(same[::-1], 2)] == [[0, 1], [2]]  # ties: id order
    with pytest.raises(hf.DriverError):
        hf.batches_in_arrival_order(WORKLOAD, 0)


def test_left_padding_and_mask():
    ids, mask = hf.left_pad([[5, 6, 7], [8], [9, 10]], pad_id=0)
    assert ids == [[5, 6, 7], [0, 0, 8], [0, 9, 10]]
    assert mask == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]


def test_distribution_matches_numpy_and_our_names():
    v = list(np.random.default_rng(3).exponential(5.0, 100))  # 100: no percentile falls on an order statistic
    d = hf.distribution(v)
    for q in (1, 50, 90, 99):
        assert d["p%d" % q] == pytest.approx(np.percentile(v, q), rel=1e-12)
    assert d["mean"] == pytest.approx(np.mean(v)) and d["max"] == max(v) and d["count"] == 100
    assert hf.distribution([])["p50"] == 0.0
    ours = json.loads(OUR_SUMMARY.read_text())["results"]
    steps, records = hf.run_batches(WORKLOAD, 2, FakeGenerate(), eos_id=2, clock=FakeClock(), sleep=lambda s: None)
    mine = hf.results_of(steps, records, 0.5)
    missing = [k for k in ours if k not in mine]
    assert not missing, f"our summary's results keys missing from the HF summary: {missing}"
    for k, v in ours.items():
        if isinstance(v, dict) and "p50" in v:
            assert set(v) <= set(mine[k]), k


class FakeClock:
    """Advances 1 ms per call, so every time is known."""

    def __init__(self):
        self.t = 100.0

    def __call__(self):
        self.t += 0.001
        return self.t


class FakeGenerate:
    """Rows of max(gen_len) tokens: request id * 100 + column; eos (2) in column 1 of request 2's row."""

    def __init__(self, clock=None):
        self.clock = clock

    def __call__(self, batch):
        n = max(r["gen_len"] for r in batch)
        rows = [[2 if (r["id"] == 2 and k == 1) else r["id"] * 100 + k + 3 for k in range(n)] for r in batch]
        ends = [float(10 * (k + 1)) for k in range(n)] if self.clock is None else [self.clock() for _ in range(n)]
        return rows, ends


def test_run_batches_records():
    clock = FakeClock()
    steps, records = hf.run_batches(WORKLOAD, 2, FakeGenerate(clock), eos_id=2, clock=clock, sleep=lambda s: None)
    by = {r["id"]: r for r in records}
    assert [r["id"] for r in records] == [0, 1, 2]
    assert by[1]["tokens"] == [103, 104] and by[2]["tokens"] == [203, 2, 205, 206]  # eos is a token: no stop_at_eos
    assert by[0]["tokens"] == [3, 4, 5]
    # batch [1, 2] (arrival order) runs 4 steps; request 1 is done after 2 of them; then batch [0] runs 3
    assert [s["batch"] for s in steps] == [2, 2, 2, 2, 1, 1, 1]
    assert [s["tokens"] for s in steps] == [2, 2, 1, 1, 1, 1, 1]
    assert [s["prefill_tokens"] for s in steps] == [3, 0, 0, 0, 3, 0, 0]
    assert [s["decode_tokens"] for s in steps] == [0, 2, 1, 1, 0, 1, 1]
    assert [s["total_context"] for s in steps] == [3, 1 + 1 + 2 + 1, 2 + 2, 2 + 3, 3, 4, 5]
    assert all(s["step_ms"] == pytest.approx(1.0) for s in steps[1:4])
    assert sum(s["tokens"] for s in steps) == sum(r["gen_len"] for r in WORKLOAD) == sum(r["output_len"] for r in records)
    # request 1 arrived at 0; clock ticks: t0, the arrival check, the batch start, then one per step: its first
    # token ends the first step 3 ms after t0, its second 1 ms later
    assert by[1]["ttft_ms"] == pytest.approx(3.0) and by[1]["e2e_ms"] == pytest.approx(4.0)
    # with stop_at_eos the row is cut after eos
    stop = [dict(r, stop_at_eos=True) for r in WORKLOAD]
    _, rec = hf.run_batches(stop, 3, FakeGenerate(), eos_id=2, clock=FakeClock(), sleep=lambda s: None)
    assert rec[2]["tokens"] == [203, 2] and rec[2]["output_len"] == 2


def test_generate_stopping_early_is_an_error():
    def short(batch):
        return [[7] for _ in batch], [1.0]
    with pytest.raises(RuntimeError, match="generate stopped early"):
        hf.run_batches(WORKLOAD, 3, short, eos_id=2, clock=FakeClock(), sleep=lambda s: None)


def test_run_folder_reads_like_ours(tmp_path):
    import e2e_report
    from fd_runs import decode_steps, decode_tokens_per_s
    clock = FakeClock()
    steps, records = hf.run_batches(WORKLOAD, 2, FakeGenerate(clock), eos_id=2, clock=clock, sleep=lambda s: None)
    info = {"type": "hf-transformers", "cache": "static", "batch_size": 2, "dtype": "fp16", "device": "cuda",
            "transformers": "x", "torch": "y"}
    prov = hf.provenance("run_hf.py cfg.json", [{"name": "NVIDIA H200", "memory_gb": 150.1, "sm_count": 132}])
    s = hf.make_summary(RESOLVED, "cfg.json", ["workload.requests=3"], info, prov, hf.results_of(steps, records, 0.5), ["n"])
    out = tmp_path / "run"
    hf.write_run_folder(out, s, steps, records)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engine"] == "hf-transformers" and summary["engine_info"]["cache"] == "static"
    assert summary["config"]["engine"]["type"] == "hf-transformers" and summary["config_engine_replaced"] == {"type": "gpu-only"}
    for k in ("git_commit", "host", "gpus", "date_utc", "command", "cpu_model"):
        assert k in summary["provenance"], k
    reqs = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert [r["id"] for r in reqs] == [0, 1, 2] and all("_times" not in r for r in reqs)
    assert {"prompt", "tokens", "output_len", "ttft_ms"} <= set(reqs[0])
    got = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert got == steps
    row = e2e_report.load_run(str(out))
    assert row["engine"] == "hf-transformers"
    assert row["decode_tokens_per_s"] == pytest.approx(decode_tokens_per_s(decode_steps(got)))
    assert row["decode_tokens_per_s"] == pytest.approx(summary["results"]["decode_tokens_per_s"]) and row["decode_tokens_per_s"] > 0
    assert summary["model"]["name"] == "tiny-llama" and hf.model_name("/ckpt/llama-x/config.json") == "llama-x"
    with pytest.raises(hf.DriverError, match="already holds"):
        hf.write_run_folder(out, s, steps, records)


def test_notes_say_what_is_not_like_ours():
    assert hf.hardware_notes(RESOLVED) == []
    a10 = dict(RESOLVED, hardware={"gpu": {"memory_gb": 24.0, "sm_count": 16}})
    (note,) = hf.hardware_notes(a10)
    assert "NOT applied" in note and "24.0" in note and "16" in note
    assert hf.sampling_notes(RESOLVED["sampling"]) == (True, [])
    greedy, (note,) = hf.sampling_notes(dict(RESOLVED["sampling"], temperature=0.8, top_k=40))
    assert not greedy and "not comparable" in note and "temperature=0.8" in note


def test_main_bad_input_exits_2(fake_bin, tmp_path, capsys):
    assert hf.main(["cfg.json", "--bin-dir", str(fake_bin), "--set", "workload.bad=1", "--out", str(tmp_path / "o")]) == 2
    assert "bad key" in capsys.readouterr().err
    assert hf.main(["cfg.json", "--bin-dir", str(fake_bin), "--batch-size", "0", "--out", str(tmp_path / "o")]) == 2


def real_bin(*programs):
    """The built programs (FD_BIN_DIR, else build/default/bin); the skip / FD_REQUIRE_BINARIES rule of conftest."""
    d = Path(os.environ.get("FD_BIN_DIR") or REPO_ROOT / "build" / "default" / "bin")
    if not all(os.access(d / p, os.X_OK) for p in programs):
        reason = f"{', '.join(programs)} not all in {d} (build them or set FD_BIN_DIR)"
        if os.environ.get("FD_REQUIRE_BINARIES", "") not in ("", "0"):
            pytest.fail(reason + " [FD_REQUIRE_BINARIES is set]", pytrace=False)
        pytest.skip(reason)
    return d


def test_weights_cache_holds_the_configs_seeded_weights(tmp_path):
    """The folder HF would load gives fd-bench the same tokens as the seed the config names: same weights."""
    bin_dir = real_bin("fd-bench", "fd-weights")
    cfg = {"name": "w", "model": {"config": str(REPO_ROOT / "experiments/models/tiny-llama-gqa.json"), "layers": 2,
                                  "weights": {"seed": 7, "dtype": "bf16"}},
           "workload": {"requests": 3, "prompt_len": 5, "gen_len": 6, "seed": 2}, "engine": {"type": "reference", "threads": 1}}
    p = tmp_path / "seeded.json"
    p.write_text(json.dumps(cfg))
    resolved = hf.resolved_config(bin_dir, str(p), [])
    ckpt = Path(hf.weights_dir(resolved, bin_dir, tmp_path / "cache"))
    assert json.loads((ckpt / "config.json").read_text())["num_hidden_layers"] == 2
    stamp = (ckpt / "model.safetensors").stat().st_mtime_ns
    assert hf.weights_dir(resolved, bin_dir, tmp_path / "cache") == str(ckpt)  # written once, then reused
    assert (ckpt / "model.safetensors").stat().st_mtime_ns == stamp
    p2 = tmp_path / "dir.json"
    p2.write_text(json.dumps(dict(cfg, model={"config": cfg["model"]["config"], "layers": 2, "weights": {"dir": str(ckpt)}})))
    assert hf.weights_dir(hf.resolved_config(bin_dir, str(p2), []), bin_dir, tmp_path / "unused") == str(ckpt)
    tokens = []
    for c in (p, p2):
        subprocess.run([bin_dir / "fd-bench", "run", c, "--out", tmp_path / c.stem, "--quiet"], check=True, capture_output=True)
        tokens.append([json.loads(line)["tokens"] for line in (tmp_path / c.stem / "requests.jsonl").read_text().splitlines()])
    assert tokens[0] == tokens[1]
    different = dict(cfg, model=dict(cfg["model"], weights={"seed": 8, "dtype": "bf16"}))
    assert hf.weights_dir(different, bin_dir, tmp_path / "cache") != str(ckpt)


def test_main_without_torch_says_so(fake_bin, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError, installed or not
    assert hf.main(["cfg.json", "--bin-dir", str(fake_bin), "--out", str(tmp_path / "o")]) == 1
    assert "torch and transformers are needed" in capsys.readouterr().err
    assert [r["id"] for r in hf.read_workload(tmp_path / "o" / "workload.jsonl")] == [0, 1, 2]  # fetched before
    assert not (tmp_path / "o" / "summary.json").exists()


# ------------------------------------------------------------------------------------------------
# end to end: only where torch and transformers import (the GPU machine)
# ------------------------------------------------------------------------------------------------

def test_end_to_end_same_tokens_as_reference(tmp_path):
    pytest.importorskip("torch", reason="torch is not installed here: the HF driver runs end to end on the GPU machine")
    pytest.importorskip("transformers", reason="transformers is not installed here: the HF driver runs end to end on the GPU machine")
    bin_dir = Path(os.environ.get("FD_BIN_DIR") or REPO_ROOT / "build" / "default" / "bin")
    if not all(os.access(bin_dir / p, os.X_OK) for p in ("fd-bench", "fd-weights")):
        pytest.skip(f"fd-bench / fd-weights not in {bin_dir}")
    cfg = {"name": "hf-e2e", "model": {"config": str(REPO_ROOT / "experiments/models/tiny-llama.json"), "weights": {"seed": 3, "dtype": "fp32"}},
           "workload": {"requests": 5, "prompt_len": {"dist": "uniform", "min": 3, "max": 9}, "gen_len": {"dist": "uniform", "min": 2, "max": 6}, "seed": 1},
           "engine": {"type": "reference", "threads": 1}}
    p = tmp_path / "cfg.json"
    p.write_text(json.dumps(cfg))
    subprocess.run([bin_dir / "fd-bench", "run", p, "--out", tmp_path / "ref", "--quiet"], check=True, capture_output=True)
    device = "cuda" if __import__("torch").cuda.is_available() else "cpu"
    rc = hf.main([str(p), "--bin-dir", str(bin_dir), "--batch-size", "2", "--device", device, "--dtype", "fp32",
                  "--weights-cache", str(tmp_path / "wc"), "--out", str(tmp_path / "hf")])
    assert rc == 0
    ref = {r["id"]: r for r in map(json.loads, (tmp_path / "ref" / "requests.jsonl").read_text().splitlines())}
    got = {r["id"]: r for r in map(json.loads, (tmp_path / "hf" / "requests.jsonl").read_text().splitlines())}
    assert sorted(got) == sorted(ref)
    for i in ref:
        assert got[i]["prompt"] == ref[i]["prompt"]
        assert got[i]["tokens"] == ref[i]["tokens"], f"request {i}: fp32 greedy tokens differ from the reference engine's"
