"""Fig. 1: KV-cache memory vs batch and sequence length, COMPUTED (not measured) from the model configs in
experiments/models/: 2 (K and V) · layers · kv_heads · head_dim · bytes per element, per token of context.
fp16 lines, with int8 / int4 (their scales not counted) at one sequence length. Each panel marks the memory
the GPUs named in GPUS leave for the KV-cache once the model's fp16 weights are in (capacity − weights;
nominal capacities in GB = 1e9 bytes; activations and workspace not counted)."""
import json
import os

import matplotlib.pyplot as plt
import matplotlib.ticker

from fig_common import MODELS_DIR, Skip, add_caption, save

MODELS = ("llama-2-7b", "llama-2-13b", "opt-175b")
GPUS = (("A10", 24.0), ("A100", 80.0), ("H200", 141.0))
DTYPE_BYTES = {"fp16": 2.0, "int8": 1.0, "int4": 0.5}
BATCHES = [2 ** i for i in range(0, 11)]          # 1 .. 1024
SEQS = [128 * 2 ** i for i in range(0, 7)]        # 128 .. 8192
SEQ_LINES = (512, 1024, 2048, 4096)               # the "vs batch" row's lines
BATCH_LINES = (16, 64, 256, 1024)                 # the "vs sequence" row's lines
QUANT_SEQ = 1024                                  # int8 / int4 lines at this sequence length


def load_model(name):
    path = os.path.join(MODELS_DIR, name + ".json")
    if not os.path.isfile(path):
        raise Skip("%s not found" % path)
    with open(path) as f:
        return json.load(f)


def shape(cfg):
    """(layers, kv_heads, head_dim) of an HF config.json."""
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    return cfg["num_hidden_layers"], kv, head_dim


def kv_bytes_per_token(cfg, dtype="fp16"):
    layers, kv, head_dim = shape(cfg)
    return 2.0 * layers * kv * head_dim * DTYPE_BYTES[dtype]


def kv_gb(cfg, batch, seq, dtype="fp16"):
    return kv_bytes_per_token(cfg, dtype) * batch * seq / 1e9


def weight_params(cfg):
    """Parameters of a Llama- or OPT-style decoder from its config (embeddings, every layer, final norm, head)."""
    H, L, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    _, kv, hd = shape(cfg)
    if cfg.get("model_type") == "opt":
        F = cfg["ffn_dim"]
        per_layer = 4 * (H * H + H) + 2 * H * F + F + H + 2 * 2 * H  # q k v o (+bias), fc1 fc2 (+bias), 2 layer norms
        emb = V * H + (cfg["max_position_embeddings"] + 2) * H
        head = 0 if cfg.get("tie_word_embeddings", True) else V * H
        return emb + L * per_layer + 2 * H + head
    I = cfg["intermediate_size"]
    per_layer = 2 * H * H + 2 * H * kv * hd + 3 * H * I + 2 * H  # q o, k v, gate up down, 2 RMS norms
    head = 0 if cfg.get("tie_word_embeddings", False) else V * H
    return V * H + L * per_layer + H + head


def weights_gb(cfg):
    return 2.0 * weight_params(cfg) / 1e9


def fmt_gb(v, _=None):
    return "%g" % v if v >= 1 else "%.2g" % v


def fig1(a, written):
    cfgs = [(m, load_model(m)) for m in MODELS]
    fig, axes = plt.subplots(2, len(cfgs), figsize=(5.2 * len(cfgs), 9.5), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for j, (name, cfg) in enumerate(cfgs):
        layers, kv, hd = shape(cfg)
        w = weights_gb(cfg)
        top, bottom = axes[0][j], axes[1][j]
        for k, s in enumerate(SEQ_LINES):
            top.plot(BATCHES, [kv_gb(cfg, b, s) for b in BATCHES], "o-", ms=3, color=colors[k],
                     label="COMPUTED fp16, S=%d" % s)
        for dt, ls in (("int8", "--"), ("int4", ":")):
            top.plot(BATCHES, [kv_gb(cfg, b, QUANT_SEQ, dt) for b in BATCHES], ls, color=colors[SEQ_LINES.index(QUANT_SEQ)],
                     label="COMPUTED %s, S=%d (scales not counted)" % (dt, QUANT_SEQ))
        for k, b in enumerate(BATCH_LINES):
            bottom.plot(SEQS, [kv_gb(cfg, b, s) for s in SEQS], "o-", ms=3, color=colors[k + 4], label="COMPUTED fp16, B=%d" % b)
        for ax in (top, bottom):
            for g, (gpu, cap) in enumerate(GPUS):
                free = cap - w
                if free > 0:
                    ax.axhline(free, color="0.25", lw=0.9, ls=(0, (4, 2 + 2 * g)))
                    ax.annotate("%s %g GB − %.1f GB weights = %.1f GB" % (gpu, cap, w, free), (0.01, free),
                                xycoords=("axes fraction", "data"), xytext=(0, 2), textcoords="offset points", fontsize=7)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: "%g" % v))
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(fmt_gb))
            ax.set_ylabel("KV-cache (GB)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=6.5, loc="lower right")
        short = [gpu for gpu, cap in GPUS if cap <= w]
        note = ("\nfp16 weights alone (%.0f GB) exceed %s" % (w, ", ".join(short))) if short else ""
        top.set_title("%s: %d layers × %d KV heads × %d = %.0f KB/token (fp16)%s"
                      % (name, layers, kv, hd, kv_bytes_per_token(cfg) / 1e3, note), fontsize=9)
        top.set_xlabel("batch B (sequences)")
        bottom.set_xlabel("sequence length S (tokens of context per sequence)")
    fig.suptitle("Fig. 1: KV-cache memory vs batch and sequence length (COMPUTED from the model configs, not measured)", fontsize=12)
    add_caption(fig, "COMPUTED: bytes = 2 · layers · kv_heads · head_dim · bytes per element · B · S, from experiments/models/{%s}.json; "
                "horizontal lines: nominal GPU memory minus the model's fp16 weights (parameters counted from the config), "
                "activations and workspace not counted; GB = 1e9 bytes." % ",".join(MODELS))
    fig.tight_layout(rect=(0, 0.03, 1, 0.96))
    save(fig, a.out, "fig1_kv_memory.png", written, a.formats)
