#!/usr/bin/env python3
"""Predicted vs measured decode throughput of FastDecode runs (the performance model, docs/SCHEDULING.md).

For each fd-bench run folder of the fastdecode engine: N = layers run, B = mean batch and W = mean total
context over the decode-only steps, P = R-worker CPUs (spawn x threads). With T(B) from a profile (per
layer, the whole batch: the engine runs two mini-batches of B/2, so 2·T(B/2)) and R (per CPU):

    step = N · max(2·T(B/2), W·R/P)        predicted tokens/s = B / step

once with each profile given (profiles measured with different r_threads give different R: CPUs that
share a memory bus do not add up). Writes VALIDATION.md and validation.json into --out.

--r-from-run adds, per run, the same model with R taken from the run itself (rows labelled FITTED: they take R from the run
they "predict", so they check the step's composition, never the model's prediction, and stay out of issue 41's band;
analysis/model_validation.py is the validation from profiles alone) (R = its busiest R-worker's mean
compute per decode step x P / (W x N)) and a pipeline-fill term (the side that does not bind works once for one
mini-batch of one layer before the other can start: + T(B/2) when R binds, + W*R/(2P) when S binds): that
checks the step's composition (max of the two sides, overlapped, plus the fill) apart from how well a profile
measures R, and a column says how far the profile's R is from the run's. Run folders are read plain or packed.

--fixed-from SWEEP_DIR (with --r-from-run) adds to those rows a fixed per-step term a(B), measured apart from the
runs: the intercept of step = a + b * layers in the fig8-intercept sweep (experiments/paper/
fig8-intercept-llama-2-7b.sweep.json: 1 and 2 layers at several B), a(B) = 2 * step(1 layer) - step(2 layers),
linear in B between its points (held at the ends), per model: a run gets the a(B) of its own model's sweep (the term is
mostly the LM head and sampling, which scale with the vocabulary: Llama-3-8B's 128 256 against Llama-2-7b's 32 000),
and a run of a model without one gets none (its row says so). An a(B) below zero is held at 0: a per-step cost cannot be
negative, and at large B the two runs' R-worker spread (a few % of a 100 ms step) is larger than the term itself.

usage: analysis/perf_model_validation.py --profile P.json [--profile Q.json ...] [--r-from-run [--fixed-from DIR]] --out DIR
           [--runs-under ROOT...] [RUN_DIR...]   (--runs-under: every FastDecode run folder below ROOT)
"""
import argparse
import bisect
import json
import os
import statistics

from fd_runs import decode_steps, decode_tokens_per_s, read_jsonl


def t_at(tb, b):
    xs = [p[0] for p in tb]
    ys = [p[1] for p in tb]
    if b <= xs[0]:
        return ys[0]
    if b >= xs[-1]:
        return ys[-2] + (ys[-1] - ys[-2]) * (b - xs[-2]) / (xs[-1] - xs[-2])
    i = bisect.bisect_left(xs, b)
    return ys[i - 1] + (ys[i] - ys[i - 1]) * (b - xs[i - 1]) / (xs[i] - xs[i - 1])


def fixed_table(sweep_dir):
    """{model: [(B, a(B) seconds)]} from the intercept sweep: per model and B, the mean decode-only step at 1 and 2
    layers; a(B) = 2 * step(1) - step(2), held at 0 from below."""
    by = {}
    for d, _, files in os.walk(sweep_dir):
        if "summary.json" not in files:
            continue
        s = json.load(open(os.path.join(d, "summary.json")))
        dec = decode_steps(read_jsonl(d, "steps.jsonl"))
        if dec:
            B = s["config"]["workload"]["requests"]
            model = s["model"].get("name", "")
            by.setdefault(model, {}).setdefault(B, {})[s["model"]["layers"]] = statistics.fmean(x["step_ms"] for x in dec) / 1e3
    table = {m: sorted((B, max(0.0, 2 * v[1] - v[2])) for B, v in bs.items() if 1 in v and 2 in v) for m, bs in by.items()}
    table = {m: pts for m, pts in table.items() if pts}
    if not table:
        raise SystemExit("perf_model_validation: no B with both 1- and 2-layer runs under %s" % sweep_dir)
    return table


def fixed_at(pts, b):
    if b <= pts[0][0]:
        return pts[0][1]
    if b >= pts[-1][0]:
        return pts[-1][1]
    i = bisect.bisect_left([p[0] for p in pts], b)
    (x0, y0), (x1, y1) = pts[i - 1], pts[i]
    return y0 + (y1 - y0) * (b - x0) / (x1 - x0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", action="append", required=True)
    ap.add_argument("--r-from-run", action="store_true", help="also predict with R from each run's own R-worker compute, plus the fill")
    ap.add_argument("--fixed-from", help="the fig8-intercept sweep folder: a fixed per-step term a(B) for the --r-from-run rows")
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs-under", nargs="+", default=[], help="also every FastDecode run folder (summary.json) below these")
    ap.add_argument("runs", nargs="*")
    a = ap.parse_args()
    for root in a.runs_under:
        for d, _, files in sorted(os.walk(root)):
            if "summary.json" in files and json.load(open(os.path.join(d, "summary.json"))).get("engine") == "fastdecode":
                a.runs.append(d)
    if not a.runs:
        ap.error("no run folder given or found")
    profiles = [(p, json.load(open(p))) for p in a.profile]
    fixed = fixed_table(a.fixed_from) if a.fixed_from else None
    rows = []
    for d in sorted(a.runs):
        s = json.load(open(os.path.join(d, "summary.json")))
        if s["engine"] != "fastdecode":
            continue
        steps = read_jsonl(d, "steps.jsonl")
        dec = decode_steps(steps)
        B = statistics.fmean(x["decode_tokens"] for x in dec)
        W = statistics.fmean(x["total_context"] for x in dec)
        measured = decode_tokens_per_s(dec)
        rw = s["config"]["engine"]["rworkers"]
        P = rw["spawn"] * rw["threads"]
        N = s["model"]["layers"]
        model = s["model"]["name"]
        r_run = None
        if a.r_from_run:
            rmax = statistics.fmean(x.get("breakdown_ms", {}).get("r_compute_max", 0.0) for x in dec) / 1e3
            r_run = rmax * P / (W * N) if rmax > 0 else None
        for path, prof in profiles:
            if prof.get("provenance", {}).get("command", "").find(model + ".json") < 0:
                continue  # a profile of another model
            R = prof["r_s_per_token_layer"]["fp16"]
            ts = 2 * t_at(prof["t_b"], B / 2)
            tr = W * R / P
            step = N * max(ts, tr)
            pred = B / step
            rows.append({"run": s["name"], "model": model, "B": B, "W": W, "P": P, "N": N,
                         "profile": os.path.basename(path), "r_threads": prof.get("r_threads", 1), "R": R,
                         "t_s_ms": ts * 1e3, "t_r_ms": tr * 1e3, "binds": "R" if tr > ts else "S",
                         "predicted_tok_s": pred, "measured_tok_s": measured, "measured_over_predicted": measured / pred,
                         "measured_step_ms": statistics.fmean(x["step_ms"] for x in dec),
                         "predicted_step_ms": step * 1e3, "run_dir": d})
            if r_run is not None:
                tr_run = W * r_run / P
                fill = 2 * t_at(prof["t_b"], B / 2) / 2 if tr_run > ts else tr_run / 2
                has_fixed = bool(fixed) and model in fixed
                fixed_s = fixed_at(fixed[model], B) if has_fixed else 0.0
                step_run = N * max(ts, tr_run) + fill + fixed_s
                rows.append({**rows[-1], "R": r_run, "r_source": "run", "t_r_ms": tr_run * 1e3, "fill_ms": fill * 1e3,
                             "fixed_ms": fixed_s * 1e3 if has_fixed else None,
                             "binds": "R" if tr_run > ts else "S", "predicted_tok_s": B / step_run,
                             "measured_over_predicted": measured / (B / step_run), "predicted_step_ms": step_run * 1e3,
                             "profile_r_over_run_r": R / r_run})
    rows.sort(key=lambda r: (r["run"], r.get("run_dir", ""), r["r_threads"], r.get("r_source", "")))
    os.makedirs(a.out, exist_ok=True)
    json.dump(rows, open(os.path.join(a.out, "validation.json"), "w"), indent=1)
    lines = ["| run | B | W | P | R from | R (ns/token/layer/CPU) | S ms/layer | R ms/layer | binds | predicted tok/s (MODELLED) | measured tok/s | measured / predicted |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fx = ("" if not fixed else " + fixed %.2f ms" % r["fixed_ms"] if r.get("fixed_ms") is not None
              else "; no intercept sweep of %s, so no fixed term" % r["model"])
        src = "FITTED: the run's own R (+ fill %.2f ms%s; profile R / run R = %.2f)" % (r["fill_ms"], fx, r["profile_r_over_run_r"]) \
            if r.get("r_source") == "run" else "%d thread(s)" % r["r_threads"]
        name = r["run"] if not a.r_from_run else os.path.relpath(r["run_dir"])
        lines.append("| %s | %.0f | %.0f | %d | %s | %.0f | %.2f | %.1f | %s | %.0f | %.0f | %.2f |" % (
            name, r["B"], r["W"], r["P"], src, r["R"] * 1e9, r["t_s_ms"], r["t_r_ms"], r["binds"],
            r["predicted_tok_s"], r["measured_tok_s"], r["measured_over_predicted"]))
    if a.r_from_run:
        groups = [("profile R", lambda r: r.get("r_source") != "run")]
        if fixed:
            groups += [("FITTED (the run's own R + fill + fixed, models with an intercept sweep: %s; not a prediction, kept out of "
                        "issue 41's band)" % ", ".join(sorted(fixed)),
                        lambda r: r.get("r_source") == "run" and r.get("fixed_ms") is not None),
                       ("FITTED (the run's own R + fill, models without one; not a prediction)", lambda r: r.get("r_source") == "run" and r.get("fixed_ms") is None)]
        else:
            groups += [("FITTED (the run's own R + fill; not a prediction)", lambda r: r.get("r_source") == "run")]
        for label, sel in groups:
            v = [r["measured_over_predicted"] for r in rows if sel(r)]
            if v:
                lines.append("")
                lines.append("%s: measured / predicted %.2f-%.2f over %d rows" % (label, min(v), max(v), len(v)))
    open(os.path.join(a.out, "VALIDATION.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
