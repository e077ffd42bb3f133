#!/usr/bin/env python3
"""Train a small Llama (MHA or GQA) and its tokenizer on the Debian-docs corpus (issue 44, part 1).

    train-small-model.py --corpus data/corpus --out DIR --variant mha|gqa [--tokenizer TOKDIR] [--steps N]
                         [--seed 0] [--smoke] [--score-out FILE] [--score-windows 16] [--score-len 512] ...

--corpus is scripts/make-corpus.sh's folder (train.txt, heldout.txt, MANIFEST.json) or its corpus.tar.xz.
Steps, all from a fixed seed (python random, numpy, torch):
  1. Tokenizer: byte-level BPE (tokenizers), vocabulary --vocab (4096) with <unk>=0, <s>=1 (BOS), </s>=2 (EOS),
     trained on train.txt only; its post-processor prepends BOS, so AutoTokenizer.from_pretrained(DIR).encode(text)
     starts with 1. --tokenizer DIR reuses a folder's tokenizer.json instead (train it once, with the first
     variant, and pass that variant's --out to the second: both then share one tokenizer). Checked after saving:
     AutoTokenizer loads DIR, prepends BOS, and decodes text back unchanged.
  2. Data: every document is encoded without special tokens and followed by EOS; the documents, in file order,
     make one stream that is cut into non-overlapping windows of --seq-len - 1 tokens, each prefixed with BOS
     (so BOS is only ever at position 0, as in the engine's requests). The tail shorter than a window is left
     out. Held-out windows are made the same way from heldout.txt.
  3. Model: LlamaForCausalLM, hidden 384, 6 layers, 6 heads of 64, intermediate 1024, vocabulary 4096, 1024
     positions, rope_theta 10000, rms_norm_eps 1e-5, untied head, no biases; --variant gqa: 2 KV heads (mha: 6).
  4. Training: AdamW (betas 0.9/0.95, weight decay 0.1 on matrices only), --lr 1e-3 peak, linear warmup then
     cosine decay to 10 % of the peak, grad clip 1.0, bf16 autocast on CUDA, --batch-size 64 windows of 512
     tokens, windows drawn in a seeded random order, epoch after epoch. Default --steps 3000 (~98M tokens): an
     estimate of ~2 minutes on one H100; tokens/s and an ETA are printed every --log-every steps.
  5. Held-out perplexity with transformers: the trained fp32 weights in memory, then the saved fp16 checkpoint
     reloaded (eager attention) in fp32 and in fp16; every held-out window, every token after the BOS scored.
  6. K and V outlier channels, over the held-out windows with the reloaded fp32 checkpoint: per layer and
     channel the max |x| of k_proj's output (pre-RoPE), of K after RoPE (the HF rotate-half convention,
     positions 0..L-1) and of v_proj's output; per layer the largest channel's absmax over the median
     channel's, and how many channels exceed 4x the median.
  7. Output in --out: config.json (fp16), model.safetensors (fp16), generation_config.json, the tokenizer files
     (tokenizer.json, tokenizer_config.json, special_tokens_map.json), train_report.json (arguments, versions,
     corpus MANIFEST sha256, loss curve, wall time, tokens/s, perplexities, the outlier table, sha256 of
     model.safetensors), and the scoring workload (default DIR/heldout_score.jsonl; --score-out FILE).
Scoring workload (fd-bench workload.score, docs/EXPERIMENTS.md): the first --score-windows non-overlapping
windows of the held-out stream, each {"prompt": [BOS], "continuation": the next --score-len - 1 tokens}: the same
windows as step 5 when --score-len equals --seq-len; their transformers perplexity (fp32 and fp16 checkpoint) is
in train_report.json under "score_workload", to set beside fd-bench's score of the same file.
--smoke: a tiny model (hidden 64, 2 layers, 4 heads), vocabulary 512, 3 steps of 4 x 64 tokens, a few
windows: for tests, on CPU or GPU. Any flag given explicitly wins over the --smoke and full defaults.
Exit status: 0 done, 2 bad arguments or input (or torch / transformers / tokenizers missing), 1 a failed check.
"""
from __future__ import annotations

import os
import sys

# scripts/ holds tokenize.py: keep this file's folder off sys.path, or the standard library's `tokenize` (imported by
# linecache, inspect, torch, transformers ...) would resolve to it.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import tarfile  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

DOC_SEP = "\n\f\n"
SPECIALS = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2: Llama's convention
UNK, BOS, EOS = 0, 1, 2
OUTLIER_FACTOR = 4.0
# (full, smoke) defaults of the flags --smoke changes
DEFAULTS = {"hidden": (384, 64), "layers": (6, 2), "heads": (6, 4), "intermediate": (1024, 128), "vocab": (4096, 512),
            "max_pos": (1024, 128), "seq_len": (512, 64), "batch_size": (64, 4), "steps": (3000, 3),
            "warmup": (None, 1), "log_every": (50, 1), "max_eval_windows": (None, 4), "score_windows": (16, 2),
            "score_len": (512, 64), "eval_batch": (16, 2)}


class InputError(Exception):
    """Bad arguments or input: exit 2."""


class CheckError(Exception):
    """A check of what was made failed: exit 1."""


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_documents(path):
    """The documents of a make-corpus.sh train.txt / heldout.txt (separated by a line holding one form feed)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    text = text[:-1] if text.endswith("\n") else text
    return [d for d in text.split(DOC_SEP) if d.strip()]


def open_corpus(path, tmp):
    """The corpus folder: `path` itself, or `path` (a corpus.tar.xz) unpacked into tmp."""
    if os.path.isfile(path) and path.endswith((".tar.xz", ".tar")):
        with tarfile.open(path) as t:
            for m in t.getmembers():
                if m.name not in ("train.txt", "heldout.txt", "MANIFEST.json") or not m.isfile():
                    raise InputError(f"{path}: unexpected member {m.name!r} (want train.txt, heldout.txt, MANIFEST.json)")
                try:
                    t.extract(m, tmp, filter="data")
                except TypeError:  # a Python without extraction filters (< 3.11.4); the names are checked above
                    t.extract(m, tmp)
        path = tmp
    if not os.path.isdir(path):
        raise InputError(f"--corpus {path}: not a folder or a .tar.xz")
    for f in ("train.txt", "heldout.txt"):
        if not os.path.isfile(os.path.join(path, f)):
            raise InputError(f"--corpus {path}: no {f} (make it with scripts/make-corpus.sh)")
    return path


def resolve(args):
    """Fill the flags left unset from the full or the --smoke defaults; check them."""
    for k, (full, smoke) in DEFAULTS.items():
        if getattr(args, k) is None:
            setattr(args, k, smoke if args.smoke else full)
    if args.heads < 1 or (args.kv_heads is not None and args.kv_heads < 1):
        raise InputError("--heads and --kv-heads must be >= 1")
    if args.seed < 0 or args.lr <= 0:
        raise InputError("--seed must be >= 0 and --lr > 0")
    if args.kv_heads is None:
        args.kv_heads = args.heads if args.variant == "mha" else max(1, args.heads // 3)
    if args.warmup is None:
        args.warmup = min(200, max(1, args.steps // 10))
    if args.hidden % args.heads:
        raise InputError(f"--hidden {args.hidden} is not a multiple of --heads {args.heads}")
    if args.heads % args.kv_heads:
        raise InputError(f"--heads {args.heads} is not a multiple of --kv-heads {args.kv_heads}")
    if args.variant == "mha" and args.kv_heads != args.heads:
        raise InputError("--variant mha wants --kv-heads equal to --heads")
    if args.variant == "gqa" and args.kv_heads == args.heads:
        raise InputError("--variant gqa wants fewer --kv-heads than --heads")
    for k in ("hidden", "layers", "intermediate", "steps", "batch_size", "log_every", "eval_batch", "score_windows"):
        if getattr(args, k) < 1:
            raise InputError(f"--{k.replace('_', '-')} must be >= 1")
    if args.vocab < 300:
        raise InputError("--vocab must be >= 300 (256 bytes, 3 specials, some merges)")
    for k in ("seq_len", "score_len"):
        if not 2 <= getattr(args, k) <= args.max_pos:
            raise InputError(f"--{k.replace('_', '-')} must be in 2..--max-pos ({args.max_pos})")
    return args


# ------------------------------------------------------------------------------------------------------------
# tokenizer


def train_tokenizer(docs, vocab):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(unk_token=SPECIALS[UNK]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", BOS)])
    return tok


def save_tokenizer(tok, out, max_pos):
    """tokenizer.json + the transformers files, then checked through AutoTokenizer."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    for i, s in enumerate(SPECIALS):
        if tok.token_to_id(s) != i:
            raise CheckError(f"tokenizer: {s} has id {tok.token_to_id(s)}, want {i}")
    # add_bos_token / add_eos_token: transformers 5 rebuilds the post-processor from them when they are in
    # tokenizer_config.json (and would drop the BOS if they were saved as false); 4.x keeps tokenizer.json's.
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=SPECIALS[UNK], bos_token=SPECIALS[BOS],
                                   eos_token=SPECIALS[EOS], add_bos_token=True, add_eos_token=False,
                                   clean_up_tokenization_spaces=False, model_max_length=max_pos, padding_side="right")
    fast.save_pretrained(out)
    stm = os.path.join(out, "special_tokens_map.json")
    if not os.path.isfile(stm):  # transformers 5 keeps them in tokenizer_config.json only; older loaders read this
        with open(stm, "w") as f:
            json.dump({"bos_token": SPECIALS[BOS], "eos_token": SPECIALS[EOS], "unk_token": SPECIALS[UNK]}, f, indent=2)
    back = AutoTokenizer.from_pretrained(out)
    text = "The kref can occur anywhere within the data structure."
    ids = back.encode(text)
    if not ids or ids[0] != BOS or ids[-1] == EOS or back.bos_token_id != BOS or back.eos_token_id != EOS:
        raise CheckError(f"tokenizer check: AutoTokenizer({out}) gives {ids[:4]}..., bos {back.bos_token_id}, "
                           f"eos {back.eos_token_id}: want BOS=1 prepended, no EOS appended, eos id 2")
    if back.decode(ids, skip_special_tokens=True) != text:
        raise CheckError("tokenizer check: decode(encode(text)) != text")
    return {"class": type(back).__name__, "vocab_size": tok.get_vocab_size(), "unk_id": UNK, "bos_id": BOS,
            "eos_id": EOS, "prepends_bos": True, "tokenizer_json_sha256": sha256_file(os.path.join(out, "tokenizer.json")),
            "files": sorted(f for f in os.listdir(out) if "token" in f)}


def stream_windows(tok, docs, win):
    """[n, win] int64 array: the EOS-terminated documents' stream cut into win - 1 tokens, each after a BOS."""
    import numpy as np
    parts = []
    for i in range(0, len(docs), 256):
        for e in tok.encode_batch(docs[i:i + 256], add_special_tokens=False):
            parts.append(np.asarray(e.ids, dtype=np.int64))
            parts.append(np.asarray([EOS], dtype=np.int64))
    stream = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    n = len(stream) // (win - 1)
    body = stream[:n * (win - 1)].reshape(n, win - 1)
    return np.concatenate([np.full((n, 1), BOS, np.int64), body], axis=1), int(len(stream))


# ------------------------------------------------------------------------------------------------------------
# model, training, evaluation


def make_config(args):
    import inspect
    from transformers import LlamaConfig
    kw = dict(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
              num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
              head_dim=args.hidden // args.heads, max_position_embeddings=args.max_pos, rms_norm_eps=1e-5,
              hidden_act="silu", tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
              bos_token_id=BOS, eos_token_id=EOS, pad_token_id=None, initializer_range=0.02)
    if "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters:  # transformers 5
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    else:
        kw["rope_theta"] = 10000.0
    cfg = LlamaConfig(**kw)
    theta = getattr(cfg, "rope_theta", None) or (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta")
    if theta != 10000.0:
        raise CheckError(f"LlamaConfig did not take rope_theta 10000 (got {theta})")
    return cfg


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    t = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def train(model, data, args, dev):
    import torch
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if dev.type == "cuda" else {}))
    gen = torch.Generator().manual_seed(args.seed)
    n = data.shape[0]
    order, pos, epochs = torch.randperm(n, generator=gen), 0, 0
    step_fn = model
    if args.compile:
        step_fn = torch.compile(model)
    model.train()
    curve, acc, acc_n, last_n = [], torch.zeros((), device=dev), 0, 0
    tok_per_step = args.batch_size * args.seq_len
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = t_last = time.perf_counter()
    for step in range(args.steps):
        if pos + args.batch_size > n:
            order, pos, epochs = torch.randperm(n, generator=gen), 0, epochs + 1
        idx = order[pos:pos + args.batch_size]
        pos += args.batch_size
        x = data[idx].to(dev, non_blocking=True)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            loss = step_fn(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        acc += loss.detach().float()
        acc_n += 1
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            mean = (acc / acc_n).item()  # synchronises
            now = time.perf_counter()
            tps = acc_n * tok_per_step / (now - t_last)
            eta = (args.steps - step - 1) * (now - t0) / (step + 1)
            curve.append({"step": step + 1, "loss": mean, "lr": lr_at(step, args), "tokens_per_s": tps})
            print(f"step {step + 1:5d}/{args.steps}  loss {mean:.4f}  lr {lr_at(step, args):.2e}  "
                  f"{tps / 1e3:8.1f}k tok/s  elapsed {now - t0:6.1f}s  eta {eta:6.1f}s", flush=True)
            if not math.isfinite(mean):
                raise CheckError(f"training diverged: loss {mean} at step {step + 1}")
            acc, acc_n, last_n, t_last = torch.zeros((), device=dev), 0, acc_n, now
    wall = time.perf_counter() - t0
    return {"steps": args.steps, "tokens_seen": args.steps * tok_per_step, "wall_time_s": wall,
            "tokens_per_s": args.steps * tok_per_step / wall, "final_train_loss": curve[-1]["loss"],
            "final_train_loss_over_steps": last_n, "loss_curve": curve, "epochs_completed": epochs, "epochs_seen": args.steps * args.batch_size / n}


def window_nll(model, windows, dev, batch):
    """Per-window sum of -log p(token | before), every token after the BOS, in float64."""
    import torch
    out = []
    model.eval()
    with torch.no_grad():
        for i in range(0, windows.shape[0], batch):
            x = torch.as_tensor(windows[i:i + batch], device=dev)
            logits = model(input_ids=x).logits[:, :-1].float()
            lp = torch.log_softmax(logits, dim=-1).gather(-1, x[:, 1:].unsqueeze(-1)).squeeze(-1)
            out += (-lp.double().sum(dim=1)).tolist()
    return out


def ppl(nlls, windows):
    tokens = windows.shape[0] * (windows.shape[1] - 1)
    total = sum(nlls)
    mean = total / tokens
    return {"perplexity": math.exp(mean) if math.isfinite(mean) and mean < 700 else None, "mean_nll": mean
            if math.isfinite(mean) else None, "tokens_scored": tokens, "windows": int(windows.shape[0])}


class OutlierProbe:
    """Per-layer, per-channel max |x| of k_proj (pre- and post-RoPE) and v_proj outputs, by forward hooks."""

    def __init__(self, model, head_dim, theta):
        self.hd, self.theta, self.k, self.kr, self.v, self.handles = head_dim, theta, {}, {}, {}, []
        for i, layer in enumerate(model.model.layers):
            self.handles.append(layer.self_attn.k_proj.register_forward_hook(self._hook(i, "k")))
            self.handles.append(layer.self_attn.v_proj.register_forward_hook(self._hook(i, "v")))

    @staticmethod
    def _upd(store, i, amax):
        store[i] = amax if i not in store else store[i].maximum(amax)

    def _hook(self, i, which):
        import torch

        def hook(_mod, _inp, out):
            x = out.detach().float()
            self._upd(self.k if which == "k" else self.v, i, x.abs().amax(dim=(0, 1)))
            if which == "k":
                b, t, c = x.shape
                kh = x.view(b, t, c // self.hd, self.hd)
                inv = 1.0 / (self.theta ** (torch.arange(0, self.hd, 2, device=x.device, dtype=torch.float32) / self.hd))
                ang = torch.arange(t, device=x.device, dtype=torch.float32)[:, None] * inv[None]
                cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :]
                sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :]
                half = self.hd // 2
                rot = torch.cat([-kh[..., half:], kh[..., :half]], -1)
                self._upd(self.kr, i, (kh * cos + rot * sin).abs().amax(dim=(0, 1)).reshape(-1))
        return hook

    def close(self):
        for h in self.handles:
            h.remove()

    @staticmethod
    def summary(amax):
        a = amax.tolist()
        v = sorted(a)
        med = v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])
        top = sorted(range(len(a)), key=lambda c: -a[c])[:8]
        return {"max": v[-1], "median": med, "ratio_max_over_median": v[-1] / med if med > 0 else None,
                "channels_over_4x_median": sum(1 for a in v if a > OUTLIER_FACTOR * med), "channels": len(v),
                "top_channels": top}

    def table(self):
        return [{"layer": i, "k_pre_rope": self.summary(self.k[i]), "k_post_rope": self.summary(self.kr[i]),
                 "v": self.summary(self.v[i])} for i in sorted(self.k)]


def load_checkpoint(out, dtype, dev):
    import transformers
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    kw = {"dtype" if (major, minor) >= (4, 56) else "torch_dtype": dtype}
    return transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager", **kw).to(dev).eval()


def save_checkpoint(model, out):
    import inspect
    model.half()  # save_pretrained records the parameters' dtype in config.json (checked below)
    kw = {"safe_serialization": True} if "safe_serialization" in inspect.signature(model.save_pretrained).parameters else {}
    model.save_pretrained(out, **kw)
    path = os.path.join(out, "model.safetensors")
    if not os.path.isfile(path):
        raise CheckError(f"save_pretrained wrote no {path} (sharded?): {sorted(os.listdir(out))}")
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    if "float16" not in (str(cfg.get("dtype")), str(cfg.get("torch_dtype"))):
        raise CheckError(f"{out}/config.json does not record float16 (dtype {cfg.get('dtype')!r}, "
                           f"torch_dtype {cfg.get('torch_dtype')!r})")
    return {"path": path, "bytes": os.path.getsize(path), "sha256": sha256_file(path)}


def versions(dev):
    import numpy
    import tokenizers
    import torch
    import transformers
    v = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
         "tokenizers": tokenizers.__version__, "numpy": numpy.__version__, "cuda": torch.version.cuda,
         "device": str(dev), "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
         "host": platform.node()}
    return v


# ------------------------------------------------------------------------------------------------------------


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="make-corpus.sh's folder or its corpus.tar.xz")
    ap.add_argument("--out", required=True, help="the checkpoint folder to write")
    ap.add_argument("--variant", required=True, choices=["mha", "gqa"])
    ap.add_argument("--tokenizer", help="a folder with tokenizer.json to reuse instead of training one")
    ap.add_argument("--force", action="store_true", help="overwrite an --out that already holds a model")
    ap.add_argument("--smoke", action="store_true", help="tiny model, a few steps (tests)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    g = ap.add_argument_group("model (defaults: the issue's model; --smoke: tiny)")
    for k, h in (("hidden", "hidden size"), ("layers", "layers"), ("heads", "attention heads"),
                 ("intermediate", "MLP size"), ("vocab", "vocabulary (tokenizer and model)"),
                 ("max-pos", "max_position_embeddings")):
        g.add_argument(f"--{k}", type=int, help=f"{h} (default {DEFAULTS[k.replace('-', '_')][0]})")
    g.add_argument("--kv-heads", type=int, help="KV heads (default: --heads for mha, --heads / 3 for gqa)")
    t = ap.add_argument_group("training")
    t.add_argument("--steps", type=int, help="optimizer steps (default 3000)")
    t.add_argument("--batch-size", type=int, help="windows per step (default 64)")
    t.add_argument("--seq-len", type=int, help="window length in tokens, BOS included (default 512)")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--warmup", type=int, help="warmup steps (default min(200, steps / 10))")
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--grad-clip", type=float, default=1.0)
    t.add_argument("--log-every", type=int, help="steps between loss lines (default 50)")
    t.add_argument("--compile", action="store_true", help="torch.compile the model for training")
    e = ap.add_argument_group("evaluation and the scoring workload")
    e.add_argument("--eval-batch", type=int, help="windows per forward (default 16)")
    e.add_argument("--max-eval-windows", type=int, help="score only the first N held-out windows (default all)")
    e.add_argument("--score-out", help="workload.score JSONL to write (default OUT/heldout_score.jsonl)")
    e.add_argument("--score-windows", type=int, help="windows in the scoring workload (default 16)")
    e.add_argument("--score-len", type=int, help="tokens per scoring window, BOS included (default 512)")
    return ap.parse_args(argv)


def run(args):
    try:
        import numpy as np
        import tokenizers
        import torch
        from transformers import LlamaForCausalLM
    except ImportError as ex:
        raise InputError(f"needs torch, transformers, tokenizers and numpy ({ex}); run it where they are "
                         "installed (the GPU machine)")
    t_start = time.perf_counter()
    if os.path.exists(os.path.join(args.out, "model.safetensors")) and not args.force:
        raise InputError(f"{args.out} already holds model.safetensors (--force to overwrite)")
    if args.tokenizer and not os.path.isfile(os.path.join(args.tokenizer, "tokenizer.json")):
        raise InputError(f"--tokenizer {args.tokenizer}: no tokenizer.json there")
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    if dev.type == "cuda":
        torch.cuda.manual_seed_all(args.seed)  # TF32 stays off: the fp32 perplexities are fp32
    os.makedirs(args.out, exist_ok=True)
    report = {"what": "issue 44 small Llama", "args": vars(args).copy(), "seed": args.seed, "versions": versions(dev)}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = open_corpus(args.corpus, tmp)
        man = os.path.join(corpus, "MANIFEST.json")
        train_docs = read_documents(os.path.join(corpus, "train.txt"))
        held_docs = read_documents(os.path.join(corpus, "heldout.txt"))
        report["corpus"] = {"path": os.path.abspath(args.corpus), "manifest_sha256": sha256_file(man) if os.path.isfile(man) else None,
                            "train_txt_sha256": sha256_file(os.path.join(corpus, "train.txt")),
                            "heldout_txt_sha256": sha256_file(os.path.join(corpus, "heldout.txt")),
                            "train_documents": len(train_docs), "heldout_documents": len(held_docs),
                            "train_chars": sum(map(len, train_docs)), "heldout_chars": sum(map(len, held_docs))}
    if not train_docs or not held_docs:
        raise InputError(f"--corpus {args.corpus}: train.txt or heldout.txt holds no document")

    t0 = time.perf_counter()
    if args.tokenizer:
        tok = tokenizers.Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
        source = {"reused": os.path.abspath(args.tokenizer)}
    else:
        tok = train_tokenizer(train_docs, args.vocab)
        source = {"trained_on": "train.txt", "requested_vocab": args.vocab}
    if tok.get_vocab_size() > args.vocab:
        raise InputError(f"the tokenizer has {tok.get_vocab_size()} tokens, more than --vocab {args.vocab}")
    report["tokenizer"] = dict(source, **save_tokenizer(tok, args.out, args.max_pos), seconds=time.perf_counter() - t0)
    print(f"tokenizer: {tok.get_vocab_size()} tokens ({time.perf_counter() - t0:.1f}s)", flush=True)

    t0 = time.perf_counter()
    train_w, train_tokens = stream_windows(tok, train_docs, args.seq_len)
    held_w, held_tokens = stream_windows(tok, held_docs, args.seq_len)
    score_w, _ = stream_windows(tok, held_docs, args.score_len)
    held_total = int(held_w.shape[0])
    if args.max_eval_windows:
        held_w = held_w[:args.max_eval_windows]
    if train_w.shape[0] < args.batch_size or held_w.shape[0] < 1 or score_w.shape[0] < args.score_windows:
        raise InputError(f"too little text: {train_w.shape[0]} train windows (batch {args.batch_size}), "
                         f"{held_w.shape[0]} held-out windows, {score_w.shape[0]} scoring windows (want {args.score_windows})")
    score_w = score_w[:args.score_windows]
    report["data"] = {"train_tokens": train_tokens, "train_windows": int(train_w.shape[0]), "heldout_tokens": held_tokens,
                      "heldout_windows": held_total, "heldout_windows_scored": int(held_w.shape[0]), "window": args.seq_len,
                      "chars_per_token_train": report["corpus"]["train_chars"] / max(1, train_tokens),
                      "layout": "EOS after every document, one stream, windows of seq_len-1 tokens each after a BOS",
                      "seconds": time.perf_counter() - t0}
    print(f"data: {train_tokens} train tokens -> {train_w.shape[0]} windows; {held_tokens} held-out tokens -> "
          f"{held_w.shape[0]} windows ({time.perf_counter() - t0:.1f}s)", flush=True)

    cfg = make_config(args)
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(cfg).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    n_embed = model.model.embed_tokens.weight.numel() + model.lm_head.weight.numel()
    report["model"] = {"variant": args.variant, "parameters": n_params, "parameters_without_embeddings": n_params - n_embed,
                       "config": cfg.to_dict()}
    print(f"model: {args.variant}, {n_params / 1e6:.2f}M parameters ({(n_params - n_embed) / 1e6:.2f}M without "
          f"embedding and head); {args.steps} steps of {args.batch_size} x {args.seq_len} tokens on {dev}", flush=True)

    data = torch.as_tensor(train_w)
    if dev.type == "cuda":
        data = data.to(dev)
    report["training"] = train(model, data, args, dev)
    report["training"].update(batch_size=args.batch_size, seq_len=args.seq_len, lr_peak=args.lr, warmup=args.warmup,
                              schedule="linear warmup, cosine to 10 % of peak", weight_decay=args.weight_decay,
                              grad_clip=args.grad_clip, autocast="bf16" if dev.type == "cuda" else "none (fp32)")
    del data

    ev = {"master_fp32": ppl(window_nll(model, held_w, dev, args.eval_batch), held_w)}
    report["files"] = {"model.safetensors": save_checkpoint(model, args.out)}
    del model
    theta = 10000.0
    m32 = load_checkpoint(args.out, torch.float32, dev)
    probe = OutlierProbe(m32, args.hidden // args.heads, theta)
    ev["checkpoint_fp32"] = ppl(window_nll(m32, held_w, dev, args.eval_batch), held_w)
    probe.close()
    score_out = args.score_out or os.path.join(args.out, "heldout_score.jsonl")
    sc = {"file": os.path.abspath(score_out), "windows": int(score_w.shape[0]), "score_len": args.score_len,
          "tokens": int(score_w.shape[0] * (score_w.shape[1] - 1)), "fp32": ppl(window_nll(m32, score_w, dev, args.eval_batch), score_w)}
    del m32
    try:
        m16 = load_checkpoint(args.out, torch.float16, dev)
        ev["checkpoint_fp16"] = ppl(window_nll(m16, held_w, dev, args.eval_batch), held_w)
        sc["fp16"] = ppl(window_nll(m16, score_w, dev, args.eval_batch), score_w)
        del m16
    except RuntimeError as ex:  # e.g. an fp16 kernel missing on this CPU
        ev["checkpoint_fp16"] = sc["fp16"] = {"error": str(ex)[:300]}
    ev["how"] = ("transformers, eager attention for the checkpoint (master: the in-memory fp32 weights, sdpa); "
                 "non-overlapping held-out windows, each BOS + seq_len-1 tokens, every token after BOS scored")
    report["heldout_eval"] = ev
    report["outliers"] = {"how": "per channel max |x| over the held-out windows scored (reloaded fp32 checkpoint); ratio = "
                                 "largest channel / median channel; count of channels > 4x the median",
                          "layers": probe.table()}
    with open(score_out, "w") as f:
        for w in score_w.tolist():
            f.write(json.dumps({"prompt": w[:1], "continuation": w[1:]}) + "\n")
    report["score_workload"] = sc
    report["total_wall_time_s"] = time.perf_counter() - t_start
    with open(os.path.join(args.out, "train_report.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
        f.write("\n")
    summary(report, args)
    return 0


def summary(r, args):
    t, ev = r["training"], r["heldout_eval"]

    def p(x):
        return f"{x['perplexity']:.3f}" if x.get("perplexity") else str(x.get("error", "n/a"))
    print(f"\n== {args.variant}: {r['model']['parameters'] / 1e6:.2f}M parameters, {t['steps']} steps, "
          f"{t['tokens_seen'] / 1e6:.1f}M tokens ({t['epochs_seen']:.2f} epochs) in {t['wall_time_s']:.1f}s "
          f"({t['tokens_per_s'] / 1e3:.0f}k tok/s) on {r['versions']['gpu'] or r['versions']['device']}")
    print(f"final train loss {t['final_train_loss']:.4f}; held-out perplexity over {ev['master_fp32']['tokens_scored']} "
          f"tokens: master fp32 {p(ev['master_fp32'])}, checkpoint fp32 {p(ev['checkpoint_fp32'])}, "
          f"fp16 {p(ev['checkpoint_fp16'])}")
    print("layer  K pre-RoPE max/med (>4x)  K post-RoPE max/med (>4x)  V max/med (>4x)")
    for L in r["outliers"]["layers"]:
        cells = [f"{L[k]['ratio_max_over_median'] or float('nan'):6.2f} ({L[k]['channels_over_4x_median']:3d})"
                 for k in ("k_pre_rope", "k_post_rope", "v")]
        print(f"{L['layer']:5d}  {cells[0]:>24}  {cells[1]:>25}  {cells[2]:>15}")
    sc = r["score_workload"]
    print(f"scoring workload: {sc['file']} ({sc['windows']} x {sc['score_len']}), transformers perplexity fp32 "
          f"{p(sc['fp32'])}, fp16 {p(sc['fp16'])}")
    print(f"model.safetensors sha256 {r['files']['model.safetensors']['sha256']} "
          f"({r['files']['model.safetensors']['bytes']} bytes); report {os.path.join(args.out, 'train_report.json')}; "
          f"total wall time {r['total_wall_time_s']:.1f}s")


def main(argv=None):
    args = parse(argv)
    try:
        return run(resolve(args))
    except InputError as ex:
        print(f"train-small-model.py: {ex}", file=sys.stderr)
        return 2
    except CheckError as ex:
        print(f"train-small-model.py: {ex}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
