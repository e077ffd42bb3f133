#!/usr/bin/env python3
"""End-to-end FastDecode vs GPU-only report from fd-bench run folders (experiments/gpu/*.json).

For each run: the decode-only steps (no prompt tokens that step: admission is over or waiting) give the
decode throughput (decode tokens / their wall time), the mean batch and total context per step, and the
engine's step breakdown averaged over them; the whole run gives output tokens/s. Writes E2E_REPORT.md and
e2e.json into --out.

usage: analysis/e2e_report.py RUN_DIR... --out DIR
"""
import argparse
import json
import os
import statistics

from fd_runs import decode_steps, decode_tokens_per_s, read_jsonl


def balance(s, hw):
    """Where the run's S-Part ran: the whole GPU, a reduced one (the A10-like emulation), or the CPU."""
    info = s.get("engine_info", {})
    on_gpu = (s["engine"] in ("gpu-only", "paged-swap", "host-offload", "hf-transformers") or info.get("backend") == "cuda"
              or info.get("device") == "cuda" or str(info.get("s_part", "")).startswith("cuda"))
    if not on_gpu:
        return "CPU (no GPU)"
    if hw.get("sm_count"):
        return "A10-like (%s GB, %s SMs)" % (hw.get("memory_gb"), hw.get("sm_count"))
    gpus = s["provenance"].get("gpus") or [{}]
    return "full " + str(gpus[0].get("name", "GPU")).replace("NVIDIA ", "")


def load_run(d):
    s = json.load(open(os.path.join(d, "summary.json")))
    steps = read_jsonl(d, "steps.jsonl")
    dec = decode_steps(steps)
    keys = sorted({k for x in dec for k in x.get("breakdown_ms", {})})
    bd = {k: statistics.fmean(x["breakdown_ms"].get(k, 0.0) for x in dec) for k in keys} if dec else {}
    cfg = s["config"]
    hw = cfg.get("hardware", {}).get("gpu", {})
    info = s.get("engine_info", {})
    eng = cfg["engine"]
    return {
        "name": s["name"],
        "model": s["model"]["name"],
        "layers": s["model"]["layers"],
        "engine": s["engine"],
        "balance": balance(s, hw),
        "rworker_cpus": (eng.get("rworkers", {}).get("spawn", 0) * eng.get("rworkers", {}).get("threads", 0)) if s["engine"] == "fastdecode" else 0,
        "gpu_only_slots": info.get("slots"),
        "decode_steps": len(dec),
        "decode_tokens_per_s": decode_tokens_per_s(dec),
        "mean_batch": statistics.fmean(x["decode_tokens"] for x in dec) if dec else 0.0,
        "mean_total_context": statistics.fmean(x["total_context"] for x in dec) if dec else 0.0,
        "mean_step_ms": statistics.fmean(x["step_ms"] for x in dec) if dec else 0.0,
        "breakdown_ms": bd,
        "output_tokens_per_s": s["results"]["output_throughput"],
        "provenance": {k: s["provenance"].get(k) for k in ("git_commit", "date_utc", "cpu_model", "gpus", "command")},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rows = [load_run(d) for d in sorted(a.runs)]
    os.makedirs(a.out, exist_ok=True)
    json.dump(rows, open(os.path.join(a.out, "e2e.json"), "w"), indent=1)
    lines = ["| run | engine | balance | CPUs (R) | mean B | mean W (tokens) | decode step ms | breakdown (ms/step) | decode tok/s | run tok/s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        bd = ", ".join("%s %.2f" % (k, v) for k, v in r["breakdown_ms"].items())
        lines.append("| %s | %s | %s | %s | %.0f | %.0f | %.2f | %s | %.0f | %.0f |" % (
            r["name"], r["engine"], r["balance"], r["rworker_cpus"] or "-", r["mean_batch"], r["mean_total_context"],
            r["mean_step_ms"], bd, r["decode_tokens_per_s"], r["output_tokens_per_s"]))
    # Same model and balance: FastDecode / GPU-only decode throughput (the *-full / *-a10 runs; variants such
    # as *-int8 or *-graphs are in the table above).
    lines += ["", "| model | balance | FastDecode decode tok/s | GPU-only decode tok/s | ratio |", "|---|---|---|---|---|"]
    for m in sorted({r["model"] for r in rows}):
        for bal in sorted({r["balance"] for r in rows}):
            f = [r for r in rows if r["model"] == m and r["balance"] == bal and r["engine"] == "fastdecode" and r["name"].endswith(("-full", "-a10"))]
            g = [r for r in rows if r["model"] == m and r["balance"] == bal and r["engine"] == "gpu-only" and r["name"].endswith(("-full", "-a10"))]
            if f and g:
                lines.append("| %s | %s | %.0f | %.0f | %.3f |" % (m, bal, f[0]["decode_tokens_per_s"], g[0]["decode_tokens_per_s"],
                                                               f[0]["decode_tokens_per_s"] / g[0]["decode_tokens_per_s"]))
    open(os.path.join(a.out, "E2E_REPORT.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
