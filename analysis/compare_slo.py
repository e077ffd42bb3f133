"""The SLO side of analysis/compare.py: limits parsed as fd-bench's --slo takes them, each run's requests judged after the
fact with harness/step_stats.cpp slo_stats' rule, and throughput at an SLO over a load axis (its table and figure).
Used by compare.py (--slo, --x, --attainment, --plot-slo); docs/EXPERIMENTS.md, "Goodput".
"""
from __future__ import annotations

import json
import math
import os
import re
import sys

from fd_runs import jsonl_path, read_jsonl


class CompareError(Exception):
    pass


def spaced(text):
    # 12 345 rather than 12345 for the large rates
    head, _, tail = text.partition(".")
    if len(head) > 4 and head.lstrip("-").isdigit():
        head = format(int(head), ",").replace(",", " ")
    return head + ("." + tail if tail else "")


def cell(v, fmt):
    if v is None:
        return "-"
    s = spaced(fmt % v["median"])
    if v["n"] > 1:
        s += " (%s–%s)" % (spaced(fmt % v["min"]), spaced(fmt % v["max"]))
    return s


SLO_KEYS = (("ttft", "ttft_ms"), ("tpot", "tpot_ms"), ("e2e", "e2e_ms"))
_NUMBER = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", re.ASCII)  # what strtod reads, less hex, inf, nan


def parse_slo(spec):
    """--slo "ttft:MS,tpot:MS,e2e:MS" (any of them, as fd-bench run's and fd-sim's --slo: harness/experiment.cpp
    parse_slo_flag) -> {"ttft_ms", "tpot_ms", "e2e_ms"} (None: no limit). CompareError naming the bad part, in
    parse_slo_flag's words. Unlike it, an empty spec (no limit at all) and a limit that is not finite are errors."""
    items = spec.split(",")
    if len(items) > 1 and items[-1] == "":  # "ttft:5," reads as "ttft:5", as std::getline splits it
        items.pop()
    limits = {k: None for _, k in SLO_KEYS}
    for item in items:
        k, colon, v = item.partition(":")
        key = dict(SLO_KEYS).get(k)
        if not colon or key is None:
            raise CompareError("--slo %s: expected ttft:MS, tpot:MS and / or e2e:MS separated by commas, got '%s'" % (spec, item))
        if not _NUMBER.fullmatch(v) or not (0 < float(v) < math.inf):
            raise CompareError("--slo %s: '%s' is not a positive number of ms" % (spec, v))
        limits[key] = float(v)
    return limits


def slo_label(limits):
    return ", ".join("%s ≤ %g ms" % (n, limits[k]) for n, k in SLO_KEYS if limits.get(k) is not None)


def judge_slo(requests, limits, duration_s, where="requests.jsonl"):
    """results.slo of a run recomputed from its requests.jsonl, as harness/step_stats.cpp slo_stats computes it: a
    request is good when every limit given holds (TTFT <= ttft_ms, TPOT = (e2e - TTFT) / (output tokens - 1), 0 for
    a one-token request, <= tpot_ms, e2e <= e2e_ms); attainment = good / all requests; goodput = good requests (and
    their output tokens) / duration_s."""
    good = good_tokens = 0
    for r in requests:
        try:
            ttft, e2e, n = float(r["ttft_ms"]), float(r["e2e_ms"]), int(r["output_len"])
        except (KeyError, TypeError, ValueError) as e:
            raise CompareError("%s: request %s: no usable %s (a request needs ttft_ms, e2e_ms and output_len)"
                               % (where, r.get("id", "?"), e))
        tpot = (e2e - ttft) / (n - 1) if n > 1 else 0.0
        if ((limits["ttft_ms"] is None or ttft <= limits["ttft_ms"])
                and (limits["tpot_ms"] is None or tpot <= limits["tpot_ms"])
                and (limits["e2e_ms"] is None or e2e <= limits["e2e_ms"])):
            good += 1
            good_tokens += n
    timed = bool(duration_s) and duration_s > 0
    return {"limits": dict(limits), "requests": len(requests), "good_requests": good,
            "attainment": good / len(requests) if requests else None,
            "goodput_requests_per_s": good / duration_s if timed else None,
            "goodput_tokens_per_s": good_tokens / duration_s if timed else None}


def run_slo(d, results, limits):
    """The run's results.slo against LIMITS: recomputed from requests.jsonl[.gz]; a run without one keeps its own
    results.slo when it was judged against the same limits (fd-sim writes none), else None. A recorded results.slo
    with the same limits that disagrees with the recomputation is reported on stderr."""
    rec = results.get("slo") if isinstance(results.get("slo"), dict) else None
    same = rec is not None and rec.get("limits") == limits
    if not jsonl_path(d, "requests.jsonl"):
        if same:
            return rec
        print("compare: %s: no requests.jsonl, so not judged against --slo %s" % (d, slo_label(limits)), file=sys.stderr)
        return None
    got = judge_slo(read_jsonl(d, "requests.jsonl"), limits, results.get("duration_s"), os.path.join(d, "requests.jsonl"))
    if same:
        diff = [k for k in ("requests", "good_requests", "attainment", "goodput_requests_per_s", "goodput_tokens_per_s")
                if rec.get(k) != got[k]]
        if diff:
            print("compare: %s: results.slo and requests.jsonl disagree on %s (summary %s, recomputed %s)"
                  % (d, ", ".join(diff), [rec.get(k) for k in diff], [got[k] for k in diff]), file=sys.stderr)
    return got


def config_value(cfg, key):
    """(value, True) of dotted KEY in a resolved config, else (None, False)."""
    cur = cfg
    for part in key.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None, False
        cur = cur[part]
    return cur, True


def load_axis(row, x):
    """(axis label, the row's load value, the sweep axis it is or None). X: --x, a sweep axis's name (or key) or a
    resolved-config key (summary.json "config", e.g. workload.rate, schedule.batch); None: the sweep's one axis."""
    sw = row["_sweep"]
    axis = None
    if sw:
        if x is None:
            if len(sw["axes"]) != 1:
                raise CompareError("sweep %s varies %d axes (%s): name the load axis with --x NAME or --x KEY"
                                   % (sw["dir"], len(sw["axes"]), ", ".join("%s: %s" % (a["name"], "+".join(a["keys"])) for a in sw["axes"])))
            axis = sw["axes"][0]
        else:
            axis = next((a for a in sw["axes"] if x == a["name"] or x in a["keys"]), None)
    elif x is None:
        raise CompareError("%s is not a point of a sweep: name the load axis with --x KEY (a key of its resolved config, "
                           "e.g. workload.rate or schedule.batch)" % row["name"])
    if axis is None:
        key = label = x
    else:
        if x in axis["keys"]:
            key = x
        elif len(axis["keys"]) == 1:
            key = axis["keys"][0]
        else:
            raise CompareError("sweep %s: axis %s varies %s together: name one of them with --x KEY"
                               % (sw["dir"], axis["name"], ", ".join(axis["keys"])))
        label = key if axis["name"] == key else "%s (%s)" % (axis["name"], key)
    short = key if axis is None else axis["name"]
    v, found = config_value(row["_config"], key)
    if not found and axis is not None and len(axis["keys"]) == 1:
        v, found = sw["values"].get(axis["name"]), axis["name"] in sw["values"]
    if not found:
        raise CompareError("%s: its resolved config (summary.json \"config\") has no %s" % (row["name"], key))
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise CompareError("%s: %s = %s is not a number (the load axis is numeric: a request rate, a batch size, ...)"
                           % (row["name"], key, json.dumps(v)))
    return label, short, float(v), axis


def value_label(axis, v):
    if axis.get("labels") and v in axis["values"]:
        return str(axis["labels"][axis["values"].index(v)])
    text = v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
    return text if len(text) <= 32 else text[:29] + "..."


def series_of(row, axis):
    """(key, label) of the row's series: its config name and engine, and for a sweep point the values of the sweep's
    other axes (e.g. kv=int4), so that each engine or configuration is one curve over the load axis."""
    name, eng = row["_run_name"], row["engine"]
    label = name if eng in name else "%s (%s)" % (name, eng)
    sw = row["_sweep"]
    key = [sw["dir"] if sw else None, name, eng]
    if sw:
        parts = [(a["name"], value_label(a, sw["values"].get(a["name"]))) for a in sw["axes"] if a is not axis]
        parts = ["%s=%s" % (n, v) for n, v in parts if v != eng]  # an axis of engines: the engine is in the label already
        key += parts
        label = " ".join([label] + ([", ".join(parts)] if parts else []))
    return tuple(key), label


def common_limits(rows):
    """The limits every run's results.slo was judged against, when they all have the same non-null ones; else None."""
    lims = [json.dumps(x.get("limits"), sort_keys=True) if x else "null" for r in rows for x in r["slo"]]
    return json.loads(lims[0]) if lims and len(set(lims)) == 1 else None


def slo_section(rows, limits, x, target):
    """Throughput at the SLO per series: its points (load value, whole-run tok/s, goodput tok/s, attainment; medians
    over repeats, min-max kept) in load order, and the point of highest whole-run tok/s among those whose attainment
    (median over repeats) is >= target (None when no point meets it)."""
    groups, labels, axis_labels, short_labels = {}, {}, [], []
    for r in rows:
        label, short, xv, axis = load_axis(r, x)
        if label not in axis_labels:
            axis_labels.append(label)
        if short not in short_labels:
            short_labels.append(short)
        key, slabel = series_of(r, axis)
        labels[key] = slabel
        m = r["metrics"]
        groups.setdefault(key, []).append({"row": r["name"], "x": xv, "throughput_tps": m["run_tps"], "goodput_tps": m["goodput_tps"],
                                           "attainment": m["slo_attainment"], "repeats": r["repeats"], "dirs": r["dirs"]})
    dup = {l for l in labels.values() if list(labels.values()).count(l) > 1}
    for key in labels:  # two sweeps (or folders) with the same config names: told apart by folder
        if labels[key] in dup:
            labels[key] += " [%s]" % os.path.relpath(key[0] or os.path.dirname(groups[key][0]["dirs"][0]))
    series = []
    for key, pts in groups.items():
        pts.sort(key=lambda p: p["x"])
        xs = [p["x"] for p in pts]
        for v in sorted({v for v in xs if xs.count(v) > 1}):
            print("compare: series %s has %d points at %s = %g (%s); --group-by-config makes repeats one point"
                  % (labels[key], xs.count(v), " / ".join(axis_labels), v, ", ".join(p["row"] for p in pts if p["x"] == v)), file=sys.stderr)
        for p in pts:
            att = (p["attainment"] or {}).get("median")
            p["meets"] = att is not None and att >= target
        ok = [p for p in pts if p["meets"] and p["throughput_tps"] is not None]
        best = max(ok, key=lambda p: (p["throughput_tps"]["median"], -p["x"])) if ok else None
        judged = [p for p in pts if p["attainment"] is not None]
        top = max(judged, key=lambda p: (p["attainment"]["median"], -p["x"])) if judged else None
        series.append({"label": labels[key], "points": pts, "throughput_at_slo": best,
                       "best_attainment": top and {"row": top["row"], "x": top["x"], "attainment": top["attainment"]["median"]}})
    return {"limits": limits, "attainment_target": target, "x": " / ".join(axis_labels), "x_name": " / ".join(short_labels),
            "series": series}


def slo_markdown(sec):
    lines = ["", "Throughput at SLO (%s; attainment target %g; load axis %s): per series, the highest whole-run tok/s among "
             "its points whose SLO attainment (good / all requests, median over repeats) is at least the target; goodput: the "
             "good requests' output tokens / duration (docs/EXPERIMENTS.md, \"Goodput\")." % (slo_label(sec["limits"]), sec["attainment_target"], sec["x"]),
             "", "| series | points | throughput at SLO (whole-run tok/s) | at point | %s | goodput tok/s there | SLO attainment there |" % sec["x"],
             "|---|---|---|---|---|---|---|"]
    for s in sec["series"]:
        b = s["throughput_at_slo"]
        if b:
            lines.append("| %s | %d | %s | %s | %g | %s | %s |" % (s["label"], len(s["points"]), cell(b["throughput_tps"], "%.0f"), b["row"],
                                                              b["x"], cell(b["goodput_tps"], "%.0f"), cell(b["attainment"], "%.3f")))
        else:
            t = s["best_attainment"]
            why = ("none meets it (best attainment %.3f, at %s = %g)" % (t["attainment"], sec["x"], t["x"]) if t
                   else "none judged (no requests.jsonl, no results.slo)")
            lines.append("| %s | %d | %s | - | - | - | - |" % (s["label"], len(s["points"]), why))
    return "\n".join(lines) + "\n"


def plot_slo(sec, rows, path):
    """Draws slo_figure into PATH (the format from its extension)."""
    fig = slo_figure(sec, rows)
    import matplotlib.pyplot as plt  # after slo_figure chose the Agg backend
    fig.savefig(path, dpi=120)
    plt.close(fig)


def slo_figure(sec, rows):
    """The throughput-at-an-SLO figure: goodput and throughput (tok/s) vs the load axis (the throughput at SLO starred),
    and SLO attainment vs the load axis with the target; one colour per series; the legend and a caption below the
    panels, in space of their own."""
    import textwrap

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedFormatter, FixedLocator, NullLocator

    from fig_common import machine_of

    target, series = sec["attainment_target"], sec["series"]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    xs_all = sorted({p["x"] for s in series for p in s["points"]})
    log_x = xs_all and xs_all[0] > 0 and xs_all[-1] / xs_all[0] >= 8

    def err(vals):  # median, and min-max as error bars when a point has repeats
        med = [v["median"] if v else float("nan") for v in vals]
        lo = [v["median"] - v["min"] if v else 0.0 for v in vals]
        hi = [v["max"] - v["median"] if v else 0.0 for v in vals]
        return med, (lo, hi) if any(lo) or any(hi) else None

    handles = []
    for i, s in enumerate(series):
        c, b = colors[i % len(colors)], s["throughput_at_slo"]
        handles.append(Line2D([], [], color=c, marker="o", label="%s: %s" % (s["label"], (
            "throughput at SLO %s tok/s (%s = %g)" % (spaced("%.0f" % b["throughput_tps"]["median"]), sec["x_name"], b["x"]) if b
            else "no point meets the target"))))
    styles = [Line2D([], [], color="0.35", ls="-", marker="o", label="goodput (good requests)"),
              Line2D([], [], color="0.35", ls="--", marker="o", mfc="white", label="throughput (all requests)"),
              Line2D([], [], color="0.35", ls=":", label="attainment target %g" % target),
              Line2D([], [], ls="", marker="*", ms=13, color="0.6", mec="black", label="throughput at SLO")]

    machines = sorted({m for r in rows for m in [machine_of(r["_provenance"])] if m})
    reduced = sorted({"%s of %s" % (r["layers"], r["full_layers"]) for r in rows
                      if r["layers"] and r["full_layers"] and int(r["layers"]) < int(r["full_layers"])})
    where = sorted({os.path.relpath(r["_sweep"]["dir"] if r["_sweep"] else os.path.dirname(r["dirs"][0])) for r in rows})
    caption = ("Measured (fd-bench run folders; analysis/compare.py). Machine: %s. From: %s. A request is good when every limit "
               "holds (TPOT = (e2e - TTFT) / (output tokens - 1)); goodput: the good requests' output tokens / duration; "
               "throughput: all requests' output tokens / duration; throughput at SLO: a series' highest throughput whose "
               "attainment is at least the target. Points: medians over repeats, bars min-max%s."
               % ("; ".join(machines) or "not recorded", ", ".join(where),
                  "; rates are those of the model as run (%s layers), not full-depth equivalents" % ", ".join(reduced) if reduced else ""))
    cap_lines = textwrap.wrap(caption, 190)
    ncol = 1 if len(handles) <= 3 else 2
    leg_rows = -(-len(handles) // ncol) + 1  # the series, then one row of line styles
    # Heights in inches: title, panels, tick labels + x label, legends, caption.
    top_in, ax_in, xlab_in, leg_in, cap_in = 0.75, 3.6, 0.65, 0.21 * leg_rows + 0.2, 0.15 * len(cap_lines) + 0.15
    height = top_in + ax_in + xlab_in + leg_in + cap_in
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, height))
    fig.subplots_adjust(left=0.07, right=0.98, wspace=0.22, top=1 - top_in / height, bottom=(xlab_in + leg_in + cap_in) / height)
    for i, s in enumerate(series):
        c, pts = colors[i % len(colors)], s["points"]
        xs = [p["x"] for p in pts]
        tp, gp, at = (err([p[k] for p in pts]) for k in ("throughput_tps", "goodput_tps", "attainment"))
        a1.errorbar(xs, tp[0], yerr=tp[1], color=c, ls="--", marker="o", mfc="white", capsize=3)
        a1.errorbar(xs, gp[0], yerr=gp[1], color=c, ls="-", marker="o", capsize=3)
        a2.errorbar(xs, at[0], yerr=at[1], color=c, ls="-", marker="o", capsize=3)
        b = s["throughput_at_slo"]
        if b:
            a1.plot([b["x"]], [b["throughput_tps"]["median"]], ls="", marker="*", ms=16, color=c, mec="black", zorder=5)
    a2.axhline(target, color="0.35", ls=":", lw=1.3)
    for ax in (a1, a2):
        if log_x:
            ax.set_xscale("log")
            if len(xs_all) <= 12:  # a tick at every load value measured, written plainly (more would crowd)
                ax.xaxis.set_major_locator(FixedLocator(xs_all))
                ax.xaxis.set_major_formatter(FixedFormatter(["%g" % v for v in xs_all]))
                ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel(sec["x"] + (", log scale" if log_x else ""))
        ax.grid(alpha=0.3)
    a1.set_ylim(bottom=0)
    a1.set_ylabel("output tokens/s")
    a1.set_title("goodput and throughput vs load", fontsize=10)
    a2.set_ylim(-0.02, 1.05)
    a2.set_ylabel("SLO attainment (good / all requests)")
    a2.set_title("SLO attainment vs load", fontsize=10)
    fig.suptitle("Throughput at an SLO, measured: %s; attainment target %g" % (slo_label(sec["limits"]), target), fontsize=11)
    fig.legend(handles=handles, loc="upper center", ncol=ncol, fontsize=8, frameon=False, bbox_to_anchor=(0.5, (leg_in + cap_in) / height))
    fig.legend(handles=styles, loc="lower center", ncol=len(styles), fontsize=8, frameon=False, bbox_to_anchor=(0.5, cap_in / height))
    fig.text(0.01, 0.1 / height, "\n".join(cap_lines), fontsize=7.5, ha="left", va="bottom", color="0.25")
    return fig
