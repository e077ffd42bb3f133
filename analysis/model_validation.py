#!/usr/bin/env python3
"""FastDecode runs predicted from profiles alone (issue 41): the model is fastdecode/sched/perf_model.h's predict_step,
asked through `fd-bench predict` (one definition of the model, in C++; nothing of it is re-implemented here).

A group is one machine: the profiles measured on it (PROFILE_DIR/profile_*.json: fd-bench profile --backend cuda,
with --service for the R-workers' configurations) and the runs measured on it (every FastDecode run folder under
RUNS_ROOT). For each run: B = its mean decode batch, context = its mean total context / B, N = its layers, over its
decode-only steps; the GPU profile is the one of its SM count (hardware.gpu.sm_count; the whole GPU: a service
profile's own T(B)), the service profile the one of its R-workers (spawn x threads). A run no profile describes is
listed with why, not dropped. Measured: the mean decode step (B over it: the decode tokens/s). Nothing is fitted to
the runs.

The band (issue 41): median |measured / predicted - 1| <= 5 % and every run within 10 %.

An SLS run (a sweep of analysis/sls_predict.py's SWEEPS: the batch and its contexts change over the run) is fd-sim's to
predict: fd-sim steps the run's own experiment (analysis/sls_predict.py's command line) against the group's service
profile of the run's R-workers, and its steady window's decode step p50 / p99 and tokens/s are set beside the run's.
The band there: every quantity within 10 %.

usage: analysis/model_validation.py --fd-bench BIN --group NAME PROFILE_DIR RUNS_ROOT [--group ...] --out DIR
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import tempfile

from fd_runs import decode_steps, read_jsonl
from sls_predict import SWEEPS as SLS_SWEEPS, mismatch, sim_args

BAND_MEDIAN, BAND_MAX = 0.05, 0.10


def profiles(d):
    """({sm_count: path} of the GPU side, {(workers, threads): path} of the service) of a folder's profile_*.json."""
    gpu, svc = {}, {}
    for p in sorted(glob.glob(os.path.join(d, "profile_*.json"))):
        j = json.load(open(p))
        s = j.get("r_service")
        if s:
            svc[(s["workers"], s["threads"])] = p
        elif j.get("backend") == "cuda":
            gpu[j.get("sm_count", 0)] = p
    return gpu, svc


def runs_under(root):
    for d, _, files in sorted(os.walk(root)):
        if "summary.json" in files:
            s = json.load(open(os.path.join(d, "summary.json")))
            if s.get("engine") == "fastdecode" and s.get("status", "ok") == "ok":
                yield d, s


def predict(fd_bench, gpu, svc, B, ctx, N):
    out = subprocess.run([fd_bench, "predict", "--profile", gpu, "--service", svc, "--batch", "%.17g" % B, "--context", "%.17g" % ctx,
                          "--layers", str(N), "--json", "-"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def family(rel):
    return rel.split(os.sep)[0]


SLS_KEYS = (("decode step p50", "p50"), ("decode step p99", "p99"), ("tokens/s", None))


def sls_row(fd_sim, name, rel, run_dir, s, profile):
    """fd-sim on an SLS run's experiment (sweep point from the run's sweep index) against `profile`: the steady window's
    decode step p50 / p99 and tokens/s, measured and predicted."""
    sweep_dir = os.path.dirname(os.path.dirname(run_dir))
    sweep, point = os.path.basename(sweep_dir), os.path.basename(os.path.dirname(run_dir))
    index = json.load(open(os.path.join(sweep_dir, "index.json")))
    overrides = next(p["overrides"] for p in index["points"] if p["name"] == point)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "sim")
        subprocess.run([fd_sim] + sim_args(sweep, overrides, profile, out), check=True, capture_output=True, text=True)
        sim = json.load(open(os.path.join(out, "summary.json")))
    why = mismatch(s["config"], sim["config"])
    if why:
        raise SystemExit("model_validation: %s: fd-sim did not read the run's experiment (%s)" % (run_dir, why))
    m, p = s["results"]["steady"], sim["results"]["steady"]
    q = {}
    for label, k in SLS_KEYS:
        mv = m["tokens_per_s"] if k is None else m["decode_step_ms"][k]
        pv = p["tokens_per_s"] if k is None else p["decode_step_ms"][k]
        q[label] = {"measured": mv, "predicted": pv, "measured_over_predicted": mv / pv}
    return {"group": name, "run": rel, "service_profile": os.path.basename(profile), "steady": q}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fd-bench", required=True)
    ap.add_argument("--fd-sim", help="fd-sim, for the SLS runs (default: beside --fd-bench)")
    ap.add_argument("--group", nargs=3, action="append", required=True, metavar=("NAME", "PROFILE_DIR", "RUNS_ROOT"))
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    fd_sim = a.fd_sim or os.path.join(os.path.dirname(a.fd_bench), "fd-sim")
    rows, unmodelled, sls = [], [], []
    for name, pdir, root in a.group:
        gpu, svc = profiles(pdir)
        for d, s in runs_under(root):
            rel = os.path.relpath(d, root)
            dec = decode_steps(read_jsonl(d, "steps.jsonl"))
            rw = s["config"]["engine"]["rworkers"]
            cfg = (rw["spawn"], rw["threads"])
            sm = s["config"].get("hardware", {}).get("gpu", {}).get("sm_count", 0)
            why = None
            if family(rel) in SLS_SWEEPS and cfg in svc:
                sls.append(sls_row(fd_sim, name, rel, d, s, svc[cfg]))
                continue
            if not dec:
                why = "no decode-only step"
            elif cfg not in svc:
                why = "no service profile of %d x %d R-workers on this machine" % cfg
            elif sm != 0 and sm not in gpu:
                why = "no GPU profile at %d SMs on this machine" % sm
            elif rw.get("kv_dtype", "fp16") != "fp16":
                why = "KV %s: the service profiles are fp16" % rw.get("kv_dtype")
            if why:
                unmodelled.append({"group": name, "run": rel, "why": why})
                continue
            B = statistics.fmean(x["decode_tokens"] for x in dec)
            ctx = statistics.fmean(x["total_context"] for x in dec) / B
            N = s["model"]["layers"]
            g = svc[cfg] if sm == 0 else gpu[sm]
            p = predict(a.fd_bench, g, svc[cfg], B, ctx, N)
            p.pop("inputs", None)  # its paths are this checkout's; the row names the profiles
            step = statistics.fmean(x["step_ms"] for x in dec) / 1e3
            rows.append({"group": name, "run": rel, "family": family(rel), "B": B, "context": ctx, "layers": N,
                         "rworkers": "%dx%d" % cfg, "sm_count": sm, "gpu_profile": os.path.basename(g),
                         "service_profile": os.path.basename(svc[cfg]), "predicted": p, "measured_step_s": step,
                         "predicted_step_s": p["step_s"], "measured_tokens_per_s": B / step,
                         "predicted_tokens_per_s": p["tokens_per_s"], "measured_over_predicted": step / p["step_s"]})
    errs = [abs(r["measured_over_predicted"] - 1) for r in rows]
    summary = {"runs": len(rows), "unmodelled": len(unmodelled),
               "median_abs_err": statistics.median(errs) if errs else None, "max_abs_err": max(errs) if errs else None,
               "band": {"median": BAND_MEDIAN, "max": BAND_MAX},
               "band_met": bool(errs) and statistics.median(errs) <= BAND_MEDIAN and max(errs) <= BAND_MAX, "by_family": {}}
    for fam in sorted({(r["group"], r["family"]) for r in rows}):
        e = [abs(r["measured_over_predicted"] - 1) for r in rows if (r["group"], r["family"]) == fam]
        summary["by_family"]["%s/%s" % fam] = {"runs": len(e), "median_abs_err": statistics.median(e), "max_abs_err": max(e)}
    sls_errs = [abs(v["measured_over_predicted"] - 1) for r in sls for v in r["steady"].values()]
    summary["sls"] = {"runs": len(sls), "max_abs_err": max(sls_errs) if sls_errs else None, "band": BAND_MAX,
                      "band_met": bool(sls_errs) and max(sls_errs) <= BAND_MAX}
    os.makedirs(a.out, exist_ok=True)
    json.dump({"summary": summary, "rows": rows, "sls": sls, "unmodelled": unmodelled}, open(os.path.join(a.out, "validation.json"), "w"), indent=1)
    lines = ["# FastDecode runs predicted from profiles alone (MODELLED)", "",
             "Generated by `analysis/model_validation.py` (the model: `fd-bench predict`, fastdecode/sched/perf_model.h); do not "
             "edit by hand. Each group is one machine: its profiles and its runs. step = N·max(2·T(B/2), R) + T(B/2) + head, R = the "
             "R-workers' layer time in service at the run's B and mean context; nothing fitted to the runs.", "",
             "| group | run | R-workers | SMs | B | context | N | S ms/layer | R ms/layer | fill + head ms | predicted step ms | measured step ms | measured / predicted |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["predicted"]
        lines.append("| %s | %s | %s | %s | %.0f | %.0f | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.3f |" % (
            r["group"], r["run"], r["rworkers"], r["sm_count"] or "all", r["B"], r["context"], r["layers"], 1e3 * p["s_layer_s"],
            1e3 * p["r_layer_s"], 1e3 * (p["fill_s"] + p["head_s"]), 1e3 * r["predicted_step_s"], 1e3 * r["measured_step_s"],
            r["measured_over_predicted"]))
    lines += ["", "| group / family | runs | median \\|measured / predicted − 1\\| | max |", "|---|---|---|---|"]
    for fam, v in summary["by_family"].items():
        lines.append("| %s | %d | %.1f %% | %.1f %% |" % (fam, v["runs"], 100 * v["median_abs_err"], 100 * v["max_abs_err"]))
    if errs:
        lines += ["", "All %d runs: median %.1f %%, max %.1f %%; the band (median ≤ %.0f %%, every run ≤ %.0f %%) is %s." % (
            len(rows), 100 * summary["median_abs_err"], 100 * summary["max_abs_err"], 100 * BAND_MEDIAN, 100 * BAND_MAX,
            "met" if summary["band_met"] else "NOT met")]
    if sls:
        lines += ["", "## SLS runs predicted by fd-sim (MODELLED)", "",
                  "fd-sim steps each run's own experiment against the group's service profile of its R-workers; the steady window "
                  "(after the first finish, before the last admission) of both. Band: every quantity within %.0f %%." % (100 * BAND_MAX), "",
                  "| group | run | " + " | ".join("%s measured / fd-sim" % k for k, _ in SLS_KEYS) + " |", "|---|---|---|---|---|"]
        for r in sls:
            lines.append("| %s | %s | " % (r["group"], r["run"]) + " | ".join(
                "%.4g / %.4g = %.3f" % (v["measured"], v["predicted"], v["measured_over_predicted"]) for v in r["steady"].values()) + " |")
        lines += ["", "%d SLS runs: max %.1f %% off; the band (every quantity within %.0f %%) is %s." % (
            len(sls), 100 * summary["sls"]["max_abs_err"], 100 * BAND_MAX, "met" if summary["sls"]["band_met"] else "NOT met")]
    if unmodelled:
        lines += ["", "Runs the profiles cannot describe:"] + ["* %s: %s: %s" % (u["group"], u["run"], u["why"]) for u in unmodelled]
    open(os.path.join(a.out, "VALIDATION.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines[-8:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
