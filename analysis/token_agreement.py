#!/usr/bin/env python3
"""Token agreement between run folders of the same workload: for each run, how many requests generated
exactly the tokens of the base run, and the mean length of the agreeing prefix. Greedy runs of fp16 engines
on random weights differ where the logits are near-ties (docs/BASELINES.md), so this measures how often the
engines' arithmetic flips a pick, not which is right (the reference engine judges that, in the tests).

usage: analysis/token_agreement.py --base RUN_DIR RUN_DIR...
       analysis/token_agreement.py --grid ENGINE ROOT...   every run folder of analysis/fig_baselines.py's layout
                                   under the ROOTs against ENGINE's folder of the same balance, model, window and B
"""
import argparse

from fd_runs import read_jsonl


def tokens(run_dir):
    return {r["id"]: r["tokens"] for r in read_jsonl(run_dir, "requests.jsonl")}


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


def row(label, base, other):
    same, n, pre, length = agreement(base, other)
    return "| %s | %d / %d (%.1f %%) | %.1f / %d |" % (label, same, n, 100.0 * same / max(n, 1), pre, length)


def grid(engine, roots):
    """Rows of every run folder against `engine`'s folder at the same point (fig_baselines.run_folders)."""
    from fig_baselines import run_folders
    points = {}
    for root in roots:
        for bal, model, window, eng, B, d in run_folders(root):
            points.setdefault((bal, model, window, B), {})[eng] = d
    out = []
    for (bal, model, window, B), engines in sorted(points.items()):
        if engine not in engines:
            continue
        base = tokens(engines[engine])
        for eng, d in sorted(engines.items()):
            if eng != engine:
                out.append(row("%s %s %s B=%d %s" % (bal, model, window or "-", B, eng), base, tokens(d)))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--base", help="the run the others are compared with")
    g.add_argument("--grid", metavar="ENGINE", help="compare every folder under the ROOTs with this engine's at the same point")
    ap.add_argument("runs", nargs="+", help="run folders (--base) or roots (--grid)")
    a = ap.parse_args(argv)
    print("| run | identical requests | mean agreeing prefix |")
    print("| --- | --- | --- |")
    if a.grid:
        for line in grid(a.grid, a.runs):
            print(line)
        return
    base = tokens(a.base)
    for d in a.runs:
        print(row(d.rstrip("/"), base, tokens(d)))


if __name__ == "__main__":
    main()
