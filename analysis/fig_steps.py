"""Fig. 11: per-step latency. With --sim-dir: each output folder in it, told apart by its summary.json: fd-sim's
(it writes "program": "fd-sim") are MODELLED; fd-bench run folders (they carry "engine" and provenance) are
measured and labelled with their machine and balance. Without --sim-dir: the measured e2e FastDecode runs."""
import glob
import os
import sys

import matplotlib.pyplot as plt

from fd_runs import decode_steps, jsonl_path, read_jsonl
from fig_common import Skip, add_caption, balance_of, load_json, machine_of, save


def is_fd_sim(summary):
    return summary.get("program") == "fd-sim"


def sim_folders(sim_dir):
    if not os.path.isdir(sim_dir):
        raise Skip("--sim-dir %s is not a directory" % sim_dir)
    cands = [sim_dir] + sorted(os.path.join(sim_dir, d) for d in os.listdir(sim_dir))
    return [d for d in cands if jsonl_path(d, "steps.jsonl") and os.path.isfile(os.path.join(d, "summary.json"))]


def sim_label(cfg, res):
    mode = cfg.get("mode", "?")
    lab = mode
    if mode == "fixed-interval":
        lab += " (F=%s)" % cfg.get("interval")
    elif mode == "load-control":
        lab += " (W_lim=%s%s)" % (cfg.get("w_lim"), ", min_gap=%s" % cfg["min_gap"] if cfg.get("min_gap") else "")
    lab += ", B=%s, S=%s" % (cfg.get("batch"), cfg.get("seq"))
    if res.get("tokens_per_s"):
        lab += ": %.0f tok/s" % res["tokens_per_s"]
    return "MODELLED " + lab


def measured_label(s):
    """'measured <name> (<engine>, <machine>, <balance>): N tok/s' of an fd-bench run folder's summary.json."""
    cfg = s.get("config") or {}
    sched = cfg.get("schedule") or {}
    mode = sched.get("mode", "?")
    if mode == "fixed-interval":
        mode += " (F=%s)" % sched.get("interval")
    elif mode == "load-control":
        mode += " (W_lim=%s)" % sched.get("w_lim")
    eng = s.get("engine")
    eng = eng.get("type") if isinstance(eng, dict) else eng
    lab = "measured %s (%s, %s; %s, %s)" % (s.get("name", "?"), eng, mode, machine_of(s.get("provenance")) or "machine not recorded",
                                          balance_of((cfg.get("hardware") or {}).get("gpu")))
    tps = (s.get("results") or {}).get("output_throughput")
    if tps:
        lab += ": %.0f tok/s" % tps
    return lab


def sim_cost_desc(cfg):
    c = cfg.get("cost", {})
    desc = "N=%s, P=%s, " % (c.get("layers"), ("%g" % c["rworkers"]) if isinstance(c.get("rworkers"), (int, float)) else c.get("rworkers"))
    if c.get("profile"):
        return desc + "T, R from %s" % os.path.basename(c["profile"])
    return desc + "S %s ms/step, R %s ns/token/layer" % (c.get("t_ms_per_step_s_part") or "T(B) table",
                                                         ("%.0f" % (c["r_s_per_token_layer"] * 1e9)) if c.get("r_s_per_token_layer") else "?")


def fig11_sim(a, written):
    folders = sim_folders(a.sim_dir)
    if not folders:
        raise Skip("no output folder (steps.jsonl + summary.json) in %s" % a.sim_dir)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 8), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    used, costs, kinds = [], [], set()
    for d in folders:
        s = load_json(os.path.join(d, "summary.json"))
        steps = [x for x in read_jsonl(d, "steps.jsonl") if x.get("step_ms") is not None]
        res = s.get("results", {})
        if is_fd_sim(s):
            # Without cost flags fd-sim writes null times (steps.jsonl and summary.json).
            if not any(x["step_ms"] > 0 for x in steps) or res.get("duration_s") is None:
                print("figures: %s has no step times (fd-sim without cost flags), left out of fig11" % d, file=sys.stderr)
                continue
            cfg = s.get("config", {})
            lab, peak = sim_label(cfg, res), res.get("peak_step_ms")
            desc = sim_cost_desc(cfg)
            if desc not in costs:
                costs.append(desc)
            kinds.add("MODELLED")
        else:
            if not steps:
                print("figures: %s has no step times, left out of fig11" % d, file=sys.stderr)
                continue
            lab, peak = measured_label(s), max(x["step_ms"] for x in steps)
            kinds.add("measured")
        x = [st["step"] for st in steps]
        line, = ax1.plot(x, [st["step_ms"] for st in steps], "-", lw=1.4, label=lab)
        ax2.plot(x, [st.get("total_context", 0) for st in steps], "-", lw=1.2, color=line.get_color(), label=lab)
        if peak:
            ax1.axhline(peak, color=line.get_color(), lw=0.6, ls=":")
        used.append(os.path.relpath(d, a.sim_dir) if d != a.sim_dir else os.path.basename(os.path.normpath(d)))
    if not used:
        raise Skip("the folders in %s have no step times (run fd-sim with cost flags)" % a.sim_dir)
    ax1.set_ylabel("step latency (ms%s)" % (", simulated" if kinds == {"MODELLED"} else ""))
    ax1.set_title("step_ms per step (dotted: each run's peak)", fontsize=9)
    handles, labs = ax1.get_legend_handles_labels()
    fig.legend(handles, labs, loc="upper center", ncol=2 if len(labs) > 1 else 1, fontsize=8, bbox_to_anchor=(0.5, 0.95))
    ax1.grid(True, alpha=0.3)
    ax2.set_ylabel("total context W (tokens)")
    ax2.set_xlabel("step (engine iteration)")
    ax2.set_title("load on the R-workers: total context per step", fontsize=9)
    ax2.grid(True, alpha=0.3)
    what = {frozenset(["MODELLED"]): "MODELLED, fd-sim", frozenset(["measured"]): "measured, fd-bench"}.get(
        frozenset(kinds), "measured (fd-bench) and MODELLED (fd-sim)")
    fig.suptitle("Beside Fig. 11: per-step latency under different admission schedules (%s)" % what, fontsize=12)
    parts = []
    if "MODELLED" in kinds:
        parts.append("MODELLED series: no hardware, fd-sim's cost model (step = max(N·T(n), N·W·R/P); %s)" % "; ".join(costs))
    if "measured" in kinds:
        parts.append("measured series: fd-bench runs, machine and balance in each label")
    add_caption(fig, "%s. Numbers from summary.json + steps.jsonl of %s in %s." % (". ".join(parts), ", ".join(used), a.sim_dir))
    fig.tight_layout(rect=(0, 0.04, 1, 0.95 - 0.022 * ((len(labs) + 1) // 2)))
    save(fig, a.out, "per_step_latency.png", written, a.formats)


def fig11_e2e(a, written):
    runs = []
    for d in sorted(glob.glob(os.path.join(a.artifacts, "e2e", "*"))):
        sp = os.path.join(d, "summary.json")
        if not (os.path.isfile(sp) and jsonl_path(d, "steps.jsonl")):
            continue
        s = load_json(sp)
        if s.get("engine") == "fastdecode":
            runs.append((d, s, read_jsonl(d, "steps.jsonl")))
    if not runs:
        raise Skip("no FastDecode run folder with steps.jsonl under %s" % os.path.join(a.artifacts, "e2e"))
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 8), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    for d, s, steps in runs:
        x = [st["step"] for st in steps]
        bal = balance_of(((s.get("config") or {}).get("hardware") or {}).get("gpu"))
        line, = ax1.plot(x, [st["step_ms"] for st in steps], "-", lw=1.2, label="%s (%s)" % (s.get("name", os.path.basename(d)), bal))
        c = line.get_color()
        pre = [st for st in steps if st.get("prefill_tokens", 0) > 0]
        dec = decode_steps(steps)
        ax1.plot([st["step"] for st in pre], [st["step_ms"] for st in pre], "o", mfc="none", color=c, ms=5)
        ax1.plot([st["step"] for st in dec], [st["step_ms"] for st in dec], "o", color=c, ms=3)
        ax2.plot(x, [st.get("decode_tokens", 0) for st in steps], "-", color=c, lw=1.2)
    ax1.plot([], [], "o", mfc="none", color="0.3", label="step with prefill (admission)")
    ax1.plot([], [], "o", color="0.3", ms=3, label="decode-only step")
    ax1.set_yscale("log")
    ax1.set_ylabel("step latency (ms, log scale)")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=8, ncol=2, title="measured on " + (machine_of(runs[0][1].get("provenance")) or "machine not recorded"),
               title_fontsize=8)
    ax1.set_title("step_ms per step (admission in prompt-budget waves, then decode, then drain)", fontsize=9)
    ax2.set_ylabel("decode tokens in the step (B)")
    ax2.set_xlabel("step (engine iteration)")
    ax2.grid(True, alpha=0.3)
    fig.suptitle("Beside Fig. 11: per-step latency of the measured FastDecode runs", fontsize=12)
    m = runs[0][1].get("model") or {}
    add_caption(fig, "Machine: %s. Measured: numbers from e2e/<run>/steps.jsonl (and summary.json) of %d FastDecode runs in %s; "
                "%s of %s layers run; all requests offered at once (no SLS: pass --sim-dir for fd-sim schedules)."
                % (machine_of(runs[0][1].get("provenance")) or "not recorded", len(runs), os.path.join(a.artifacts, "e2e"),
                   m.get("layers", "?"), m.get("full_layers", "?")))
    fig.tight_layout(rect=(0, 0.04, 1, 0.96))
    save(fig, a.out, "per_step_latency.png", written, a.formats)


def fig11(a, written):
    (fig11_sim if a.sim_dir else fig11_e2e)(a, written)
