"""What the figure modules (analysis/fig_*.py, drawn by analysis/figures.py) share: reading inputs, naming the
machine and balance of a measured series, the full-depth equivalent of a reduced-layer rate, and saving a
figure in every requested format."""
import json
import os

import fd_runs
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DPI = 120
CAPTION_SIZE = 7.5
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS_DIR = os.path.join(REPO, "experiments", "models")
# The label of every full-depth equivalent: the rate of N of L layers scaled by N/L, i.e. the step taken
# as L/N times the measured one (linear in layers, no fixed part: Fig. 8 measures that linearity).
FULL_DEPTH_NOTE = "(×L/N, assumes step linear in layers: Fig. 8)"


class Skip(Exception):
    """A figure's inputs are missing or unusable; the message says why."""


def load_json(path):
    if not os.path.isfile(path):
        raise Skip("%s not found" % path)
    try:
        with open(path) as f:
            return json.load(f)
    except ValueError as e:
        raise Skip("%s is not valid JSON (%s)" % (path, e))


def load_jsonl(path):
    if not os.path.isfile(path):
        raise Skip("%s not found" % path)
    rows = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as e:
                    raise Skip("%s:%d is not valid JSON (%s)" % (path, i, e))
    return rows


def machine_of(prov):
    """'NVIDIA H200 (132 SMs), 16-core Intel(R) Xeon(R) Processor' from a provenance object (either key set)."""
    if not prov or not isinstance(prov, dict):
        return None
    parts = []
    gpus = prov.get("gpus") or []
    if gpus:
        g = gpus[0]
        parts.append("%s (%s SMs)" % (g.get("name", "GPU"), g.get("sm_count", "?")) + (" x%d" % len(gpus) if len(gpus) > 1 else ""))
    cpu = prov.get("cpu_model") or prov.get("cpu")
    if cpu:
        cores = prov.get("cpu_cores")
        parts.append(("%s-core %s" % (cores, cpu)) if cores else cpu)
    return ", ".join(parts) or None


def balance_of(hw_gpu):
    """The emulated balance of a run from its config's hardware.gpu: 'full GPU' or 'GPU capped at 24 GB, 16 SMs'."""
    hw_gpu = hw_gpu or {}
    mem, sms = hw_gpu.get("memory_gb") or 0, hw_gpu.get("sm_count") or 0
    if not mem and not sms:
        return "full GPU"
    caps = (["%g GB" % mem] if mem else []) + (["%d SMs" % sms] if sms else [])
    return "GPU capped at " + ", ".join(caps)


def e2e_machine(artifacts, rows):
    """The machine of the e2e runs: e2e.json's provenance lacks the CPU, the run folders' summary.json have it."""
    for r in rows:
        p = os.path.join(artifacts, "e2e", r.get("name", ""), "summary.json")
        if os.path.isfile(p):
            try:
                m = machine_of(json.load(open(p)).get("provenance"))
            except ValueError:
                m = None
            if m:
                return m
    for r in rows:
        m = machine_of(r.get("provenance"))
        if m:
            return m
    return "machine not recorded"


def full_layers(model, summary=None):
    """The model's full depth (analysis/fd_runs.py: summary.json, else the model's config); None when neither says."""
    return fd_runs.full_layers(summary, model)


def depth_factor(layers, full):
    """N / L: multiply a rate of N layers run by this for its full-depth equivalent; None when not reduced."""
    if not layers or not full or layers >= full:
        return None
    return float(layers) / float(full)


def add_full_depth_axis(ax, factor, layers, full, unit="tokens/s"):
    """A right-hand axis reading the left one's rates as full-depth equivalents (one factor for the whole axis)."""
    sec = ax.secondary_yaxis("right", functions=(lambda v: v * factor, lambda v: v / factor))
    sec.set_ylabel("full-depth equiv. %s: %d of %d layers run\n%s" % (unit, layers, full, FULL_DEPTH_NOTE), fontsize=8)
    return sec


def add_caption(fig, text):
    fig.text(0.01, 0.008, text, fontsize=CAPTION_SIZE, ha="left", va="bottom", wrap=True, color="0.25")


def save(fig, out_dir, name, written, formats=("png",)):
    """Writes NAME.<fmt> for each format (name given with .png; the stem is kept)."""
    stem = os.path.splitext(name)[0]
    for fmt in formats:
        path = os.path.join(out_dir, "%s.%s" % (stem, fmt))
        fig.savefig(path, dpi=DPI)
        written.append(path)
        print("wrote %s" % path)
    plt.close(fig)
