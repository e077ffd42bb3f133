#!/usr/bin/env python3
"""A worker's link cut mid-run (issue 47, the run tests/python/test_network_emulation.py's
test_a_cut_link_is_recovered_with_the_same_tokens makes), kept as an artifact: the quickstart config (cpu backend, 2
spawned R-workers, 4 requests x 64 tokens) once on loopback, once behind a 1 Gbit/s link per worker with worker 1's veth
set down after the 4th step; writes OUT/loopback/, OUT/cut/ (run folders) and OUT/cut.json (when the link went down,
what the run recorded of the recovery, whether the tokens match). Needs root and iproute2.

  /usr/bin/python3 experiments/cluster/cut_link.py --bin build/default/bin --out DIR
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SETS = ["engine.backend=cpu", "workload.requests=4", "workload.gen_len=64", "engine.rworkers.heartbeat_ms=200",
        "engine.rworkers.heartbeat_timeout_ms=1000"]


def args_for(bench: str, out: Path, *sets: str) -> list[str]:
    a = [bench, "run", str(REPO / "experiments" / "quickstart.json"), "--out", str(out), "--quiet"]
    for s in SETS + list(sets):
        a += ["--set", s]
    return a


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(REPO / "build" / "default" / "bin"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--cut-after-steps", type=int, default=4)
    a = ap.parse_args()
    out, bench = Path(a.out), str(Path(a.bin) / "fd-bench")
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(args_for(bench, out / "loopback"), check=True, capture_output=True)
    p = subprocess.Popen(args_for(bench, out / "cut", 'hardware.network={"rate_gbit": 1}', "engine.rworkers.on_failure=recover"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    steps = out / "cut" / "steps.jsonl"
    while not (steps.exists() and len(steps.read_text().splitlines()) >= a.cut_after_steps):
        if p.poll() is not None:
            raise SystemExit("the run ended before its link could be cut")
        time.sleep(0.02)
    veth = f"fdv{p.pid % 16384}a1"  # the S-worker's end of host 1's link (fastdecode/sworker/netemu.cpp)
    steps_before = len(steps.read_text().splitlines())
    t_cut = time.time()
    subprocess.run(["ip", "link", "set", veth, "down"], check=True)
    _, err = p.communicate(timeout=300)
    t_end = time.time()
    s = json.loads((out / "cut" / "summary.json").read_text())
    tok = lambda d: [json.loads(x)["tokens"] for x in (out / d / "requests.jsonl").read_text().splitlines()]  # noqa: E731
    recov = [json.loads(x) for x in steps.read_text().splitlines() if json.loads(x).get("counts", {}).get("rworkers_lost")]
    res = {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "cut": f"ip link set {veth} down (host 1's veth, S-worker side), after {steps_before} steps were recorded",
           "exit_code": p.returncode, "status": s["status"], "counts_total": s["results"]["counts_total"],
           "recovering_steps": [{"step": r["step"], "counts": r["counts"],
                                 "recovery_ms": r.get("breakdown_ms", {}).get("recovery"), "step_ms": r["step_ms"]}
                                for r in recov],
           "seconds_from_cut_to_run_end": round(t_end - t_cut, 2),
           "stderr_lost_lines": [ln for ln in err.splitlines() if "lost" in ln],
           "requests": len(tok("cut")), "tokens_equal_to_loopback": tok("cut") == tok("loopback")}
    (out / "cut.json").write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))
    raise SystemExit(0 if p.returncode == 0 and res["tokens_equal_to_loopback"] else 1)


if __name__ == "__main__":
    main()
