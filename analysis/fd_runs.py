"""What the analysis scripts read from fd-bench run folders, defined once.

Decode-only steps: the steps that processed no prompt tokens (admission over or waiting) and decoded
something; their decode throughput is decode tokens over their wall time.

A run folder's JSON-lines files (steps.jsonl, requests.jsonl) are read as written or gzipped (NAME.gz):
committed run folders are packed so by analysis/pack_runs.py.
"""
import gzip
import json
import os


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS_DIR = os.path.join(REPO, "experiments", "models")


def full_layers(summary=None, model=None):
    """A run's full model depth: summary.json model.full_layers when recorded, else num_hidden_layers of the model
    config its resolved config names (as given, or relative to the repository), else of experiments/models/<model or
    the summary's model name>.json; None when none says."""
    m = (summary or {}).get("model") or {}
    if m.get("full_layers"):
        return int(m["full_layers"])
    cfg = (((summary or {}).get("config") or {}).get("model") or {}).get("config")
    name = model or m.get("name")
    paths = ([cfg, os.path.join(REPO, cfg)] if cfg else []) + ([os.path.join(MODELS_DIR, name + ".json")] if name else [])
    for p in paths:
        if p and os.path.isfile(p):
            try:
                n = json.load(open(p)).get("num_hidden_layers")
            except ValueError:
                n = None
            if n:
                return int(n)
    return None


def jsonl_path(d, name):
    """The path of d/name or d/name.gz (whichever exists, plain first), or None."""
    for p in (os.path.join(d, name), os.path.join(d, name + ".gz")):
        if os.path.isfile(p):
            return p
    return None


def read_jsonl(d, name):
    """The records of d/name (or d/name.gz); FileNotFoundError names both when neither exists."""
    p = jsonl_path(d, name)
    if p is None:
        raise FileNotFoundError("%s (or %s.gz) not found" % (os.path.join(d, name), name))
    with (gzip.open(p, "rt") if p.endswith(".gz") else open(p)) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_json(p):
    """The JSON of file p (or p.gz); None when neither exists."""
    for q in (str(p), str(p) + ".gz"):
        if os.path.isfile(q):
            with (gzip.open(q, "rt") if q.endswith(".gz") else open(q)) as f:
                return json.load(f)
    return None


def read_jsonl_or_none(p):
    """The records of the JSON-lines file p (or p.gz); [] when neither exists."""
    d, name = os.path.split(str(p))
    return read_jsonl(d, name) if jsonl_path(d, name) else []


def run_dirs(root):
    """(point name, run folder) of every ok run of a sweep folder (root/index.json), or (root's name, root) for a run
    folder (one with a summary.json or a trace.json); nothing for anything else."""
    root = str(root)
    idx = read_json(os.path.join(root, "index.json"))
    if idx:
        for pt in idx.get("points", []):
            for run in pt.get("runs", []):
                if run.get("status") == "ok":
                    yield pt["name"], os.path.join(root, run["dir"])
    elif read_json(os.path.join(root, "summary.json")) or read_json(os.path.join(root, "trace.json")):
        yield os.path.basename(os.path.normpath(root)), root


def decode_steps(steps):
    return [x for x in steps if x.get("prefill_tokens", 0) == 0 and x.get("decode_tokens", 0) > 0]


def steady_steps(dec):
    """The decode steps at the run's steady batch: the batch size that decoded the most tokens (steps x batch; the
    larger batch on a tie). A run's window also holds the tail of its last wave (a few rows for as many steps),
    whose steps mixed in would give a median step and a mean batch of no one batch: the roofline is taken at the
    batch the steps ran."""
    counts = {}
    for x in dec:
        counts[x["decode_tokens"]] = counts.get(x["decode_tokens"], 0) + 1
    if not counts:
        return []
    b = max(counts, key=lambda k: (counts[k] * k, k))
    return [x for x in dec if x["decode_tokens"] == b]


def decode_tokens_per_s(dec):
    return sum(x["decode_tokens"] for x in dec) / (sum(x["step_ms"] for x in dec) / 1e3) if dec else 0.0


def hbm_rates(path):
    """{sm_count: bytes/s} from fd-kernel-bench --only balance (0 = the whole device)."""
    d = json.load(open(path))
    out = {}
    for b in d["benchmarks"]:
        if b["name"].startswith("balance/read/") and "bytes_per_second" in b:
            key = b["name"].split("/")[2]
            out[0 if key == "all" else int(key[2:])] = b["bytes_per_second"]
    return out


def write_report(out, stem, lines, data):
    """OUT/STEM.md (the lines) and OUT/STEM.json (data), OUT made if missing; the lines printed too (only printed when
    out is None)."""
    if out is None:
        print("\n".join(lines))
        return
    os.makedirs(str(out), exist_ok=True)
    with open(os.path.join(str(out), stem + ".md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(str(out), stem + ".json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(data, indent=1) + "\n")
    print("\n".join(lines))
