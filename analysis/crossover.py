#!/usr/bin/env python3
"""Toward the crossover, measured (issue 41, step 5): FastDecode with fp16 / int8 / int4 KV on 15 R-worker cores
against the strongest GPU-side engine at the same balance (8 SMs, the fewest green contexts allow, and 24 GB), each
point predicted from profiles before it is measured.

predict  from one machine's profiles (fd-bench profile: T(B) and head_b at 8 SMs; R-workers in service, 5 x 3, for
         each KV dtype) and its HBM read rate at 8 SMs (fd-kernel-bench --only balance, taken as GPU attention's KV
         read rate), asks `fd-bench predict` (the one model, fastdecode/sched/perf_model.h) for every point of the three
         sweeps (experiments/paper/crossover-*.sweep.json) and writes PREDICTIONS (JSON) with the criteria below. Run
         before the sweeps (scripts/model-validation.sh's crossover-predict stage does).
report   reads each group's measured runs (RUNS/crossover-fastdecode/..., RUNS/crossover-gpu-only/...,
         RUNS/crossover-paged-swap/...) and its PREDICTIONS, and writes OUT/CROSSOVER.md and OUT/crossover.json.

Criteria, written before any number was read:
  * metric: decode-only tokens/s (fd_runs.decode_steps: steps with no prompt tokens), the same for both sides;
  * a point's prediction holds when |measured / predicted - 1| <= 10 %;
  * FastDecode out-generates the GPU side at a (balance, B) when its decode-only tokens/s is above the best GPU-side
    engine's (gpu-only at max_context 1024 or 544, paged-swap) at the same SM count, memory cap and workload.
    KV formats: the GPU side keeps fp16 KV; FastDecode's int8 / int4 rows are the paper's comparison (int4 on the
    CPUs against fp16 on the GPU), said in every row.

usage: analysis/crossover.py predict --fd-bench BIN --profiles DIR --balance-bench FILE --out PREDICTIONS
       analysis/crossover.py report --group LABEL PREDICTIONS RUNS [--group ...] --out DIR
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys

from fd_runs import decode_steps, decode_tokens_per_s, hbm_rates, read_jsonl
from shapes import SHAPES

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(REPO, "experiments", "models", "llama-2-7b.json")
SPECS = {s: os.path.join(REPO, "experiments", "paper", s + ".sweep.json")
         for s in ("crossover-fastdecode", "crossover-gpu-only", "crossover-paged-swap")}
SM, MEM_GB, WORKERS, THREADS, LAYERS = 8, 24, 5, 3, 2
PROMPT, NEW = 512, 32
CONTEXT = PROMPT + NEW / 2  # mean context over the decode-only steps: prompt 512, positions 513..543
BAND = 0.10
KV_TOK_LAYER_FP16 = SHAPES["llama-2-7b"]["kv_tok_layer"]  # K and V of one token at one layer, fp16
CRITERIA = {
    "metric": "decode-only tokens/s (steps with no prompt tokens), both sides",
    "prediction": "holds when |measured / predicted - 1| <= 10 %",
    "crossover": "FastDecode (any KV dtype) above the best GPU-side engine's decode-only tokens/s at the same SM count, "
                 "memory cap and workload; the GPU side keeps fp16 KV",
}


def points(only=()):
    """(sweep, point name, {kv, b, maxctx}) of the three sweeps, as fd-bench sweep names them (label or value, axis
    order); `only`: "AXIS=LABEL[,LABEL...]" as fd-bench sweep --only takes them (an axis a sweep lacks leaves it whole)."""
    keep = {}
    for o in only:
        axis, _, labels = o.partition("=")
        keep[axis] = set(labels.split(","))
    out = []
    for sweep, path in SPECS.items():
        spec = json.load(open(path))
        names = [[]]
        for ax in spec["axes"]:
            labels = ax.get("labels") or [str(v) for v in ax["values"]]
            names = [n + [(ax["name"], lab, val)] for n in names for lab, val in zip(labels, ax["values"])
                     if ax["name"] not in keep or lab in keep[ax["name"]]]
        for n in names:
            name = "_".join("%s-%s" % (a, lab) for a, lab, _ in n)
            vals = {a: (v[0] if isinstance(v, list) else v) for a, _, v in n}
            out.append((sweep, name, vals))
    return out


def fd_bench_json(fd_bench, args):
    r = subprocess.run([fd_bench, "predict", *args, "--json", "-"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("crossover.py: fd-bench predict %s: %s" % (" ".join(args), r.stderr.strip()))
    return json.loads(r.stdout)


def profile_paths(d):
    gpu = svc = None
    for p in sorted(glob.glob(os.path.join(d, "profile_*.json"))):
        j = json.load(open(p))
        s = j.get("r_service")
        if s and (s["workers"], s["threads"]) == (WORKERS, THREADS):
            svc = p
        elif not s and j.get("backend") == "cuda" and j.get("sm_count", 0) == SM:
            gpu = p
    if not gpu or not svc:
        sys.exit("crossover.py: %s needs a CUDA profile at %d SMs and a service profile of %d x %d R-workers"
                 % (d, SM, WORKERS, THREADS))
    return gpu, svc


def predict(a):
    gpu, svc = profile_paths(a.profiles)
    rates = hbm_rates(a.balance_bench)
    if SM not in rates:
        sys.exit("crossover.py: %s has no HBM read rate at %d SMs" % (a.balance_bench, SM))
    attn_gbps = rates[SM] / 1e9
    rows = []
    for sweep, name, v in points(a.only or ()):
        b = float(v["b"])
        common = ["--profile", gpu, "--batch", "%g" % b, "--context", "%g" % CONTEXT, "--layers", str(LAYERS)]
        if sweep == "crossover-fastdecode":
            p = fd_bench_json(a.fd_bench, common + ["--service", svc, "--kv-dtype", v["kv"]])
            engine, kv = "fastdecode", v["kv"]
        else:
            maxctx = v.get("maxctx", PROMPT + NEW)  # paged-swap: its blocks of 16 hold the 544 positions exactly
            p = fd_bench_json(a.fd_bench, common + ["--engine", "gpu-only", "--gpu-attn-gbps", "%.6g" % attn_gbps,
                                                    "--model", MODEL, "--gpu-mem-gb", "%g" % a.memory_gb, "--max-context", str(maxctx)])
            engine, kv = sweep[len("crossover-"):], "fp16"
        rows.append({"sweep": sweep, "point": name, "engine": engine, "kv": kv, "b": int(b), "maxctx": v.get("maxctx"),
                     "predicted": {"tokens_per_s": p["tokens_per_s"], "step_ms": 1e3 * p["step_s"], "batch": p["batch"],
                                   "binds": p["binds"], "outside_grid": p.get("outside_grid", False), "model": p}})
    out = {"modelled": True, "criteria": CRITERIA, "context": CONTEXT, "layers": LAYERS, "sm_count": SM, "memory_gb": a.memory_gb,
           "profiles": {"gpu": os.path.basename(gpu), "service": os.path.basename(svc)},
           "gpu_attn_gbps": attn_gbps, "gpu_attn_source": "%s: balance/read/sm%d" % (os.path.basename(a.balance_bench), SM),
           "paged_swap": "predicted as gpu-only with slots of %d positions (34 blocks of 16); swapping not modelled" % (PROMPT + NEW),
           "points": rows}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    for r in rows:
        print("MODELLED %-22s %-20s %-5s B=%-5d %8.0f tok/s (batch %g, %s)" % (
            r["sweep"], r["point"], r["kv"], r["b"], r["predicted"]["tokens_per_s"], r["predicted"]["batch"],
            r["predicted"]["binds"]))


def measured(run_dir):
    s = json.load(open(os.path.join(run_dir, "summary.json")))
    dec = decode_steps(read_jsonl(run_dir, "steps.jsonl"))
    tokens = sum(x["decode_tokens"] for x in dec)
    m = {"tokens_per_s": decode_tokens_per_s(dec), "step_ms": statistics.fmean(x["step_ms"] for x in dec),
         "batch": tokens / len(dec), "steps": len(dec),
         "output_throughput": s["results"]["output_throughput"], "dir": os.path.relpath(os.path.abspath(run_dir), REPO),
         "provenance": {k: s["provenance"].get(k) for k in ("git_commit", "date_utc", "cpu_model", "gpus")}}
    bd = [x.get("breakdown_ms") or {} for x in dec]
    if bd and all("r_compute_max" in x for x in bd):
        m["s_compute_ms"] = statistics.fmean(x.get("s_compute", 0.0) for x in bd)
        m["r_compute_max_ms"] = statistics.fmean(x["r_compute_max"] for x in bd)
        m["r_wait_ms"] = statistics.fmean(x.get("r_wait", 0.0) for x in bd)
        # The R-workers' KV read rate counted in fp16 bytes (as the balance map's x): the context the busiest worker's
        # time covers, whatever the KV dtype, so int4's fewer bytes show as a higher rate.
        m["cpu_fp16_equiv_gbps"] = (statistics.fmean(x["total_context"] for x in dec) * LAYERS * KV_TOK_LAYER_FP16
                                    / (m["r_compute_max_ms"] / 1e3) / 1e9)
    return m


def report(a):
    rows, preds = [], []
    for label, ppath, root in a.group:
        pred = json.load(open(ppath))
        preds.append({"group": label, "file": os.path.relpath(os.path.abspath(ppath), REPO),
                      "memory_gb": pred["memory_gb"], "profiles": pred["profiles"], "gpu_attn_gbps": pred["gpu_attn_gbps"],
                      "context": pred["context"]})
        for r in pred["points"]:
            d = os.path.join(root, r["sweep"], r["point"], "rep1")
            row = dict(r, group=label, memory_gb=pred["memory_gb"])
            if os.path.isfile(os.path.join(d, "summary.json")):
                row["measured"] = measured(d)
                row["ratio"] = row["measured"]["tokens_per_s"] / r["predicted"]["tokens_per_s"]
            else:
                row["missing"] = "no run folder " + d
            rows.append(row)
    by = {}
    for r in rows:
        if "measured" in r:
            by.setdefault((r["group"], r["memory_gb"], r["b"]), []).append(r)
    verdicts = []
    for (group, mem, b), rs in by.items():
        gpu = [r for r in rs if r["engine"] != "fastdecode"]
        if not gpu:
            continue
        best = max(gpu, key=lambda r: r["measured"]["tokens_per_s"])
        for r in rs:
            if r["engine"] == "fastdecode":
                ratio = r["measured"]["tokens_per_s"] / best["measured"]["tokens_per_s"]
                pratio = r["predicted"]["tokens_per_s"] / max(g["predicted"]["tokens_per_s"] for g in gpu)
                verdicts.append({"group": group, "memory_gb": mem, "b": b, "kv": r["kv"], "fd_tok_s": r["measured"]["tokens_per_s"],
                                 "best_gpu": "%s %s" % (best["engine"], best["point"]),
                                 "best_gpu_tok_s": best["measured"]["tokens_per_s"], "ratio": ratio,
                                 "predicted_ratio": pratio, "out_generates": ratio > 1.0})
    errs = [abs(r["ratio"] - 1) for r in rows if "ratio" in r]
    summary = {"points": len(rows), "measured": len(errs),
               "median_abs_err": statistics.median(errs) if errs else None, "max_abs_err": max(errs) if errs else None,
               "within_band": sum(e <= BAND for e in errs),
               "crossover_measured": sorted({(v["group"], v["memory_gb"]) for v in verdicts if v["out_generates"]}),
               "best_ratio": {"%s, %g GB" % k: max(v["ratio"] for v in verdicts if (v["group"], v["memory_gb"]) == k)
                              for k in sorted({(v["group"], v["memory_gb"]) for v in verdicts})}}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "crossover.json"), "w") as f:
        json.dump({"criteria": CRITERIA, "summary": summary, "verdicts": verdicts, "predictions": preds, "points": rows},
                  f, indent=1)
        f.write("\n")
    with open(os.path.join(a.out, "CROSSOVER.md"), "w") as f:
        f.write(markdown(preds, rows, verdicts, summary))
    print("crossover: %d/%d points measured, median |m/p - 1| %.1f %%, max %.1f %%; best FastDecode / best GPU side: %s; "
          "crossover measured at: %s" % (summary["measured"], summary["points"], 100 * (summary["median_abs_err"] or 0),
                                         100 * (summary["max_abs_err"] or 0),
                                         ", ".join("%s %.3f" % kv for kv in summary["best_ratio"].items()),
                                         "; ".join("%s, %g GB" % k for k in summary["crossover_measured"]) or "none"))


def markdown(preds, rows, verdicts, summary):
    L = ["# Toward the crossover, measured (analysis/crossover.py)", "",
         "Llama-2-7b (2 layers, memory at full depth), prompt 512 + 32 new tokens, GPU at %d SMs (the fewest green "
         "contexts allow); FastDecode on 5 x 3 pinned R-worker cores. Each point was predicted from its machine's "
         "profiles before it was measured; a group is one machine (one device call's profiles and runs)." % SM, "",
         "Criteria (written before the numbers): " + "; ".join("%s: %s" % kv for kv in CRITERIA.items()) + ".", "",
         "| group | GPU GB | predictions | profiles | GPU attention GB/s (HBM read at %d SMs) |" % SM, "|---|---|---|---|---|"]
    for p in preds:
        L.append("| %s | %g | %s | %s, %s | %.0f |" % (p["group"], p["memory_gb"], p["file"], p["profiles"]["gpu"],
                                                       p["profiles"]["service"], p["gpu_attn_gbps"]))
    L += ["", "| group | GPU GB | engine | KV | B | point | sequences (measured) | decode-only tok/s (measured) | MODELLED tok/s | "
          "measured / MODELLED | binds (MODELLED) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head = "| %s | %g | %s | %s | %d | %s |" % (r["group"], r["memory_gb"], r["engine"], r["kv"], r["b"], r["point"])
        if "measured" not in r:
            L.append(head + " — | %s | %.0f | — | %s |" % (r["missing"], r["predicted"]["tokens_per_s"], r["predicted"]["binds"]))
            continue
        m = r["measured"]
        L.append(head + " %.1f | %.0f | %.0f | %.3f | %s |" % (m["batch"], m["tokens_per_s"], r["predicted"]["tokens_per_s"],
                                                             r["ratio"], r["predicted"]["binds"]))
    L += ["", "Predictions: %d of %d measured points within ±10 %%; median |measured / MODELLED − 1| %.1f %%, max %.1f %%." % (
        summary["within_band"], summary["measured"], 100 * (summary["median_abs_err"] or 0), 100 * (summary["max_abs_err"] or 0)),
        "", "| group | GPU GB | B | FastDecode KV (CPUs) vs GPU side | FastDecode tok/s | best GPU side | its tok/s | "
        "measured ratio | MODELLED ratio | out-generates |", "|---|---|---|---|---|---|---|---|---|---|"]
    for v in verdicts:
        L.append("| %s | %g | %d | %s vs fp16 | %.0f | %s | %.0f | %.3f | %.3f | %s |" % (
            v["group"], v["memory_gb"], v["b"], v["kv"], v["fd_tok_s"], v["best_gpu"], v["best_gpu_tok_s"], v["ratio"],
            v["predicted_ratio"], "yes" if v["out_generates"] else "no"))
    L += ["", "Best FastDecode / best GPU side: %s. Crossover measured at: %s." % (
        ", ".join("%s %.3f" % kv for kv in summary["best_ratio"].items()),
        "; ".join("%s, %g GB" % k for k in summary["crossover_measured"]) or "none")]
    fd = [r for r in rows if r["engine"] == "fastdecode" and "measured" in r and "r_compute_max_ms" in r["measured"]]
    if fd:
        L += ["", "Where FastDecode's step goes (means over decode-only steps, ms a step): the busiest R-worker's compute "
              "(both layers, both mini-batches) against the S-worker's GPU compute.", "",
              "| group | GPU GB | KV | B | step | busiest R-worker compute | S-Part compute | S-worker waiting on R | "
              "CPU KV read, fp16-equivalent GB/s | x (fp16-equivalent) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
        attn = {p["group"]: p["gpu_attn_gbps"] for p in preds}
        for r in fd:
            m = r["measured"]
            L.append("| %s | %g | %s | %d | %.2f | %.2f | %.2f | %.2f | %.0f | %.3f |" % (
                r["group"], r["memory_gb"], r["kv"], r["b"], m["step_ms"], m["r_compute_max_ms"], m["s_compute_ms"], m["r_wait_ms"],
                m["cpu_fp16_equiv_gbps"], m["cpu_fp16_equiv_gbps"] / attn[r["group"]]))
    return "\n".join(L) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("predict")
    p.add_argument("--fd-bench", required=True)
    p.add_argument("--profiles", required=True)
    p.add_argument("--balance-bench", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--memory-gb", type=float, default=MEM_GB, help="GPU memory of the GPU side (hardware.gpu.memory_gb)")
    p.add_argument("--only", nargs="+", help="AXIS=LABEL[,LABEL...]: only these points, as fd-bench sweep --only")
    r = sub.add_parser("report")
    r.add_argument("--group", nargs=3, action="append", required=True, metavar=("LABEL", "PREDICTIONS", "RUNS"),
                   help="one machine's predictions file and the runs root it predicts (RUNS/<sweep>/<point>/rep1)")
    r.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    predict(a) if a.cmd == "predict" else report(a)


if __name__ == "__main__":
    main()
