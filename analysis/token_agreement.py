#!/usr/bin/env python3
"""Token agreement between run folders of the same workload: for each run, how many requests generated
exactly the tokens of the base run, and the mean length of the agreeing prefix. Greedy runs of fp16 engines
on random weights differ where the logits are near-ties (docs/BASELINES.md), so this measures how often the
engines' arithmetic flips a pick, not which is right (the reference engine judges that, in the tests).

usage: analysis/token_agreement.py --base RUN_DIR RUN_DIR...
"""
import argparse
import json
import os


def tokens(run_dir):
    out = {}
    with open(os.path.join(run_dir, "requests.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            out[r["id"]] = r["tokens"]
    return out


def agreement(base, other):
    """(identical requests, requests, mean agreeing prefix, tokens per request of the base)."""
    same, prefix = 0, []
    for i, want in base.items():
        got = other.get(i, [])
        k = 0
        while k < min(len(want), len(got)) and want[k] == got[k]:
            k += 1
        same += want == got
        prefix.append(k)
    n = len(base)
    return same, n, (sum(prefix) / n if n else 0.0), max((len(v) for v in base.values()), default=0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the run the others are compared with")
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args(argv)
    base = tokens(a.base)
    print("| run | identical requests | mean agreeing prefix |")
    print("| --- | --- | --- |")
    for d in a.runs:
        same, n, pre, length = agreement(base, tokens(d))
        print("| %s | %d / %d (%.1f %%) | %.1f / %d |" % (d.rstrip("/"), same, n, 100.0 * same / max(n, 1), pre, length))


if __name__ == "__main__":
    main()
