"""Fig. 15: where a FastDecode decode step goes: the mean decode step of each e2e run as bars (e2e.json), and,
when a run's trace.json is at hand (--trace FILE; with --paper ROOT the fig15-breakdown sweep's run; else
e2e/<run>/trace.json[.gz]), one decode iteration as a timeline beside them.

The timeline reads harness/run_recorders.cpp's Chrome trace: the "harness" track's "step N" events give the step
windows; a step is decode-only when its steps.jsonl line (next to the trace, if there) has no prompt tokens,
else when no "prefill" span overlaps it. The step drawn is the middle decode-only step of summary.json's
results.steady window when that is recorded, else of the run. Rows: the S-Part's spans split by name
("attention input" = S-Part up to q/k/v on the host, so the device->host copy is inside it today;
"output+MLP"), any track named for a copy or the wire (none are written today), each "rworker N" track (the
worker's own compute; placement approximate) and "wait" = the decode step's time on the S-worker not covered
by an S-Part / copy span (waiting on the R-workers and the wire)."""
import glob
import gzip
import json
import os
import re
import sys

import matplotlib.pyplot as plt

from fd_runs import decode_steps, jsonl_path, read_jsonl
from fig_common import Skip, add_caption, balance_of, e2e_machine, load_json, machine_of, save

COPY = re.compile(r"copy|d2h|h2d|device.?to.?host|wire|send|recv", re.I)
ROW_COLORS = {"S-Part: attention input": "tab:green", "S-Part: output+MLP": "darkgreen", "S-Part": "tab:green",
              "wait": "tab:red"}


def other_note(artifacts, name):
    """'other' per decode-only step from the run's steps.jsonl, if committed: its median and the last step's."""
    d = os.path.join(artifacts, "e2e", name)
    if not jsonl_path(d, "steps.jsonl"):
        return ""
    try:
        dec = decode_steps(read_jsonl(d, "steps.jsonl"))
        oth = sorted(x["step_ms"] - x["breakdown_ms"].get("s_compute", 0.0) - x["breakdown_ms"].get("r_wait", 0.0) for x in dec)
        last = dec[-1]["step_ms"] - dec[-1]["breakdown_ms"].get("s_compute", 0.0) - dec[-1]["breakdown_ms"].get("r_wait", 0.0)
    except (ValueError, KeyError, IndexError, TypeError):
        return ""
    return "\nother: median %.1f, last step %.0f ms" % (oth[len(oth) // 2], last)


# ------------------------------------------------------------------------------------------------
# the timeline of one decode iteration
# ------------------------------------------------------------------------------------------------

def read_trace(path):
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        doc = json.load(f)
    names, events = {}, []
    for e in doc.get("traceEvents", []):
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[e.get("tid")] = (e.get("args") or {}).get("name", str(e.get("tid")))
        elif e.get("ph") == "X":
            events.append(e)
    for e in events:
        e["track"] = names.get(e.get("tid"), "tid %s" % e.get("tid"))
    return doc, events


PAPER_SWEEP = "fig15-breakdown"  # experiments/paper/fig15-breakdown.sweep.json: the run whose trace.json is drawn


def find_trace(a, rows):
    """--trace; else, with --paper ROOT, ROOT/fig15-breakdown/<point>/rep<k>/trace.json[.gz] (required then:
    reproduce.sh ran that sweep for this figure); else e2e/<run>/trace.json[.gz] when committed; else None."""
    if getattr(a, "trace", None):
        if not os.path.isfile(a.trace):
            raise Skip("--trace %s not found" % a.trace)
        return a.trace
    if getattr(a, "paper", None):
        top = os.path.join(a.paper, PAPER_SWEEP)
        found = sorted(glob.glob(os.path.join(top, "*", "rep*", "trace.json")) + glob.glob(os.path.join(top, "*", "rep*", "trace.json.gz")))
        if not found:
            raise Skip("no trace.json under %s/<point>/rep<k>/ (scripts/reproduce.sh fig15 runs experiments/paper/%s.sweep.json)"
                       % (top, PAPER_SWEEP))
        return found[0]
    for r in rows:
        for n in ("trace.json", "trace.json.gz"):
            p = os.path.join(a.artifacts, "e2e", r["name"], n)
            if os.path.isfile(p):
                return p
    return None


def pick_step(events, run_dir):
    """(step index, start µs, end µs) of the decode iteration to draw, and why it was picked."""
    steps = {}
    for e in events:
        m = re.fullmatch(r"step (\d+)", e.get("name", ""))
        if e["track"] == "harness" and m:
            steps[int(m.group(1))] = (e["ts"], e["ts"] + e["dur"])
    if not steps:
        raise Skip("the trace has no 'harness' step events")
    if jsonl_path(run_dir, "steps.jsonl"):
        dec = [x["step"] for x in decode_steps(read_jsonl(run_dir, "steps.jsonl"))]
    else:
        pre = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "prefill"]
        dec = [k for k, (t0, t1) in steps.items() if not any(p0 < t1 and p1 > t0 for p0, p1 in pre)]
    dec = sorted(k for k in dec if k in steps)
    if not dec:
        raise Skip("the trace has no decode-only step")
    why = "middle decode-only step of the run"
    sp = os.path.join(run_dir, "summary.json")
    steady = ((json.load(open(sp)).get("results") or {}).get("steady") if os.path.isfile(sp) else None) or {}
    if "first_step" in steady and "last_step" in steady:
        inside = [k for k in dec if steady["first_step"] <= k <= steady["last_step"]]
        if inside:
            dec, why = inside, "middle decode-only step of the steady window (steps %d-%d)" % (steady["first_step"], steady["last_step"])
    k = dec[len(dec) // 2]
    return k, steps[k][0], steps[k][1], why


def merge(intervals):
    out = []
    for a0, a1 in sorted(intervals):
        if out and a0 <= out[-1][1]:
            out[-1][1] = max(out[-1][1], a1)
        else:
            out.append([a0, a1])
    return out


def timeline_rows(events, t0, t1):
    """{row name: [(start ms from the step's start, duration ms)]} of the spans inside [t0, t1] µs, and the
    S-worker's uncovered time as "wait"."""
    rows, covered, sworker = {}, [], []
    for e in events:
        s, d = e["ts"], e["dur"]
        if e["track"] == "harness" or s + d <= t0 or s >= t1:
            continue
        s0, s1 = max(s, t0), min(s + d, t1)
        name = e.get("name", "")
        if e["track"] == "s-worker":
            sworker.append((s0, s1))
            continue
        if e["track"] == "s-part":
            row = "S-Part: attention input" if "attention input" in name else "S-Part: output+MLP" if "output" in name else "S-Part"
            covered.append((s0, s1))
        elif COPY.search(e["track"]) or COPY.search(name):
            row = e["track"] if COPY.search(e["track"]) else "%s: %s" % (e["track"], name)
            covered.append((s0, s1))
        else:
            row = e["track"]
        rows.setdefault(row, []).append(((s0 - t0) / 1e3, (s1 - s0) / 1e3))
    wait = []
    for w0, w1 in merge(sworker or [(t0, t1)]):
        cur = w0
        for c0, c1 in merge(covered):
            if c1 <= cur or c0 >= w1:
                continue
            if c0 > cur:
                wait.append(((cur - t0) / 1e3, (c0 - cur) / 1e3))
            cur = max(cur, c1)
        if cur < w1:
            wait.append(((cur - t0) / 1e3, (w1 - cur) / 1e3))
    rows["wait"] = wait
    return rows


def row_order(name):
    if name.startswith("S-Part"):
        return (0, name)
    if COPY.search(name):
        return (1, name)
    if name.startswith("rworker"):
        m = re.search(r"(\d+)", name)
        return (2, "%08d" % int(m.group(1)) if m else name)
    return (3 if name != "wait" else 4, name)


def draw_timeline(ax, path):
    doc, events = read_trace(path)
    run_dir = os.path.dirname(path)
    k, t0, t1, why = pick_step(events, run_dir)
    rows = timeline_rows(events, t0, t1)
    names = sorted(rows, key=row_order)
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, n in enumerate(names):
        c = ROW_COLORS.get(n, "tab:purple" if n.startswith("rworker") else palette[i % len(palette)])
        for s, d in rows[n]:
            ax.barh(i, d, 0.6, left=s, color=c, edgecolor="black", linewidth=0.3)
        total = sum(d for _, d in rows[n])
        ax.annotate("%.2f ms" % total, (1.0, i), xycoords=("axes fraction", "data"), xytext=(3, 0),
                    textcoords="offset points", va="center", fontsize=7)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, (t1 - t0) / 1e3)
    ax.set_xlabel("ms from the start of step %d" % k)
    ax.grid(True, axis="x", alpha=0.3)
    summary = os.path.join(run_dir, "summary.json")
    s = json.load(open(summary)) if os.path.isfile(summary) else {}
    prov = s.get("provenance") or doc.get("otherData")
    bal = balance_of(((s.get("config") or {}).get("hardware") or {}).get("gpu")) if s else "balance not recorded"
    m = s.get("model") or {}
    ax.set_title("one decode iteration (step %d, %.1f ms; %s) of %s: measured, %s, %s%s" % (
        k, (t1 - t0) / 1e3, why, s.get("name", path), machine_of(prov) or "machine not recorded", bal,
        ", %s of %s layers" % (m["layers"], m.get("full_layers", "?")) if m.get("layers") else ""), fontsize=8.5)
    return k, rows


# ------------------------------------------------------------------------------------------------
# the figure
# ------------------------------------------------------------------------------------------------

def fig15(a, written):
    rows = [r for r in load_json(os.path.join(a.artifacts, "e2e.json")) if r.get("engine") == "fastdecode"]
    rows = [r for r in rows if r.get("breakdown_ms") and r.get("mean_step_ms")]
    if not rows:
        raise Skip("e2e.json has no FastDecode run with a step breakdown")
    trace = find_trace(a, rows)
    bars_h = 1.4 + 1.1 * len(rows)
    fig = plt.figure(figsize=(14, bars_h + (3.2 if trace else 0)))
    gs = fig.add_gridspec(2 if trace else 1, 2, width_ratios=[3, 2], height_ratios=[bars_h, 3.2] if trace else [1])
    ax1, ax2 = fig.add_subplot(gs[0, 0]), fig.add_subplot(gs[0, 1])
    h = 0.36
    labels = []
    for i, r in enumerate(rows):
        bd = r["breakdown_ms"]
        step = r["mean_step_ms"]
        s, rw, rc = bd.get("s_compute", 0.0), bd.get("r_wait", 0.0), bd.get("r_compute_max", 0.0)
        other = step - s - rw
        if other < 0:
            print("figures: %s: s_compute + r_wait exceeds the mean step by %.2f ms; 'other' drawn as 0"
                  % (r["name"], -other), file=sys.stderr)
            other = 0.0
        parts = ((s, "tab:green", "s_compute: S-Part on the GPU"),
                 (rw, "tab:red", "r_wait: S-worker waits for R-worker replies"),
                 (other, "0.7", "other = step − s_compute − r_wait (sampling, frees; per run: median and last step)"))
        for ax, scale in ((ax1, 1.0), (ax2, 100.0 / step)):
            left = 0.0
            for v, c, lab in parts:
                ax.barh(i - h / 2, v * scale, h, left=left, color=c, label=lab if i == 0 else None)
                left += v * scale
            ax.barh(i + h / 2, rc * scale, h, color="tab:purple", hatch="//", alpha=0.8,
                    label="r_compute_max: busiest R-worker's own compute (overlaps r_wait)" if i == 0 else None)
        ax1.annotate("step %.1f ms" % step, (step, i - h / 2), textcoords="offset points", xytext=(4, 0), va="center", fontsize=8)
        ax1.annotate("%.1f ms" % rc, (rc, i + h / 2), textcoords="offset points", xytext=(4, 0), va="center", fontsize=8)
        ax2.annotate("S %.0f%%" % (100 * s / step), (100 * s / step, i - h / 2), textcoords="offset points", xytext=(3, 0),
                     va="center", fontsize=7.5, color="white" if s / step > 0.08 else "black")
        ax2.annotate("R busy %.0f%%" % (100 * rc / step), (100 * rc / step, i + h / 2), textcoords="offset points",
                     xytext=(-3, 0), ha="right", va="center", fontsize=7.5, color="white")
        labels.append("%s (%s)\nB=%.0f, P=%s CPUs%s" % (r["name"], r.get("balance", "balance?"), r["mean_batch"],
                                                       r.get("rworker_cpus") or "?", other_note(a.artifacts, r["name"])))
    ax1.set_yticks(range(len(rows)))
    ax1.set_yticklabels(labels, fontsize=8)
    ax1.invert_yaxis()
    ax2.set_yticks(range(len(rows)))
    ax2.set_yticklabels([])
    ax2.invert_yaxis()
    layers = sorted({r.get("layers") for r in rows if r.get("layers")})
    ax1.set_xlabel("mean decode step (ms, %s layers)" % "/".join(map(str, layers or ["?"])))
    ax1.set_xlim(right=max(r["mean_step_ms"] for r in rows) * 1.2)
    ax2.set_xlabel("share of the mean decode step (%)")
    ax2.set_xlim(0, 105)
    for ax in (ax1, ax2):
        ax.grid(True, axis="x", alpha=0.3)
    ax1.set_title("measured on %s; absolute (upper bar: step = s_compute + r_wait + other; lower: busiest R-worker)"
                  % e2e_machine(a.artifacts, rows), fontsize=8.5)
    ax2.set_title("as a share of the step", fontsize=9)
    handles, labs = ax1.get_legend_handles_labels()
    fig.legend(handles, labs, loc="upper center", ncol=2, fontsize=8, bbox_to_anchor=(0.5, 1 - 0.45 / fig.get_figheight()))
    tl = "no trace.json given or committed with the e2e runs: no timeline (pass --trace RUN/trace.json)"
    if trace:
        k, _ = draw_timeline(fig.add_subplot(gs[1, :]), trace)
        tl = "timeline: step %d of %s (tracks as harness/runner.cpp writes them; 'wait' = S-worker time outside S-Part spans)" % (k, trace)
    fig.suptitle("Fig. 15: where a FastDecode decode step goes (mean over decode-only steps)", fontsize=12)
    add_caption(fig, "Machine: %s. Measured: numbers from e2e.json (breakdown_ms per step averaged by analysis/e2e_report.py). "
                "%s layers run; 2 mini-batches pipelined, so r_compute_max can exceed r_wait. 'other' is almost all in each run's "
                "last decode step (read from e2e/<run>/steps.jsonl). %s."
                % (e2e_machine(a.artifacts, rows), "/".join(map(str, layers or ["?"])), tl))
    top = 1 - 1.05 / fig.get_figheight()
    fig.tight_layout(rect=(0, 0.5 / fig.get_figheight(), 1, top))
    save(fig, a.out, "fig15_step_breakdown.png", written, a.formats)
