#!/usr/bin/env python3
"""The cost of a shaped link (hardware.network) for a FastDecode run: predicted before the runs, compared after.

fd-bench's performance model (fd-bench predict, fastdecode/sched/perf_model.h) has no link term, so the prediction is
made here from the config alone: the bytes one decode step puts on each R-worker's link (the ATTEND requests and their
replies, laid out as docs/RWORKER.md's wire protocol says, plus ZMTP framing and TCP/IP/Ethernet headers), divided by
the link's rate.

  predict  --config CFG --sweep SPEC [--pilot SUMMARY] --out predictions.json
  compare  --predictions predictions.json --sweep-dir DIR --out compare.json   (prints the table)

The model of a step behind a link (what tc tbf, the emulation's shaper, does): tbf passes bursts up to its bucket
(64 KiB, or 1 ms of the rate when larger) at once and holds the average to the rate, so in steady decoding a step takes
  step(link) = max(step(loopback), fwd / rate, rev / rate)
where fwd and rev are the bytes of one step on the busiest worker's link in each direction (each worker has its own
link, each direction its own bucket). Also written, for reference, is what a wire that serialises every message
without any overlap would add: (fwd + rev) / rate per step (an upper bound on a real link of that rate, delay 0).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
from pathlib import Path

PRESETS = {"loopback": 0.0, "10gbe": 10.0, "25gbe": 25.0, "100gbe": 100.0, "ib-hdr": 200.0}
HEADER = 64  # the protocol header frame (docs/RWORKER.md)
MSS = 1448  # TCP payload per segment on a 1500-byte MTU veth with timestamps
SEG_OVERHEAD = 66  # Ethernet 14 + IPv4 20 + TCP 20 + timestamps 12: what tbf counts per segment besides the payload
ACK = 66  # a bare ACK on the other direction, one per two segments (delayed ACKs)


def zmtp_frame(n: int) -> int:
    return n + (2 if n <= 255 else 9)  # flags + size (short or long form)


def segments(payload: int) -> int:
    return max(1, math.ceil(payload / MSS))


def rate_gbit(value) -> float:
    if isinstance(value, str):
        return PRESETS[value]
    return float(value["rate_gbit"])


def step_bytes(cfg_path: Path) -> dict:
    cfg = json.loads(cfg_path.read_text())
    model = json.loads((cfg_path.parent / cfg["model"]["config"]).read_text())
    eng = cfg["engine"]
    hq, hkv = model["num_attention_heads"], model["num_key_value_heads"]
    d = model["hidden_size"] // hq
    layers = cfg.get("model", {}).get("layers", model["num_hidden_layers"])
    es = {"fp32": 4, "fp16": 2}[eng.get("wire_dtype", "fp16" if eng.get("backend") == "cuda" else "fp32")]
    batch = cfg["workload"]["requests"]  # all arrive at once; steady decoding holds every one
    workers, mbs = eng["rworkers"]["spawn"], eng.get("mini_batches", 2)
    n = batch / mbs / workers  # sequences of one mini-batch on one worker (placement assumed even)
    frames_req = [HEADER, 8 * n, n * hq * d * es, n * hkv * d * es, n * hkv * d * es]  # header, ids, q, k, v
    frames_rep = [HEADER, n * hq * d * es]  # header, o
    req = sum(zmtp_frame(int(f)) for f in frames_req)
    rep = sum(zmtp_frame(int(f)) for f in frames_rep)
    msgs = layers * mbs  # ATTENDs per step to one worker
    seg_req, seg_rep = segments(req), segments(rep)
    fwd = msgs * (req + seg_req * SEG_OVERHEAD + math.ceil(seg_rep / 2) * ACK)
    rev = msgs * (rep + seg_rep * SEG_OVERHEAD + math.ceil(seg_req / 2) * ACK)
    return {"model": model.get("_name", cfg["model"]["config"]), "layers": layers, "batch": batch, "workers": workers,
            "mini_batches": mbs, "wire_bytes_per_element": es, "heads": hq, "kv_heads": hkv, "head_dim": d,
            "sequences_per_worker_per_mini_batch": n, "attend_request_bytes": req, "attend_reply_bytes": rep,
            "messages_per_step_per_worker": msgs, "fwd_bytes_per_step_busiest_link": fwd,
            "rev_bytes_per_step_busiest_link": rev}


def predict(a) -> None:
    spec = json.loads(Path(a.sweep).read_text())
    cfg_path = (Path(a.sweep).parent / spec["base"]).resolve() if not a.config else Path(a.config).resolve()
    b = step_bytes(cfg_path)
    axis = spec["axes"][0]
    labels = axis.get("labels") or [json.dumps(v) for v in axis["values"]]
    pilot = None
    if a.pilot:
        s = json.loads(Path(a.pilot).read_text())
        pilot = {"file": a.pilot, "steady_step_ms_mean": s["results"]["steady"]["step_ms"]["mean"],
                 "steady_tokens_per_s": s["results"]["steady"]["tokens_per_s"],
                 "network": s["config"]["hardware"].get("network")}
    links = []
    for label, v in zip(labels, axis["values"]):
        r = rate_gbit(v)
        row = {"label": label, "value": v, "rate_gbit": r}
        if r > 0:
            bps = r * 1e9 / 8
            row["link_bound_step_ms"] = 1e3 * max(b["fwd_bytes_per_step_busiest_link"], b["rev_bytes_per_step_busiest_link"]) / bps
            row["serial_wire_ms_per_step"] = 1e3 * (b["fwd_bytes_per_step_busiest_link"] + b["rev_bytes_per_step_busiest_link"]) / bps
        else:
            row["link_bound_step_ms"] = 0.0
            row["serial_wire_ms_per_step"] = 0.0
        if pilot:
            lo = pilot["steady_step_ms_mean"]
            step = max(lo, row["link_bound_step_ms"])
            row["predicted_steady_step_ms"] = step
            row["predicted_steady_tokens_per_s"] = b["batch"] / step * 1e3
            row["predicted_cost"] = 1 - lo / step  # the share of loopback throughput the link takes
            row["serial_upper_step_ms"] = lo + row["serial_wire_ms_per_step"]
        links.append(row)
    out = {"written_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "command": " ".join(sys.argv), "config": str(cfg_path), "sweep": a.sweep, "bytes": b, "pilot_loopback": pilot,
           "model": "step(link) = max(step(loopback), fwd/rate, rev/rate): tc tbf holds the average rate, its bucket "
                    "(64 KiB or 1 ms of the rate) passes each step's bursts; fwd/rev = bytes of one steady decode step on "
                    "the busiest worker's link (ATTEND requests / replies, ZMTP frames, 66 header bytes a 1448-byte TCP "
                    "segment, an ACK per two segments the other way), sequences assumed evenly placed",
           "criterion": a.criterion, "links": links}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


def compare(a) -> None:
    pred = json.loads(Path(a.predictions).read_text())
    idx = json.loads((Path(a.sweep_dir) / "index.json").read_text())
    by_label = {p["label"]: p for p in pred["links"]}
    measured = {}
    for point in idx["points"]:
        label = point["name"].split("link-", 1)[1]
        steps, toks = [], []
        for rep in sorted((Path(a.sweep_dir) / point["name"]).glob("rep*")):
            s = json.loads((rep / "summary.json").read_text())
            assert s["status"] == "ok", (rep, s["status"])
            steps.append(s["results"]["steady"]["step_ms"]["mean"])
            toks.append(s["results"]["steady"]["tokens_per_s"])
        measured[label] = {"steady_step_ms": steps, "steady_tokens_per_s": toks,
                           "median_step_ms": statistics.median(steps), "median_tokens_per_s": statistics.median(toks)}
    lo = measured["loopback"]["median_step_ms"]
    rows, tol = [], pred.get("tolerance", a.tolerance)
    print(f"{'link':>9} {'Gbit/s':>7} {'pred step':>9} {'meas step (min-max)':>24} {'meas/pred':>9} "
          f"{'pred cost':>9} {'meas cost':>9} {'serial ub':>9}  ok")
    for label, m in measured.items():
        p = by_label[label]
        pred_step = max(pred["pilot_loopback"]["steady_step_ms_mean"], p["link_bound_step_ms"])
        # the same model with this sweep's own loopback median in place of the pilot's
        pred_step_same = max(lo, p["link_bound_step_ms"])
        ratio = m["median_step_ms"] / pred_step
        cost_meas = 1 - lo / m["median_step_ms"]
        cost_pred = 1 - lo / pred_step_same
        ok = abs(ratio - 1) <= tol
        rows.append({"label": label, "rate_gbit": p["rate_gbit"], "predicted_step_ms": pred_step,
                     "predicted_step_ms_with_sweep_loopback": pred_step_same, "measured": m,
                     "measured_over_predicted": ratio, "predicted_cost_vs_sweep_loopback": cost_pred,
                     "measured_cost_vs_sweep_loopback": cost_meas,
                     "serial_upper_step_ms": lo + p["serial_wire_ms_per_step"], "within_tolerance": ok})
        print(f"{label:>9} {p['rate_gbit']:>7g} {pred_step:>9.2f} {m['median_step_ms']:>9.2f} "
              f"({min(m['steady_step_ms']):.2f}-{max(m['steady_step_ms']):.2f}) {ratio:>9.2f} {cost_pred:>9.1%} "
              f"{cost_meas:>9.1%} {lo + p['serial_wire_ms_per_step']:>9.2f}  {'yes' if ok else 'NO'}")
    out = {"predictions": a.predictions, "sweep_dir": a.sweep_dir, "tolerance": tol, "rows": rows,
           "within_tolerance": sum(r["within_tolerance"] for r in rows), "points": len(rows)}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"{out['within_tolerance']} of {out['points']} points within ±{tol:.0%} of the prediction")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("predict")
    p.add_argument("--sweep", required=True)
    p.add_argument("--config")
    p.add_argument("--pilot", help="summary.json of a loopback run made before (its steady step is step(loopback))")
    p.add_argument("--criterion", default="")
    p.add_argument("--out", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--predictions", required=True)
    c.add_argument("--sweep-dir", required=True)
    c.add_argument("--tolerance", type=float, default=0.2)
    c.add_argument("--out", required=True)
    a = ap.parse_args()
    predict(a) if a.cmd == "predict" else compare(a)


if __name__ == "__main__":
    main()
