"""fd-transport-bench's Google Benchmark JSON, checked from outside: each round trip runs right after its
memcpy ceiling, the provenance is in the context, the bytes are those of the real ATTEND / ATTEND_REPLY
(fastdecode/wire/wire.h) for the shape, and the counters agree with each other; a dead R-worker is a
clear error, not a hang; analysis/rworker_report.py reads the format.

No timed assertions (CI machines have 2 cores and other load): the numbers are only checked to be
consistent with each other (GB/s x median time = bytes per step), never against the target.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

SIZES = {"64K": 64 * 1024, "1M": 1024 * 1024}
HEADER = 64
QUICK = {"transports": ("ipc", "tcp", "shm", "shm-inplace"), "io_threads": (1,), "links": (1, 2)}


def parse(name):
    parts = name.split("/")
    f = dict(p.split(":", 1) for p in parts[2:] if ":" in p)
    return parts[0], (parts[1], int(f["io"]), int(f["links"]), f["size"])


def shape_bytes(ctx):
    s = json.loads(ctx["fd_wire_shape"])
    es = {"fp16": 2, "fp32": 4}[s["dtype"]]
    per_seq = 8 + (s["heads"] + 2 * s["kv_heads"]) * s["head_dim"] * es  # id + q + k + v
    return per_seq, s["heads"] * s["head_dim"] * es  # ..., o per sequence


@pytest.fixture(scope="module")
def quick(fd_bin, tmp_path_factory, run_program):
    out = tmp_path_factory.mktemp("transport") / "transport.json"
    proc = run_program([fd_bin("fd-transport-bench"), "--quick", "--sizes", "64K,1M", "--transports", "ipc,tcp,shm,shm-inplace",
                        "--json", out], timeout=120)
    assert "target" in proc.stdout and "4.0 GB/s" in proc.stdout
    return out, json.loads(out.read_text())


@pytest.fixture(scope="module")
def gqa_fp32(fd_bin, tmp_path_factory, run_program):
    """Another shape: o (heads) differs from k and v (kv heads), fp32 on the wire; and the client and the echo servers
    spinning 30 us before they block (--spin-us) beside blocking at once: the same bytes either way."""
    out = tmp_path_factory.mktemp("transport") / "gqa.json"
    run_program([fd_bin("fd-transport-bench"), "--sizes", "100K", "--transports", "tcp", "--links", "2",
                 "--io-threads", "2", "--heads", "8", "--kv-heads", "2", "--head-dim", "64", "--wire-dtype", "fp32",
                 "--time", "0.02", "--spin-us", "0,30", "--json", out], timeout=120)
    return json.loads(out.read_text())


def test_spin_is_a_case_of_its_own(gqa_fp32):
    # --spin-us 0,30: one case each, named by its spin (none for 0), the counter saying which, the same bytes.
    rts = {r["name"].split("/min_time")[0]: r for r in round_trips(gqa_fp32)}
    assert set(rts) == {"round_trip/tcp/io:2/links:2/size:100K", "round_trip/tcp/io:2/links:2/size:100K/spin:30"}
    a, b = rts["round_trip/tcp/io:2/links:2/size:100K"], rts["round_trip/tcp/io:2/links:2/size:100K/spin:30"]
    assert (a["spin_us"], b["spin_us"]) == (0, 30) and a["bytes_per_step"] == b["bytes_per_step"]


def test_rings_carry_the_lane_while_both_sides_poll(fd_bin, tmp_path, run_program):
    # The shared-memory lane with a spin: the region's rings take requests and replies (docs/RWORKER.md, "Rings"); without
    # one, or over TCP, nothing goes through them (their counters say so, or are absent off the lane).
    out = tmp_path / "rings.json"
    run_program([fd_bin("fd-transport-bench"), "--sizes", "25K", "--transports", "shm-inplace,tcp", "--links", "1",
                 "--io-threads", "1", "--time", "0.05", "--spin-us", "0,200", "--json", out], timeout=120)
    rts = {r["name"].split("/min_time")[0]: r for r in round_trips(json.loads(out.read_text()))}
    blocking, spin = rts["round_trip/shm-inplace/io:1/links:1/size:25K"], rts["round_trip/shm-inplace/io:1/links:1/size:25K/spin:200"]
    assert blocking["ring_request_share"] == 0 and blocking["ring_reply_share"] == 0
    assert 0 < spin["ring_request_share"] <= 1, spin
    assert 0 <= spin["ring_reply_share"] <= 1, spin
    for name, r in rts.items():
        if "/tcp/" in name:
            assert "ring_request_share" not in r, name


def round_trips(d):
    return [r for r in d["benchmarks"] if r["name"].startswith("round_trip/")]


def test_provenance_and_method(quick):
    ctx = quick[1]["context"]
    assert ctx["fd_tool"] == "fd-transport-bench"
    for key in ("git_commit", "cpu_model", "cpu_cores", "date_utc", "command", "zmq_version", "wire_shape", "method"):
        assert f"fd_{key}" in ctx, key
    assert int(ctx["fd_cpu_cores"]) >= 1
    assert len(ctx["fd_zmq_version"].split(".")) == 3
    assert float(ctx["fd_target_gbps_per_link"]) == 4.0
    assert json.loads(ctx["fd_params"])["quick"] is True
    assert json.loads(ctx["fd_wire_shape"]) == {"heads": 32, "kv_heads": 32, "head_dim": 128, "dtype": "fp16"}


def test_each_round_trip_runs_right_after_its_memcpy_ceiling(quick):
    rows = quick[1]["benchmarks"]
    assert all(r["run_type"] == "iteration" and not r.get("error_occurred") for r in rows)
    parsed = [parse(r["name"]) for r in rows]
    assert [f for f, _ in parsed] == ["memcpy_ceiling", "round_trip"] * (len(rows) // 2)
    for i in range(0, len(parsed), 2):
        assert parsed[i][1] == parsed[i + 1][1], rows[i + 1]["name"]
        assert rows[i]["bytes_per_step"] == rows[i + 1]["bytes_per_step"], rows[i + 1]["name"]
    got = {case for f, case in parsed if f == "round_trip"}
    assert got == {(t, io, n, s) for t in QUICK["transports"] for io in QUICK["io_threads"] for n in QUICK["links"]
                   for s in SIZES}


@pytest.mark.parametrize("which", ["quick", "gqa_fp32"])
def test_byte_accounting_is_the_real_attend(which, request):
    d = request.getfixturevalue(which)
    d = d[1] if which == "quick" else d
    per_seq, o_per_seq = shape_bytes(d["context"])
    rts = round_trips(d)
    assert rts
    for r in rts:
        _, (_, io, links, label) = parse(r["name"])
        where = r["name"]
        size = r["size_bytes"]
        assert size == {"100K": 100 * 1024, **SIZES}[label], where
        assert (r["links"], r["io_threads"]) == (links, io), where
        # ATTEND = header + ids + q + k + v for n_seq sequences, the most that fit in S
        assert r["n_seq"] == (size - HEADER) // per_seq >= 1, where
        assert r["request_bytes"] == HEADER + r["n_seq"] * per_seq, where
        assert size - per_seq < r["request_bytes"] <= size, where
        assert r["reply_bytes"] == HEADER + r["n_seq"] * o_per_seq, where  # ATTEND_REPLY = header + o
        assert (r["request_frames"], r["reply_frames"]) == (5, 2), where
        assert r["bytes_per_step"] == links * (r["request_bytes"] + r["reply_bytes"]), where


def test_rates_match_times(quick):
    rows = quick[1]["benchmarks"]
    for ceil, r in zip(rows[::2], rows[1::2]):
        where = r["name"]
        med = r["rtt_median_us"] * 1e-6
        assert 0 < r["rtt_min_us"] <= r["rtt_median_us"] <= r["rtt_p90_us"] <= r["rtt_max_us"], where
        assert r["rtt_min_us"] <= r["rtt_mean_us"] <= r["rtt_max_us"], where
        # Google Benchmark's real_time (us) is the mean of the same timed steps
        assert r["time_unit"] == "us" and r["real_time"] == pytest.approx(r["rtt_mean_us"], rel=1e-6), where
        assert r["iterations"] >= 1 and r["warmup_steps"] >= 2, where
        # GB/s x median seconds = bytes moved per step (within float rounding)
        assert r["bytes_per_second"] * med == pytest.approx(r["bytes_per_step"], rel=1e-9), where
        assert r["GBps_per_link"] * 1e9 * r["links"] == pytest.approx(r["bytes_per_second"], rel=1e-12), where
        assert r["meets_target"] == (1 if r["GBps_per_link"] >= 4.0 else 0), where
        assert ceil["bytes_per_second"] == pytest.approx(ceil["bytes_per_step"] / ceil["seconds_median"], rel=1e-12)
        assert r["ceiling_bytes_per_second"] == pytest.approx(ceil["bytes_per_second"], rel=1e-12), where
        assert r["ratio_to_ceiling"] == pytest.approx(ceil["seconds_median"] / med, rel=1e-9), where


def test_dead_server_is_a_clear_error_not_a_hang(fd_bin, tmp_path):
    # Each echo R-worker exits (status 3) instead of answering its 3rd ATTEND: the client fails at its deadline.
    out = tmp_path / "failed.json"
    proc = subprocess.run([fd_bin("fd-transport-bench"), "--sizes", "64K", "--transports", "ipc", "--io-threads", "1",
                           "--links", "2", "--fail-server-after", "2", "--timeout-ms", "500", "--json", out],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # the client names the workers: lost as their connections dropped, or late at the deadline
    assert "is lost: its connection dropped" in proc.stderr or "missed its deadline of 500 ms" in proc.stderr
    # the lost link named with how its process ended (the first lost ends the wait: the other may still be exiting)
    assert proc.stderr.count("exited with status 3") >= 1
    # The JSON says so too: the round trip is marked failed and carries no numbers.
    rows = {parse(r["name"])[0]: r for r in json.loads(out.read_text())["benchmarks"]}
    assert rows["round_trip"]["error_occurred"] is True
    assert "exited with status 3" in rows["round_trip"]["error_message"]
    assert "bytes_per_second" not in rows["round_trip"]


def test_bad_options_are_usage_errors(fd_bin):
    for args, text in ((["--sizes", "12Q"], "bad size '12Q'"), (["--sizes", "16K"], "cannot hold one sequence"),
                       (["--transports", "inproc"], "--transports")):
        proc = subprocess.run([fd_bin("fd-transport-bench"), *args], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2, (args, proc.stderr)
        assert text in proc.stderr, (args, proc.stderr)


def test_report_reads_the_google_benchmark_format(repo_root, tmp_path, quick):
    shutil.copy(quick[0], tmp_path / "transport.json")
    subprocess.run([sys.executable, str(repo_root / "analysis" / "rworker_report.py"), str(tmp_path), "--out",
                    str(tmp_path / "REPORT.md")], check=True, capture_output=True, text=True, timeout=120)
    text = (tmp_path / "REPORT.md").read_text()
    best = {}
    for r in round_trips(quick[1]):
        _, (t, _, links, size) = parse(r["name"])
        best[(t, links, size)] = max(best.get((t, links, size), 0), r["GBps_per_link"])
    for t, links in {(t, n) for t, n, _ in best}:
        row = f"| {t} | {links} | " + " | ".join(f"{best[(t, links, s)]:.2f}" for s in SIZES) + " |"
        assert row in text, row
    assert "target: {'gbps_per_link': 4.0}" in text


def test_report_takes_the_best_case_and_the_median_of_repetitions(repo_root, tmp_path, quick):
    """Rows made from the quick run's: an io:4 twin of each round trip, listed first, run three times (the
    report takes the median over repetitions: 1.5x the io:1 row's GB/s for every other case, 0.5x for the
    rest, then the best over I/O threads), and once failed (left out)."""
    d = json.loads(quick[0].read_text())
    twins, best = [], {}
    for i, r in enumerate(round_trips(d)):
        median = 1.5 if i % 2 == 0 else 0.5
        for rep, factor in enumerate((median, 9.0, 0.1)):
            t = dict(r, repetitions=3, repetition_index=rep, io_threads=4.0, GBps_per_link=r["GBps_per_link"] * factor)
            t["name"] = t["run_name"] = r["name"].replace("/io:1/", "/io:4/")
            twins.append(t)
        twins.append(dict(twins[-1], error_occurred=True, error_message="planted", GBps_per_link=1e6))
        _, (t, _, links, size) = parse(r["name"])
        best[(t, links, size)] = max(median, 1.0) * r["GBps_per_link"]
    d["benchmarks"] = twins + d["benchmarks"]
    (tmp_path / "transport.json").write_text(json.dumps(d))
    subprocess.run([sys.executable, str(repo_root / "analysis" / "rworker_report.py"), str(tmp_path), "--out",
                    str(tmp_path / "REPORT.md")], check=True, capture_output=True, text=True, timeout=120)
    text = (tmp_path / "REPORT.md").read_text()
    for t, links in {(t, n) for t, n, _ in best}:
        row = f"| {t} | {links} | " + " | ".join(f"{best[(t, links, s)]:.2f}" for s in SIZES) + " |"
        assert row in text, row


def test_floors_are_measured_before_the_cases(fd_bin, tmp_path, run_program):
    # --floors: the two floors under a tiny ATTEND on the lane (64 bytes back and forth by ZeroMQ over ipc, and by a
    # futex doorbell in a shared page), each with consistent counters, before the cases; the peers are gone after.
    out = tmp_path / "floors.json"
    run_program([fd_bin("fd-transport-bench"), "--floors", "--sizes", "64K", "--transports", "shm-inplace",
                 "--io-threads", "1", "--links", "1", "--time", "0.02", "--json", out], timeout=120)
    d = json.loads(out.read_text())
    names = [r["name"].split("/min_time")[0] for r in d["benchmarks"]]
    assert names[:2] == ["floor/zmq-ipc", "floor/futex-shm"], names
    assert "round_trip/shm-inplace/io:1/links:1/size:64K" in names[2:]
    for r in d["benchmarks"][:2]:
        assert not r.get("error_occurred"), r
        assert r["message_bytes"] == 64
        assert 0 < r["rtt_min_us"] <= r["rtt_median_us"] <= r["rtt_p90_us"], r
    assert json.loads(d["context"]["fd_params"])["floors"] is True
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "floor-peer" not in ps, ps


def test_dead_floor_peer_is_a_clear_error_not_a_hang(fd_bin, tmp_path):
    # Each floor peer exits (status 3) instead of answering its 3rd message: the measuring side fails at its deadline
    # and says how the peer ended; the JSON marks both floors failed.
    out = tmp_path / "floors-failed.json"
    proc = subprocess.run([fd_bin("fd-transport-bench"), "--floors", "--sizes", "64K", "--transports", "shm-inplace",
                           "--io-threads", "1", "--links", "1", "--fail-server-after", "2", "--timeout-ms", "500",
                           "--json", out], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = {r["name"].split("/min_time")[0]: r for r in json.loads(out.read_text())["benchmarks"]}
    for name in ("floor/zmq-ipc", "floor/futex-shm"):
        assert rows[name]["error_occurred"] is True, rows[name]
        assert "the peer exited with status 3" in rows[name]["error_message"], rows[name]
        assert "rtt_median_us" not in rows[name]


def test_floor_peer_usage(fd_bin):
    for args in ([], ["udp", "x"], ["zmq", "ipc:///nonexistent/x", "-1"], ["futex", "/fd-floor-x", "2x"]):
        proc = subprocess.run([fd_bin("fd-transport-bench"), "floor-peer", *args], capture_output=True, text=True,
                              timeout=30)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "usage: fd-transport-bench floor-peer" in proc.stderr
