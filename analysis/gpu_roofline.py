#!/usr/bin/env python3
"""The GPU baselines' decode step against its roofline (issue 18): for every gpu-only and paged-swap run of the
baselines grid (analysis/fig_baselines.py layout: ROOT/<balance>/<model>/<window>/<engine>-b<B>/), the median
decode-only step period (from one step's start to the next's, steps.jsonl start_ms: the time a step takes in the
run's throughput; the step() call alone, step_ms, is shown beside it: with gpu-only's asynchronous stepping the call
returns while the next step already runs on the GPU, so it is no longer the step) and the engine's own device time of
it (gpu-only: breakdown gpu_decode, CUDA events around the step on the GPU; paged-swap: decode), each over

    roofline = max(bytes / BW, flops / PEAK)
    bytes    = L * (w_layer + b * ctx * kv) + w_head                 (fp16 weights and KV read once per step)
    flops    = 2 * b * (L * p_layer + p_head) + 4 * L * b * ctx * d_model   (GEMMs + the two attention products)

with L the layers run, b the mean running batch, ctx the mean context (total_context / decode_tokens), w_layer =
2 * p_layer bytes, kv the fp16 KV bytes per token and layer, w_head = 2 * p_head (the LM head: vocab * d_model), BW
the HBM read rate and PEAK the fp16 tensor-core rate measured on the same device (fd-kernel-bench --only balance:
balance/read/all, balance/gemm_fp16/all). Target (issue 18): step period <= 1.3 x roofline at B = 64..1024. MODELLED is the
roofline; the steps are measured. Prints the formula and writes OUT/gpu_roofline.md, .json.

With --paper (default artifacts/paper/runs), the same for one layer at full depth: Fig. 8's least-squares slope b of
gpu-only's step over the layer count (step = a + b * layers, a the fixed per-step part: LM head, sampling, launches)
against one layer's roofline at that sweep's batch and context.

usage: analysis/gpu_roofline.py [--baselines ROOT...] [--paper DIR] [--balance-bench FILE] --out DIR
"""
import argparse
import json
import os
import statistics
import sys

from fd_runs import decode_steps, read_json, read_jsonl, steady_steps, write_report
from shapes import SHAPES, layer_weight_bytes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_BASELINES = [os.path.join(REPO, "artifacts", "baselines", r) for r in ("run1-a40a146", "run3-4bf4e28")]
DEFAULT_BALANCE = os.path.join(REPO, "artifacts", "baselines", "run1-a40a146", "balance_bench.json")
HEAD = {"llama-2-7b": (32000, 4096), "llama-2-13b": (32000, 5120)}  # vocab, d_model
DEVICE_TIME = {"gpu-only": "gpu_decode", "paged-swap": "decode"}
FORMULA = ("roofline = max(bytes / BW, flops / PEAK); bytes = L*(w_layer + b*ctx*kv) + w_head; "
           "flops = 2*b*(L*p_layer + p_head) + 4*L*b*ctx*d_model")


def device_rates(path):
    bw = peak = None
    for b in json.load(open(path))["benchmarks"]:
        if b["name"].startswith("balance/read/all/"):
            bw = b["bytes_per_second"]
        if b["name"].startswith("balance/gemm_fp16/all/"):
            peak = b["flop_per_second"]
    return bw, peak


def roofline(model, L, b, ctx, bw, peak):
    m = SHAPES[model]
    vocab, d = HEAD[model]
    p_head = vocab * d
    nbytes = L * (layer_weight_bytes(model) + b * ctx * m["kv_tok_layer"]) + 2 * p_head
    flops = 2 * b * (L * m["layer_params"] + p_head) + 4 * L * b * ctx * d
    return max(nbytes / bw, flops / peak), nbytes, flops


def phase_roofline(model, L, b, ctx, bw, peak):
    """The sum of each phase's own roofline, for phases that run one after the other: the weight GEMMs (weights
    read, GEMM FLOPs) and the attention (KV read, its two products). At a batch where the GEMMs are compute-bound
    and the attention memory-bound this is the tighter honest bound; the issue's formula takes one max over the
    totals (roofline())."""
    m = SHAPES[model]
    vocab, d = HEAD[model]
    p_head = vocab * d
    gemm = max((L * layer_weight_bytes(model) + 2 * p_head) / bw, 2 * b * (L * m["layer_params"] + p_head) / peak)
    attn = max(L * b * ctx * m["kv_tok_layer"] / bw, 4 * L * b * ctx * d / peak)
    return gemm + attn


def runs(roots):
    for root in roots:
        for dirpath, _dirs, files in os.walk(root):
            if "summary.json" not in files:
                continue
            name = os.path.basename(dirpath)
            engine = name.rsplit("-b", 1)[0]
            if engine in DEVICE_TIME and "/steady/" in dirpath + "/":
                yield engine, dirpath


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baselines", nargs="+", default=DEFAULT_BASELINES)
    ap.add_argument("--balance-bench", default=DEFAULT_BALANCE)
    ap.add_argument("--paper", default=os.path.join(REPO, "artifacts", "paper", "runs"))
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    bw, peak = device_rates(a.balance_bench)
    print("gpu_roofline: %s\n  BW = %.3g B/s, PEAK = %.3g FLOP/s (%s)" % (FORMULA, bw, peak, os.path.relpath(a.balance_bench, REPO)))
    rows = []
    for engine, d in sorted(runs(a.baselines)):
        s = read_json(os.path.join(d, "summary.json"))
        model = s["model"]["name"]
        if model not in SHAPES or model not in HEAD:
            continue
        gpu = (s.get("config", {}).get("hardware", {}).get("gpu", {}) or {})
        if gpu.get("sm_count"):  # a green context of fewer SMs: not this device's rates
            continue
        steps = read_jsonl(d, "steps.jsonl")
        dec = steady_steps(decode_steps(steps))
        if not dec:
            continue
        start = {x["step"]: x["start_ms"] for x in steps if "step" in x and "start_ms" in x}
        periods = [start[x["step"] + 1] - start[x["step"]] for x in dec if x.get("step") in start and x["step"] + 1 in start]
        L = s["model"]["layers"]
        b = dec[0]["decode_tokens"]
        ctx = statistics.fmean(x["total_context"] for x in dec) / b
        roof, nbytes, flops = roofline(model, L, b, ctx, bw, peak)
        phases = phase_roofline(model, L, b, ctx, bw, peak)
        call = statistics.median(x["step_ms"] for x in dec) / 1e3
        step = statistics.median(periods) / 1e3 if periods else call  # runs before start_ms: the call
        dev = [x["breakdown_ms"].get(DEVICE_TIME[engine]) for x in dec if DEVICE_TIME[engine] in x.get("breakdown_ms", {})]
        dev_s = statistics.median(dev) / 1e3 if dev else None
        rows.append({"engine": engine, "model": model, "layers": L, "batch": b, "steps": len(dec), "context": ctx,
                     "requested_batch": int(os.path.basename(d).rsplit("-b", 1)[1]), "bytes": nbytes, "flops": flops,
                     "roofline_ms": roof * 1e3, "bound": "memory" if nbytes / bw >= flops / peak else "compute",
                     "step_ms": call * 1e3, "period_ms": step * 1e3, "period_from": "start_ms" if periods else "step_ms",
                     "device_ms": dev_s * 1e3 if dev_s else None, "step_vs_roofline": step / roof,
                     "phase_roofline_ms": phases * 1e3, "step_vs_phase_roofline": step / phases,
                     "device_vs_roofline": dev_s / roof if dev_s else None, "dir": os.path.relpath(d, REPO)})
    if not rows:
        print("gpu_roofline: no gpu-only / paged-swap steady runs under %s" % " ".join(a.baselines), file=sys.stderr)
        return 1
    lines = ["# The GPU baselines' decode step against its roofline (issue 18; analysis/gpu_roofline.py)", "",
             "`%s`, with L the layers run, b the mean running batch, ctx the mean context (both over the steps at the run's steady batch: the batch that decoded the most tokens), w = fp16 bytes and p = "
             "parameters of a layer and of the LM head, kv = fp16 KV bytes per token and layer; BW = %.2f TB/s (HBM read) "
             "and PEAK = %.0f TFLOP/s (fp16 GEMM) measured on the same H200 (`%s`). The roofline is MODELLED; the steps "
             "are measured (median decode-only step period, one step's start to the next's; the step() call's own median "
             "beside it; device: the engine's CUDA-event time of the step, gpu-only `gpu_decode`, paged-swap `decode`). "
             "Target: step period <= 1.3x roofline at B = 64-1024." % (
                 FORMULA, bw / 1e12, peak / 1e12, os.path.relpath(a.balance_bench, REPO)), "",
             "| engine | model | layers | B asked | batch (steps) | ctx | GB read | GFLOP | roofline ms (bound) | step() ms | step period ms | x roofline | device ms | x roofline | phase roofline ms | period x phase roofline |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["model"], r["engine"], r["requested_batch"], r["layers"])):
        lines.append("| %s | %s | %d | %d | %d (%d) | %.0f | %.2f | %.0f | %.3f (%s) | %.3f | %.3f | %.2f | %s | %s | %.3f | %.2f |" % (
            r["engine"], r["model"], r["layers"], r["requested_batch"], r["batch"], r["steps"], r["context"], r["bytes"] / 1e9,
            r["flops"] / 1e9, r["roofline_ms"], r["bound"], r["step_ms"], r["period_ms"], r["step_vs_roofline"],
            "%.3f" % r["device_ms"] if r["device_ms"] else "—", "%.2f" % r["device_vs_roofline"] if r["device_vs_roofline"] else "—",
            r["phase_roofline_ms"], r["step_vs_phase_roofline"]))
    target = [r for r in rows if 64 <= r["requested_batch"] <= 1024]
    met = [r for r in target if r["step_vs_roofline"] <= 1.3]
    lines += ["", "Step period <= 1.3x roofline at B = 64-1024: %d of %d runs. The phase roofline (MODELLED) sums each phase's own "
              "max(bytes / BW, FLOPs / PEAK) for the weight GEMMs and the attention, which run one after the other: at "
              "B = 252 the GEMMs are compute-bound while the attention is memory-bound, which one max over the totals "
              "does not see." % (len(met), len(target))]
    slope = fig8_slope(a.paper, bw, peak)
    if slope:
        lines += ["", "Per layer at full depth (Fig. 8, `%s`): gpu-only's step = %.3f + %.4f * layers ms at B = %.0f, ctx %.0f; "
                  "one layer's roofline %.4f ms, so a layer runs at %.2fx its roofline and the fixed part a = %.3f ms "
                  "(LM head, sampling, launches; its own roofline, the LM head's read, is %.3f ms). The Fig. 8 runs are "
                  "older than this table's: analysis/kernel_profile.py shows where a 2-layer step's time goes now." % ((os.path.relpath(a.paper, REPO),) + slope)]
    write_report(a.out, "gpu_roofline", lines, {"formula": FORMULA, "bw": bw, "peak": peak, "rows": rows})
    return 0


def fig8_slope(paper, bw, peak):
    """(a, b, B, ctx, layer roofline ms, b / roofline, a, head roofline ms) from gpu-only's Fig. 8 sweep, or None."""
    try:
        import fig_paper
        _data, fits, _one = fig_paper.fig8_data(paper)
        runs = fig_paper.sweep_runs(paper, "fig8-llama-2-7b-gpu-only")
    except Exception:  # noqa: BLE001 (fig_paper.Skip or a missing sweep: the per-layer line is left out)
        return None
    if ("llama-2-7b", "gpu-only") not in fits:
        return None
    a0, b0, _r2 = fits[("llama-2-7b", "gpu-only")]
    r = next(iter(runs.values()))[0]
    dec = decode_steps(r["steps"])
    B = statistics.fmean(x["decode_tokens"] for x in dec)
    ctx = statistics.fmean(x["total_context"] for x in dec) / B
    m = SHAPES["llama-2-7b"]
    layer = max((layer_weight_bytes("llama-2-7b") + B * ctx * m["kv_tok_layer"]) / bw,
                (2 * B * m["layer_params"] + 4 * B * ctx * HEAD["llama-2-7b"][1]) / peak) * 1e3
    head = 2 * HEAD["llama-2-7b"][0] * HEAD["llama-2-7b"][1] / bw * 1e3
    return (a0, b0, B, ctx, layer, b0 / layer, a0, head)


if __name__ == "__main__":
    sys.exit(main())
