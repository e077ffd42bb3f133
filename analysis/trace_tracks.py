#!/usr/bin/env python3
"""The tracks of FastDecode's trace.json (issue 18): one per CUDA stream of the S-Part and one per R-worker.
For each run (a sweep folder with index.json, or run folders): every track with its spans' count and total time;
for each `gpu stream N` track the mini-batches whose stages it holds (span names `L<layer> mb<k> <stage>` or
`mb<k> <stage>`), its stages, and the spans that overlap inside it (a stream runs its work in order: any is an error
in the placement); the time two streams were busy at once; and the verdict: built when at least two stream tracks
each hold one mini-batch only, none has overlapping spans, and an R-worker track exists.
Writes OUT/trace_tracks.md, .json.

usage: analysis/trace_tracks.py DIR... [--out DIR]   (DIR: a sweep folder with index.json, or a run folder with
trace.json or trace.json.gz)
"""
import argparse
import re
import sys
from pathlib import Path

from fd_runs import read_json, run_dirs, write_report

SPAN = re.compile(r"^(?:L(\d+) )?mb(\d+) (.+)$")
TOLERANCE_US = 1.0  # span times are rounded to float milliseconds on the device: 1 us of slack


def tracks_of(trace):
    """{track name: [(ts_us, dur_us, span name)]} from a Chrome trace's thread names and complete events."""
    names, spans = {}, {}
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e.get("pid"), e.get("tid"))] = e["args"]["name"]
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X":
            t = names.get((e.get("pid"), e.get("tid")), "tid %s" % e.get("tid"))
            spans.setdefault(t, []).append((float(e["ts"]), float(e["dur"]), e["name"]))
    return spans


def overlaps(spans):
    """Spans that start before the one before them (by start) has ended, beyond the tolerance."""
    s = sorted(spans)
    return sum(1 for a, b in zip(s, s[1:]) if b[0] < a[0] + a[1] - TOLERANCE_US)


def union_us(intervals):
    total, end = 0.0, None
    start = None
    for a, b in sorted(intervals):
        if end is None or a > end:
            if end is not None:
                total += end - start
            start, end = a, b
        else:
            end = max(end, b)
    return total + (end - start if end is not None else 0.0)


def analyse(spans):
    streams = {t: v for t, v in spans.items() if t.startswith("gpu stream")}
    rows = {}
    for t, v in sorted(streams.items()):
        mbs, stages, unnamed = set(), set(), 0
        for _, _, name in v:
            m = SPAN.match(name)
            if not m:
                unnamed += 1
                continue
            mbs.add(int(m.group(2)))
            stages.add(m.group(3))
        rows[t] = {"spans": len(v), "busy_ms": sum(d for _, d, _ in v) / 1e3, "mini_batches": sorted(mbs),
                   "stages": sorted(stages), "overlapping_spans": overlaps(v), "unparsed_names": unnamed}
    # Time two or more streams were busy at once: the sum of each stream's busy time less the union's.
    per = [union_us([(a, a + d) for a, d, _ in v]) for v in streams.values()]
    together = sum(per) - union_us([(a, a + d) for v in streams.values() for a, d, _ in v])
    workers = sorted(t for t in spans if t.startswith("rworker"))
    built = (len(rows) >= 2 and all(len(r["mini_batches"]) == 1 and r["overlapping_spans"] == 0 and r["unparsed_names"] == 0
                                    for r in rows.values()) and bool(workers))
    return {"tracks": {t: {"spans": len(v), "total_ms": sum(d for _, d, _ in v) / 1e3} for t, v in sorted(spans.items())},
            "streams": rows, "streams_busy_together_ms": together / 1e3, "rworker_tracks": workers, "built": built}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", type=Path, nargs="+")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    runs = []
    for root in a.dirs:
        for name, d in run_dirs(root):
            trace = read_json(Path(d) / "trace.json")
            if trace is None:
                continue
            r = analyse(tracks_of(trace))
            r.update({"point": name, "dir": str(d)})
            runs.append(r)
    if not runs:
        print("trace_tracks: no trace.json under %s" % " ".join(map(str, a.dirs)), file=sys.stderr)
        return 1
    lines = ["# trace.json's tracks: one per CUDA stream and per R-worker (issue 18)", "",
             "From %s (analysis/trace_tracks.py). A stream track's spans are the device work of one slot (mini-batch) "
             "on it, placed by CUDA events; overlapping = spans inside one stream that overlap (must be 0); busy together "
             "= time two streams ran at once." % ", ".join("`%s`" % d for d in a.dirs), ""]
    for r in runs:
        lines += ["## %s: %s" % (r["point"], "built" if r["built"] else "NOT built"), "",
                  "| stream track | spans | busy ms | mini-batches | stages | overlapping |", "|---|---|---|---|---|---|"]
        for t, s in r["streams"].items():
            lines.append("| %s | %d | %.3f | %s | %s | %d |" % (t, s["spans"], s["busy_ms"], ", ".join(map(str, s["mini_batches"])),
                                                             ", ".join(s["stages"]), s["overlapping_spans"]))
        lines += ["", "Streams busy together: %.3f ms. R-worker tracks: %s. All tracks: %s." % (
            r["streams_busy_together_ms"], ", ".join(r["rworker_tracks"]) or "none",
            ", ".join("%s (%d)" % (t, v["spans"]) for t, v in r["tracks"].items())), ""]
    write_report(a.out, "trace_tracks", lines, {"runs": runs})
    return 0 if all(r["built"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
