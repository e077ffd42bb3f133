#!/usr/bin/env python3
"""README's "What was found" table, generated from CLAIMS.md (itself generated from the committed runs by
analysis/claims.py), so the README quotes no number that the reports do not hold: a few claims of the paper, the
paper's value, what was measured here (or MODELLED, so labelled), and the verdict, negative results included; then
CLAIMS.md's statement of where offloading attention wins.

usage: analysis/readme_findings.py [--claims CLAIMS.md] [--readme README.md] [--check]
  writes the table between README's <!-- findings --> and <!-- /findings --> markers; --check exits 1 when README's
  table is not what CLAIMS.md gives (tests/python/test_readme.py)
"""
import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN, END = "<!-- findings: analysis/readme_findings.py writes this table from CLAIMS.md -->", "<!-- /findings -->"
# The rows, by the start of CLAIMS.md's claim cell, in this order; each its short name here.
ROWS = (
    ("Fig. 9: FastDecode / TensorRT-LLM, llama-2-7b, B = 1024", "FastDecode over GPU-only (7b, B = 1024)"),
    ("Fig. 9: FastDecode / vLLM, llama-2-7b, B = 1024", "FastDecode over paged-swap (vLLM's policy)"),
    ("Fig. 3: Attention per token costs about the same on the GPU as on the CPUs", "CPU attention / GPU attention per token"),
    ("Fig. 11: SLS (fixed-interval) latency / all-at-once's peak", "SLS step latency / all-at-once's peak"),
    ("Fig. 11: SLS (fixed-interval) sustained throughput vs all-at-once", "SLS throughput gain"),
    ("Fig. 11: load-control's sustained throughput vs fixed-interval's", "load control vs fixed-interval SLS"),
    ("Fig. 13: strong-scaling efficiency (S = 1024)", "R-worker strong scaling"),
    ("§4 (quantisation): int4 KV makes the R-Part about 4× faster", "int4 KV attention speed-up"),
)


def claims_rows(path):
    """{claim cell: (paper, measured here, verdict)} of CLAIMS.md's table."""
    rows = {}
    for line in open(path, encoding="utf-8"):
        if not line.startswith("| ") or line.startswith("| claim ") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) >= 6:
            rows[cells[0]] = (cells[1], cells[2], cells[5])
    return rows


def short(text, sep):
    """text up to the first sep (the rest is CLAIMS.md's detail)."""
    return text.split(sep)[0].strip()


def table(claims_path):
    rows = claims_rows(claims_path)
    out = ["| the paper's claim | paper | here | verdict |", "| --- | --- | --- | --- |"]
    for key, name in ROWS:
        hit = [k for k in rows if k.startswith(key)]
        if len(hit) != 1:
            raise SystemExit("readme_findings: %s: %d rows start with %r" % (claims_path, len(hit), key))
        paper, here, verdict = rows[hit[0]]
        modelled = "MODELLED on the paper's hardware: " in verdict
        v = short(short(verdict, " — "), ";")
        if modelled:
            v += "; MODELLED on the paper's hardware: " + short(verdict.split("MODELLED on the paper's hardware: ")[1], ";")
        out.append("| %s | %s | %s | %s |" % (name, paper, short(here, "; fd-sim"), v))
    statement = ""
    for line in open(claims_path, encoding="utf-8"):
        if line.startswith("Where offloading attention wins"):
            statement = line.split("): ", 1)[1].strip()
    if not statement:
        raise SystemExit("readme_findings: %s has no 'Where offloading attention wins' statement" % claims_path)
    return "\n".join(out) + "\n\n**Where offloading attention wins.** " + statement + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--claims", default=os.path.join(REPO, "CLAIMS.md"))
    ap.add_argument("--readme", default=os.path.join(REPO, "README.md"))
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    text = open(a.readme, encoding="utf-8").read()
    if BEGIN not in text or END not in text:
        print("readme_findings: %s has no %s ... %s markers" % (a.readme, BEGIN, END), file=sys.stderr)
        return 2
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = head + BEGIN + "\n" + table(a.claims) + END + tail
    if a.check:
        if new != text:
            print("readme_findings: README's findings are not CLAIMS.md's: run analysis/readme_findings.py", file=sys.stderr)
            return 1
        return 0
    with open(a.readme, "w", encoding="utf-8") as f:
        f.write(new)
    print("wrote the findings into %s" % a.readme)
    return 0


if __name__ == "__main__":
    sys.exit(main())
