"""fd-transport-bench's JSON, checked from outside: structure, provenance, and byte accounting.

No timed assertions (CI machines have 2 cores and other load): the numbers are only checked to be
consistent with each other (GB/s x median time = bytes per step), never against the target.
"""

from __future__ import annotations

import json
import math
import subprocess

import pytest

SIZES = {"64K": 64 * 1024, "1M": 1024 * 1024}
HEADER = 64


@pytest.fixture(scope="module")
def quick_json(fd_bin, tmp_path_factory, run_program):
    out = tmp_path_factory.mktemp("transport") / "t.json"
    proc = run_program([fd_bin("fd-transport-bench"), "--quick", "--sizes", "64K,1M", "--transports", "ipc,tcp",
                        "--json", out], timeout=120)
    assert "target" in proc.stdout and "4.0 GB/s" in proc.stdout
    return json.loads(out.read_text())


def test_provenance_and_method(quick_json):
    d = quick_json
    assert d["tool"] == "fd-transport-bench"
    p = d["provenance"]
    for key in ("git_commit", "cpu_model", "cpu_cores", "date_utc", "command", "zmq_version"):
        assert key in p, key
    assert p["cpu_cores"] >= 1
    assert len(p["zmq_version"].split(".")) == 3
    assert d["target"]["gbps_per_link"] == 4.0
    assert d["params"]["quick"] is True


def test_grid_is_complete(quick_json):
    rs = quick_json["results"]
    params = quick_json["params"]
    got = {(r["transport"], r["framing"], r["io_threads"], r["links"], r["size_label"]) for r in rs}
    want = {(t, f, io, n, s) for t in ("ipc", "tcp") for f in params["framings"] for io in params["io_threads"]
            for n in params["links"] for s in SIZES}
    assert got == want
    assert len(rs) == len(want)
    # tcp/ipc servers run in forked processes by default
    assert all(r["server"] == "process" for r in rs)


def test_byte_accounting(quick_json):
    for r in quick_json["results"]:
        where = f'{r["transport"]} {r["framing"]} io={r["io_threads"]} links={r["links"]} {r["size_label"]}'
        t = r["tensor_bytes"]
        assert r["size_bytes"] == SIZES[r["size_label"]], where
        # request = header + q, k, v; reply = header + o (o the size of q); close to S and S/3
        assert r["request_bytes"] == HEADER + 3 * t, where
        assert r["reply_bytes"] == HEADER + t, where
        assert r["size_bytes"] - 256 <= r["request_bytes"] <= r["size_bytes"], where
        assert r["bytes_per_step"] == r["links"] * (r["request_bytes"] + r["reply_bytes"]), where
        if r["framing"] == "split":
            fm = r["frame_max_bytes"]
            assert fm == 1024 * 1024, where
            assert r["request_frames"] == 1 + 3 * math.ceil(t / fm), where
            assert r["reply_frames"] == 1 + math.ceil(t / fm), where
        elif r["framing"] == "tensor":
            assert (r["request_frames"], r["reply_frames"]) == (4, 2), where


def test_rates_match_times(quick_json):
    for r in quick_json["results"]:
        where = f'{r["transport"]} {r["framing"]} links={r["links"]} {r["size_label"]}'
        rtt = r["rtt_us"]
        assert 0 < rtt["min"] <= rtt["median"] <= rtt["p90"] <= rtt["max"], where
        assert rtt["min"] <= rtt["mean"] <= rtt["max"], where
        assert r["reps"] >= quick_json["params"]["min_reps"] and r["warmup_reps"] >= 1, where
        # GB/s x median seconds = bytes moved per step (within float rounding)
        bytes_from_rate = r["gbps_round_trip"] * 1e9 * rtt["median"] * 1e-6
        assert bytes_from_rate == pytest.approx(r["bytes_per_step"], rel=1e-9), where
        assert r["gbps_per_link"] * r["links"] == pytest.approx(r["gbps_round_trip"], rel=1e-12), where
        assert r["meets_target"] == (r["gbps_per_link"] >= quick_json["target"]["gbps_per_link"]), where
        assert r["memcpy_gbps"] > 0, where
        assert r["zero_copy"]["steps_with_release_pending_at_reply"] >= 0, where


def test_dead_server_is_a_clear_error_not_a_hang(fd_bin, tmp_path):
    # Each server process exits (status 3) after 2 requests: the client must fail within its timeout.
    proc = subprocess.run([fd_bin("fd-transport-bench"), "--sizes", "64K", "--transports", "ipc", "--framing", "tensor",
                           "--io-threads", "1", "--links", "2", "--fail-server-after", "2", "--timeout-ms", "500",
                           "--json", tmp_path / "never.json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "no reply within 500 ms" in proc.stderr
    assert "exited with status 3" in proc.stderr
    assert not (tmp_path / "never.json").exists()


def test_bad_option_is_a_usage_error(fd_bin):
    proc = subprocess.run([fd_bin("fd-transport-bench"), "--sizes", "12Q"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "bad size '12Q'" in proc.stderr
