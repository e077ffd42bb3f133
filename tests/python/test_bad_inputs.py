"""The bad-input table of docs/RELIABILITY.md (issue 16): every case is a real `fd-bench run` of a small FastDecode
config (cpu backend, spawned R-workers) with one thing wrong, by class — configs, weights, prompts, endpoints,
binaries and resources. Each must exit 2 before any work, with a message naming what is wrong (the key, the file and
tensor, the file and line, the endpoint), and leave no run folder behind. The counts per class in
docs/RELIABILITY.md are checked against this table, so the doc says what the test tries."""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "experiments" / "models" / "tiny-llama.json"


def base_config() -> dict:
    return {"name": "bad", "model": {"config": str(TINY), "weights": {"seed": 1, "dtype": "bf16"}},
            "workload": {"requests": 2, "prompt_len": 8, "gen_len": 4, "seed": 0},
            "engine": {"type": "fastdecode", "backend": "cpu",
                       "rworkers": {"spawn": 1, "threads": 1, "memory_gb": 0.05, "timeout_ms": 3000}}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- weights: a real checkpoint (fd-weights), then one thing broken in its safetensors file ----

def checkpoint(fd_bin, d: Path) -> Path:
    subprocess.run([fd_bin("fd-weights"), "random", "--model", str(TINY), "--seed", "1", "--dtype", "bf16", "--out", str(d),
                    "--quiet"], check=True, capture_output=True, timeout=120)
    return d / "model.safetensors"


def rewrite(f: Path, edit) -> None:
    """edit(header: dict, data: bytearray) -> data; the header is written back as JSON."""
    raw = f.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = edit(header, bytearray(raw[8 + n:]))
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    f.write_bytes(struct.pack("<Q", len(h)) + h + bytes(data))


def nan_in(name):
    def edit(h, data):
        b, e = h[name]["data_offsets"]
        data[b:e] = b"\xc0\x7f" * ((e - b) // 2)  # bf16 NaN
        return data
    return edit


def inf_in(name):
    def edit(h, data):
        b, e = h[name]["data_offsets"]
        data[b:e] = b"\x80\x7f" * ((e - b) // 2)  # bf16 +Inf
        return data
    return edit


def drop(name):
    def edit(h, data):
        del h[name]
        return data
    return edit


def extra(name):
    def edit(h, data):
        h[name] = {"dtype": "BF16", "shape": [1], "data_offsets": [len(data), len(data) + 2]}
        return data + b"\x00\x00"
    return edit


def reshape(name):
    def edit(h, data):
        a, b = h[name]["shape"]
        h[name]["shape"] = [a // 2, b * 2]  # the same bytes, the wrong shape
        return data
    return edit


WEIGHT_CASES = [  # (id, edit of model.safetensors, what the message names)
    ("nan", nan_in("model.norm.weight"), "model.norm.weight"),
    ("inf", inf_in("model.layers.0.mlp.down_proj.weight"), "model.layers.0.mlp.down_proj.weight"),
    ("missing-tensor", drop("model.layers.1.mlp.up_proj.weight"), "model.layers.1.mlp.up_proj.weight"),
    ("unknown-tensor", extra("model.layers.0.mlp.extra.weight"), "model.layers.0.mlp.extra.weight"),
    ("wrong-shape", reshape("model.layers.0.self_attn.q_proj.weight"), "model.layers.0.self_attn.q_proj.weight"),
    ("truncated", lambda h, data: data[: len(data) - 100], "model.safetensors"),
    ("no-checkpoint", None, "model.safetensors"),
]

# ---- configs: one key wrong ----

CONFIG_CASES = [  # (id, change to the config, what the message names)
    ("unknown-key", lambda c: c["workload"].update(colour=1), "workload.colour"),
    ("wrong-type", lambda c: c["workload"].update(requests="two"), "workload.requests"),
    ("out-of-range", lambda c: c["workload"].update(requests=0), "workload.requests"),
    ("bad-enum", lambda c: c["engine"].update(backend="tpu"), "engine.backend"),
    ("unknown-engine", lambda c: c["engine"].update(type="warp"), "engine.type"),
    ("no-model-file", lambda c: c["model"].update(config="/nonexistent/config.json"), "/nonexistent/config.json"),
    ("bad-on-failure", lambda c: c["engine"]["rworkers"].update(on_failure="maybe"), "engine.rworkers.on_failure"),
    ("bad-heartbeat", lambda c: c["engine"]["rworkers"].update(heartbeat_ms=1000, heartbeat_timeout_ms=10),
     "engine.rworkers.heartbeat_timeout_ms"),
    ("bad-network", lambda c: c.update(hardware={"network": "5gbe"}), "hardware.network"),
    ("bad-query", lambda c: c["engine"]["rworkers"].update(query="int4"), "engine.rworkers.query"),
    ("bad-sworker-cpus", lambda c: c["engine"].update(sworker_cpus="12-x"), "engine.sworker_cpus"),
]

# ---- prompts (workload.prompts): one line wrong ----

PROMPT_CASES = [  # (id, the bad second line, what the message names)
    ("not-json", '{"prompt": [5], "gen_len": ', "not JSON"),
    ("empty-prompt", '{"prompt": [], "gen_len": 2}', "'prompt' is empty"),
    ("out-of-vocabulary", '{"prompt": [5, 99999], "gen_len": 2}', "outside the vocabulary"),
    ("too-long", '{"prompt": [5], "gen_len": 100000}', "positions"),
    ("negative-length", '{"prompt": [5], "gen_len": -1}', "'gen_len' = -1"),
    ("unknown-key", '{"prompt": [5], "gen_len": 2, "colour": 1}', "unknown key 'colour'"),
]

# ---- endpoints (engine.rworkers.endpoints): nothing there, or not an endpoint ----

ENDPOINT_CASES = [  # (id, endpoint, what the message names)
    ("scheme", "foo://bar", "'foo://bar' is not an R-worker endpoint"),
    ("port-range", "tcp://127.0.0.1:99999", "the port must be a number from 1 to 65535"),
    ("no-port", "tcp://127.0.0.1", "expected tcp://HOST:PORT"),
    ("nothing-listening", "tcp://127.0.0.1:{free}", "no R-worker answers HELLO"),
    ("ipc-nothing", "ipc:///tmp/fd-nothing-{free}.sock", "no R-worker answers HELLO"),
]

# ---- binaries and resources ----

RESOURCE_CASES = [  # (id, change to the config, what the message names)
    ("no-rworker-binary", lambda c: c["engine"]["rworkers"].update(binary="/nonexistent/fd-rworker"), "/nonexistent/fd-rworker"),
    ("memory-too-small", lambda c: (c["model"].update(config=str(REPO / "experiments" / "models" / "small-llama.json")),
                                    c["engine"]["rworkers"].update(memory_gb=0.001),  # 128 tokens of 8 KB
                                    c["workload"].update(prompt_len=400, gen_len=100)), "too small for one request"),
    ("no-registration", lambda c: c["engine"].update(rworkers={"register": "tcp://127.0.0.1:{free}", "expect": 1,
                                                                "register_timeout_ms": 200}), "registered at"),
    ("pin-past-cpus", lambda c: c["engine"]["rworkers"].update(spawn=2, pin=True, threads=len(os.sched_getaffinity(0))),
     "engine.rworkers.pin"),
]
# Cases refused before any R-worker is spawned (a spawned worker says "listening on"): the checkpoint is read, and the
# pinned cores are checked, first.
BEFORE_SPAWN = {"nan", "inf", "missing-tensor", "unknown-tensor", "wrong-shape", "truncated", "no-checkpoint",
                "pin-past-cpus"}

CLASSES = {"configs": CONFIG_CASES, "weights": WEIGHT_CASES, "prompts": PROMPT_CASES, "endpoints": ENDPOINT_CASES,
           "binaries and resources": RESOURCE_CASES}


def refused(fd_bin, tmp_path: Path, cfg: dict, what: str, before_spawn: bool = False) -> None:
    text = json.dumps(cfg).replace("{free}", str(free_port()))
    (tmp_path / "c.json").write_text(text)
    out = tmp_path / "run"
    p = subprocess.run([fd_bin("fd-bench"), "run", str(tmp_path / "c.json"), "--out", str(out), "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert what in p.stderr, p.stderr
    assert not out.exists(), "a run folder was left by an error found before any work"
    if before_spawn:
        assert "listening on" not in p.stderr, "an R-worker was spawned before the error was found:\n" + p.stderr


@pytest.mark.parametrize("case", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_bad_config(fd_bin, tmp_path, case):
    cfg = base_config()
    case[1](cfg)
    refused(fd_bin, tmp_path, cfg, case[2])


@pytest.mark.parametrize("case", WEIGHT_CASES, ids=[c[0] for c in WEIGHT_CASES])
def test_bad_weights(fd_bin, tmp_path, case):
    st = checkpoint(fd_bin, tmp_path / "ckpt")
    if case[1] is None:
        st.unlink()
    else:
        rewrite(st, case[1])
    cfg = base_config()
    cfg["model"]["weights"] = {"dir": str(tmp_path / "ckpt")}
    refused(fd_bin, tmp_path, cfg, case[2], before_spawn=case[0] in BEFORE_SPAWN)


@pytest.mark.parametrize("case", PROMPT_CASES, ids=[c[0] for c in PROMPT_CASES])
def test_bad_prompts(fd_bin, tmp_path, case):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": [5, 6], "gen_len": 2}\n' + case[1] + "\n")
    cfg = base_config()
    cfg["workload"] = {"prompts": str(f)}
    refused(fd_bin, tmp_path, cfg, case[2])


@pytest.mark.parametrize("case", ENDPOINT_CASES, ids=[c[0] for c in ENDPOINT_CASES])
def test_bad_endpoints(fd_bin, tmp_path, case):
    cfg = base_config()
    cfg["engine"]["rworkers"] = {"endpoints": [case[1]], "timeout_ms": 1000}
    refused(fd_bin, tmp_path, cfg, case[2])


@pytest.mark.parametrize("case", RESOURCE_CASES, ids=[c[0] for c in RESOURCE_CASES])
def test_bad_binaries_and_resources(fd_bin, tmp_path, case):
    cfg = base_config()
    case[1](cfg)
    refused(fd_bin, tmp_path, cfg, case[2], before_spawn=case[0] in BEFORE_SPAWN)


def test_the_reliability_doc_counts_these_cases():
    """docs/RELIABILITY.md's bad-input table states how many cases of each class are tried: this table's."""
    doc = (REPO / "docs" / "RELIABILITY.md").read_text()
    for name, cases in CLASSES.items():
        m = re.search(r"^\| " + re.escape(name) + r" \| (\d+) \|", doc, re.M)
        assert m, f"docs/RELIABILITY.md has no row for {name}"
        assert int(m.group(1)) == len(cases), f"{name}: the doc says {m.group(1)}, the test tries {len(cases)}"
