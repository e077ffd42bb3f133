#!/usr/bin/env python3
"""Predicted vs measured decode throughput of FastDecode runs (the performance model, docs/SCHEDULING.md).

For each fd-bench run folder of the fastdecode engine: N = layers run, B = mean batch and W = mean total
context over the decode-only steps, P = R-worker CPUs (spawn x threads). With T(B) from a profile (per
layer, the whole batch: the engine runs two mini-batches of B/2, so 2·T(B/2)) and R (per CPU):

    step = N · max(2·T(B/2), W·R/P)        predicted tokens/s = B / step

once with each profile given (profiles measured with different r_threads give different R: CPUs that
share a memory bus do not add up). Writes VALIDATION.md and validation.json into --out.

usage: analysis/perf_model_validation.py --profile P.json [--profile Q.json ...] --out DIR RUN_DIR...
"""
import argparse
import bisect
import json
import os
import statistics

from fd_runs import decode_steps, decode_tokens_per_s


def t_at(tb, b):
    xs = [p[0] for p in tb]
    ys = [p[1] for p in tb]
    if b <= xs[0]:
        return ys[0]
    if b >= xs[-1]:
        return ys[-2] + (ys[-1] - ys[-2]) * (b - xs[-2]) / (xs[-1] - xs[-2])
    i = bisect.bisect_left(xs, b)
    return ys[i - 1] + (ys[i] - ys[i - 1]) * (b - xs[i - 1]) / (xs[i] - xs[i - 1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", action="append", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    profiles = [(p, json.load(open(p))) for p in a.profile]
    rows = []
    for d in sorted(a.runs):
        s = json.load(open(os.path.join(d, "summary.json")))
        if s["engine"] != "fastdecode":
            continue
        steps = [json.loads(l) for l in open(os.path.join(d, "steps.jsonl"))]
        dec = decode_steps(steps)
        B = statistics.fmean(x["decode_tokens"] for x in dec)
        W = statistics.fmean(x["total_context"] for x in dec)
        measured = decode_tokens_per_s(dec)
        rw = s["config"]["engine"]["rworkers"]
        P = rw["spawn"] * rw["threads"]
        N = s["model"]["layers"]
        model = s["model"]["name"]
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
                         "predicted_step_ms": step * 1e3})
    rows.sort(key=lambda r: (r["run"], r["r_threads"]))
    os.makedirs(a.out, exist_ok=True)
    json.dump(rows, open(os.path.join(a.out, "validation.json"), "w"), indent=1)
    lines = ["| run | B | W | P | R from | R (ns/token/layer/CPU) | S ms/layer | R ms/layer | binds | predicted tok/s (MODELLED) | measured tok/s | measured / predicted |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %s | %.0f | %.0f | %d | %d thread(s) | %.0f | %.2f | %.1f | %s | %.0f | %.0f | %.2f |" % (
            r["run"], r["B"], r["W"], r["P"], r["r_threads"], r["R"] * 1e9, r["t_s_ms"], r["t_r_ms"], r["binds"],
            r["predicted_tok_s"], r["measured_tok_s"], r["measured_over_predicted"]))
    open(os.path.join(a.out, "VALIDATION.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
