#!/usr/bin/env python3
"""fd-sim's prediction for each measured SLS run (Figs. 11/12): fd-sim reads the experiment the sweep ran (its base
config with the point's overrides, from the sweep's index.json: `fd-sim --experiment`, fd-bench's own reader) and steps
it against a profile measured on the run's machine (T(B) of the S-Part and, when the profile has it, R of the
R-workers in service), placing each sequence on an R-worker as the engine does, so analysis/fig_paper.py can draw the
MODELLED steps beside the measured ones and CLAIMS.md state both.

For each point of ROOT/<sweep>/index.json it runs

    fd-sim --experiment experiments/paper/<the sweep's base> --set OVERRIDE ... --profile PROFILE
           --out ROOT/<sweep>-fdsim/<point>/

and checks that the schedule, workload and layers fd-sim read are the run's (its summary.json config): a sweep spec
changed since the run is an error, not a silent mismatch. fd-sim is deterministic and needs no GPU: run it anywhere.

usage: analysis/sls_predict.py --paper ROOT --profile [SWEEP=]PROFILE.json ... [--bin-dir build/default/bin]
"""
import argparse
import json
import os
import subprocess
import sys

SWEEPS = ("fig11-sls-s1024", "fig11-sls-s768")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def profiles_by_sweep(specs):
    """{sweep or None (every sweep): profile path} from --profile values "PATH" or "SWEEP=PATH"."""
    out = {}
    for s in specs:
        name, eq, path = s.partition("=")
        if eq and name in SWEEPS:
            out[name] = path
        elif eq and not os.path.exists(s):
            raise SystemExit("sls_predict: --profile %s: %s is not one of %s" % (s, name, ", ".join(SWEEPS)))
        else:
            out[None] = s
    return out


def sim_args(sweep, overrides, profile, out):
    """fd-sim's command line for a sweep point: the sweep spec's base config and the point's overrides."""
    spec_path = os.path.join(REPO, "experiments", "paper", sweep + ".sweep.json")
    base = os.path.join(os.path.dirname(spec_path), json.load(open(spec_path))["base"])
    args = ["--experiment", base]
    for o in overrides:
        args += ["--set", o]
    return args + ["--profile", profile, "--out", out]


def mismatch(run_cfg, sim_cfg):
    """The first key of schedule / workload / layers where fd-sim's reading differs from the run's, or None."""
    got = sim_cfg["experiment_resolved"]
    for sec in ("schedule", "workload"):
        for k, v in got[sec].items():
            if run_cfg[sec].get(k) != v and not (sec == "workload" and k in ("trace", "prompts", "score")):
                return "%s.%s: run %r, fd-sim %r" % (sec, k, run_cfg[sec].get(k), v)
    if run_cfg["model"]["layers"] != got["layers"]:
        return "model.layers: run %r, fd-sim %r" % (run_cfg["model"]["layers"], got["layers"])
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paper", required=True)
    ap.add_argument("--profile", required=True, action="append", help="PATH (every sweep) or SWEEP=PATH; repeatable")
    ap.add_argument("--bin-dir", default="build/default/bin")
    a = ap.parse_args(argv)
    exe = os.path.join(a.bin_dir, "fd-sim")
    if not os.access(exe, os.X_OK):
        print("sls_predict: %s not found (build it, or pass --bin-dir)" % exe, file=sys.stderr)
        return 2
    profiles = profiles_by_sweep(a.profile)
    done = 0
    for sweep in SWEEPS:
        top = os.path.join(a.paper, sweep)
        if not os.path.isdir(top):
            print("sls_predict: %s not found, skipped" % top)
            continue
        profile = profiles.get(sweep, profiles.get(None))
        if profile is None:
            print("sls_predict: no --profile for %s, skipped" % sweep)
            continue
        index = json.load(open(os.path.join(top, "index.json")))
        for p in index["points"]:
            point = p["name"]
            sp = os.path.join(top, point, "rep1", "summary.json")
            if not os.path.isfile(sp):
                continue
            out = os.path.join(a.paper, sweep + "-fdsim", point)
            if os.path.exists(os.path.join(out, "summary.json")):
                os.remove(os.path.join(out, "summary.json"))  # fd-sim refuses to overwrite: this is a regeneration
            proc = subprocess.run([exe] + sim_args(sweep, p["overrides"], profile, out), capture_output=True, text=True)
            if proc.returncode != 0:
                print("sls_predict: fd-sim failed for %s (rc %d): %s" % (sp, proc.returncode, proc.stderr.strip()), file=sys.stderr)
                return 1
            why = mismatch(json.load(open(sp))["config"], json.load(open(os.path.join(out, "summary.json")))["config"])
            if why:
                print("sls_predict: %s: fd-sim did not read the run's experiment (%s)" % (sp, why), file=sys.stderr)
                return 1
            done += 1
            print("sls_predict: %s -> %s (profile %s)" % (os.path.join(sweep, point), out, profile))
    return 0 if done else 1


if __name__ == "__main__":
    sys.exit(main())
