#!/usr/bin/env python3
"""fd-sim's prediction for each measured SLS run (Figs. 11/12): the same schedule, workload, layers and R-worker
CPUs as the run's resolved config, against a measured profile (T(B) of the S-Part, R of the R-worker kernel), so
analysis/fig_paper.py can draw the MODELLED steps beside the measured ones and CLAIMS.md state both ratios.

For each ROOT/<sweep>/<point>/rep1/summary.json of the SLS sweeps it runs

    fd-sim --mode M --batch B --seq S --interval F [load-control: --w-lim --micro-batch --min-gap --max-running]
           --requests R --prompt-len P --gen-len G --layers N --rworkers workers*threads --profile PROFILE
           --out ROOT/<sweep>-fdsim/<point>/

(fd-sim is deterministic and needs no GPU: run it anywhere.) A config fd-sim cannot express (a workload trace,
prompt files, online arrivals, a length distribution other than fixed or uniform) is reported and skipped.

usage: analysis/sls_predict.py --paper ROOT --profile PROFILE.json [--bin-dir build/default/bin]
"""
import argparse
import json
import os
import subprocess
import sys

SWEEPS = ("fig11-sls-s1024", "fig11-sls-s768")


def length_flag(v):
    """fd-sim's N or uniform:A:B for a resolved workload length, else None."""
    if isinstance(v, int):
        return str(v)
    if isinstance(v, dict) and v.get("min") is not None and v.get("max") is not None and v.get("dist", "uniform") == "uniform":
        return "uniform:%d:%d" % (v["min"], v["max"])
    return None


def sim_args(cfg, profile, out):
    """fd-sim's command line for a resolved fd-bench config, or (None, why)."""
    wl, sc = cfg["workload"], cfg["schedule"]
    if wl.get("trace") or wl.get("prompts") or wl.get("score"):
        return None, "workload from a file"
    if wl.get("arrival", "offline") != "offline":
        return None, "online arrivals"
    p, g = length_flag(wl["prompt_len"]), length_flag(wl["gen_len"])
    if p is None or g is None:
        return None, "a length distribution fd-sim does not take"
    rw = cfg["engine"].get("rworkers") or {}
    args = ["--mode", sc["mode"], "--batch", str(sc["batch"]), "--seq", str(sc["seq"]), "--interval", str(sc.get("interval", 1)),
            "--requests", str(wl["requests"]), "--prompt-len", p, "--gen-len", g, "--layers", str(cfg["model"]["layers"]),
            "--rworkers", str(rw.get("spawn", 1) * rw.get("threads", 1)), "--profile", profile, "--out", out]
    if sc["mode"] == "load-control":
        args += ["--w-lim", str(sc["w_lim"]), "--min-gap", str(sc.get("min_gap", 0)), "--max-running", str(sc.get("max_running", 0))]
        if sc.get("micro_batch"):
            args += ["--micro-batch", str(sc["micro_batch"])]
    return args, None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paper", required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--bin-dir", default="build/default/bin")
    a = ap.parse_args(argv)
    exe = os.path.join(a.bin_dir, "fd-sim")
    if not os.access(exe, os.X_OK):
        print("sls_predict: %s not found (build it, or pass --bin-dir)" % exe, file=sys.stderr)
        return 2
    done = 0
    for sweep in SWEEPS:
        top = os.path.join(a.paper, sweep)
        if not os.path.isdir(top):
            print("sls_predict: %s not found, skipped" % top)
            continue
        for point in sorted(os.listdir(top)):
            sp = os.path.join(top, point, "rep1", "summary.json")
            if not os.path.isfile(sp):
                continue
            cfg = json.load(open(sp))["config"]
            out = os.path.join(a.paper, sweep + "-fdsim", point)
            args, why = sim_args(cfg, a.profile, out)
            if args is None:
                print("sls_predict: %s: %s, skipped" % (sp, why))
                continue
            os.makedirs(os.path.dirname(out), exist_ok=True)
            proc = subprocess.run([exe] + args, capture_output=True, text=True)
            if proc.returncode != 0:
                print("sls_predict: fd-sim failed for %s (rc %d): %s" % (sp, proc.returncode, proc.stderr.strip()), file=sys.stderr)
                return 1
            done += 1
            print("sls_predict: %s -> %s" % (os.path.join(sweep, point), out))
    return 0 if done else 1


if __name__ == "__main__":
    sys.exit(main())
