"""Fig. 3 (part): one layer's S-Part vs its cuBLAS GEMMs alone, by batch size (spart_*.json of fd-spart-bench).

Each file is one series, labelled with what its JSON says it is: model, dtype (fp16 / bf16), SMs used of
the GPU's, and the commit when two files would otherwise carry the same label."""
import glob
import os
import sys

import matplotlib.pyplot as plt
import matplotlib.ticker

from fig_common import Skip, add_caption, load_json, machine_of, save


def series_label(d, prov):
    gpus = (prov or {}).get("gpus") or [{}]
    total = gpus[0].get("sm_count")
    sms = d.get("sm_count", "?")
    sm_text = "%s SMs" % sms if not total or sms == total else "%s of %s SMs" % (sms, total)
    return "%s %s, %s" % (d.get("model", "?"), d.get("dtype", "dtype?"), sm_text)


def fig3(a, written):
    files = sorted(glob.glob(os.path.join(a.artifacts, "spart_*.json")))
    if not files:
        raise Skip("no spart_*.json in %s" % a.artifacts)
    loaded = []
    for path in files:
        d = load_json(path)
        rows = sorted(d.get("rows") or [], key=lambda r: r["B"])
        if not rows:
            print("figures: %s has no rows, left out of fig3" % path, file=sys.stderr)
            continue
        loaded.append((path, d, rows, series_label(d, d.get("provenance"))))
    if not loaded:
        raise Skip("no spart_*.json in %s has rows" % a.artifacts)
    labels = [x[3] for x in loaded]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.6))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    machines, commits, dtypes = [], [], []
    for i, (path, d, rows, label) in enumerate(loaded):
        prov = d.get("provenance") or {}
        if labels.count(label) > 1:  # same model, dtype and SMs: the commit tells them apart
            label += " @%s" % prov.get("git_commit", os.path.basename(path))
        c = colors[i % len(colors)]
        B = [r["B"] for r in rows]
        sp = [r["spart_ms"] for r in rows]
        gm = [r["gemm_ms"] for r in rows]
        last = rows[-1]
        ax1.plot(B, sp, "o-", color=c, label="%s: S-Part (%.2f× the GEMMs at B=%d)" % (label, last["spart_ms"] / last["gemm_ms"], last["B"]))
        ax1.plot(B, gm, "x--", color=c, label=label + ": cuBLAS GEMMs alone")
        ax2.plot(B, [1e3 * s / b for s, b in zip(sp, B)], "o-", color=c, label=label + ": S-Part")
        ax2.plot(B, [1e3 * g / b for g, b in zip(gm, B)], "x--", color=c, label=label + ": GEMMs alone")
        m = machine_of(prov) or d.get("device")
        if m and m not in machines:
            machines.append(m)
        if prov.get("git_commit") and prov["git_commit"] not in commits:
            commits.append(prov["git_commit"])
        if d.get("dtype") and d["dtype"] not in dtypes:
            dtypes.append(d["dtype"])
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: "%g" % v))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: "%g" % v))
        ax.set_xlabel("batch B (decode tokens per step)")
        ax.grid(True, which="both", alpha=0.3)
    ax1.set_ylabel("time per layer (ms)")
    ax1.set_title("One layer's S-Part vs its GEMMs alone", fontsize=10)
    ax2.set_ylabel("time per token per layer (µs) = time / B")
    ax2.set_title("Per-token cost falls ~B-fold: batching pays for the S-Part", fontsize=10)
    ax1.legend(fontsize=7, loc="upper left", title="measured on " + ("; ".join(machines) or "machine not recorded"), title_fontsize=7)
    ax2.legend(fontsize=7, loc="upper right")
    fig.suptitle("Beside Fig. 3: S-Part (%s GEMMs + elementwise kernels) vs cuBLAS GEMMs alone, by batch size"
                 % " / ".join(dtypes or ["16-bit"]), fontsize=12)
    add_caption(fig, "Machine: %s. Measured: numbers from %s (fd-spart-bench, commit %s; CUDA events; no host transfers). "
                "Balance: the SMs named in each label (a green context when fewer than the GPU's)."
                % ("; ".join(machines) or "not recorded", ", ".join(os.path.basename(x[0]) for x in loaded), ", ".join(commits) or "?"))
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))
    save(fig, a.out, "spart_vs_gemm.png", written, a.formats)
