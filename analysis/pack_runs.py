#!/usr/bin/env python3
"""Pack run folders for committing: steps.jsonl and requests.jsonl gzipped, the prompts' token lists left out.

A run folder of a large batch is megabytes of JSON lines, most of it the prompts' token ids, which the
workload's seed regenerates (`fd-bench workload CONFIG`). Packed, each folder keeps summary.json as is,
steps.jsonl as steps.jsonl.gz (every field), and requests.jsonl as requests.jsonl.gz with every field but
"prompt" (prompt_len stays). workload.jsonl (baselines/hf/run_hf.py's copy of the workload's prompts) is
removed for the same reason. The analysis scripts read NAME or NAME.gz (analysis/fd_runs.py). Folders are
found by their summary.json under each ROOT; packing a packed folder changes nothing.

usage: analysis/pack_runs.py ROOT...
"""
import argparse
import gzip
import json
import os
import sys


def gz_write(path, lines):
    tmp = path + ".tmp"
    with gzip.GzipFile(tmp, "wb", compresslevel=9, mtime=0) as f:
        for line in lines:
            f.write((line + "\n").encode())
    os.replace(tmp, path)


def read_lines(path):
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        return [line.rstrip("\n") for line in f if line.strip()]


def pack(d):
    """Bytes before and after packing the folder d."""
    before = sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d) if os.path.isfile(os.path.join(d, n)))
    for name, strip in (("steps.jsonl", False), ("requests.jsonl", True)):
        plain, gz = os.path.join(d, name), os.path.join(d, name + ".gz")
        src = plain if os.path.isfile(plain) else gz if os.path.isfile(gz) else None
        if src is None:
            continue
        lines = read_lines(src)
        if strip:
            recs = [json.loads(x) for x in lines]
            if not any("prompt" in r for r in recs) and src == gz:
                continue
            lines = [json.dumps({k: v for k, v in r.items() if k != "prompt"}, sort_keys=True) for r in recs]
        elif src == gz:
            continue
        gz_write(gz, lines)
        if src == plain:
            os.remove(plain)
    for name in ("workload.jsonl", "workload.jsonl.gz"):
        if os.path.isfile(os.path.join(d, name)):
            os.remove(os.path.join(d, name))
    after = sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d) if os.path.isfile(os.path.join(d, n)))
    return before, after


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("roots", nargs="+")
    a = ap.parse_args(argv)
    n = b0 = b1 = 0
    for root in a.roots:
        if not os.path.isdir(root):
            print("pack_runs: %s: not a folder" % root, file=sys.stderr)
            return 2
        for d, _, files in os.walk(root):
            if "summary.json" in files:
                x, y = pack(d)
                n, b0, b1 = n + 1, b0 + x, b1 + y
    print("pack_runs: %d run folders, %.1f MB -> %.1f MB" % (n, b0 / 1e6, b1 / 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main())
