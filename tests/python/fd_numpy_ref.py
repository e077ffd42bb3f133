"""Independent NumPy (float64) reference for HuggingFace LlamaForCausalLM and OPTForCausalLM.

This module is the test oracle for FastDecode's fp32 C++ reference model.  It shares no code
with the C++ side: it reads the same files (HF ``config.json`` + ``model.safetensors`` with HF
tensor names), converts every weight exactly to float64 and evaluates the textbook formulas of
the two architectures, written plainly so they can be read against the HF modelling code:

Llama (transformers ``modeling_llama``)
    h = embed_tokens[tokens]
    per layer:  h += o_proj(attn(RoPE(q_proj(n)), RoPE(k_proj(n)), v_proj(n)))  n = RMSNorm1(h)
                h += down_proj(silu(gate_proj(n)) * up_proj(n))                  n = RMSNorm2(h)
    logits = lm_head(RMSNorm_final(h))       (lm_head = embed_tokens when tie_word_embeddings)
    RMSNorm(x) = x / sqrt(mean(x^2) + eps) * w
    RoPE: inv_freq = 1 / theta^(arange(0, D, 2) / D); angle = pos * cat(inv_freq, inv_freq);
          x*cos(angle) + rotate_half(x)*sin(angle),  rotate_half([x1, x2]) = [-x2, x1]
    attention: softmax(q k^T / sqrt(D) + causal mask) v, KV heads repeated for GQA.

OPT (transformers ``modeling_opt``; do_layer_norm_before=True, i.e. pre-LayerNorm, shown; with
False (OPT-350m) each LN moves after its residual add and there is no final LN; with
word_embed_proj_dim P != H, embeddings are [V, P], project_in [H, P] follows the lookup and
project_out [P, H] precedes the head)
    h = embed_tokens[tokens] + embed_positions[pos + 2]          (HF's learned-position offset 2)
    per layer:  h += out_proj(attn((q_proj(n)) * D^-0.5, k_proj(n), v_proj(n)))  n = LN1(h)
                h += fc2(relu(fc1(n)))                                            n = LN2(h)
    logits = lm_head(LN_final(h))      (lm_head = embed_tokens unless tie_word_embeddings=false)
    LayerNorm(x) = (x - mean) / sqrt(var + 1e-5) * w + b;  all linear layers have biases.

Both models keep a simple KV cache: ``model.forward(tokens, start_pos)`` runs ``tokens`` at
positions ``start_pos, start_pos+1, ...`` against the cached keys/values of positions
``< start_pos`` and appends its own; it returns logits of shape [len(tokens), vocab].
``start_pos=0`` starts a new sequence.  A prefill followed by one-token decode steps and a single
full-sequence forward give the same logits (tests/python/test_reference_numpy.py checks this to
1e-10).

Also here: a minimal safetensors reader/writer (F32/F16/BF16/F64), ``greedy_generate`` mirroring
the ``fd-generate`` contract, and ``random_weights`` to build small in-memory test models.

Only numpy is required (works with numpy 1.24 and 2.x).
"""

from __future__ import annotations

import json
import math
import os
import struct

import numpy as np

# ----------------------------------------------------------------------------------------------
# safetensors
# ----------------------------------------------------------------------------------------------

_ST_DTYPES = {"F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
              "BF16": np.dtype("<u2")}


def bf16_bits_to_float64(bits: np.ndarray) -> np.ndarray:
    """bfloat16 (as uint16 bit patterns) -> float64, exactly: bf16 is the top half of an fp32."""
    as_u32 = bits.astype(np.uint32) << np.uint32(16)
    return as_u32.view(np.float32).astype(np.float64)


def float_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float -> bfloat16 bit patterns, round to nearest even (NaN not handled; test data only)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))
    return (rounded >> np.uint64(16)).astype(np.uint16)


def read_safetensors_header(path: str) -> tuple[dict, int]:
    """Returns (header dict without __metadata__, byte offset where the data section starts)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
    header.pop("__metadata__", None)
    return header, 8 + n


def read_safetensors_raw(path: str) -> dict[str, tuple[str, list[int], bytes]]:
    """name -> (dtype string, shape, raw little-endian bytes), for byte-level comparisons."""
    header, data_start = read_safetensors_header(path)
    with open(path, "rb") as f:
        blob = f.read()
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        out[name] = (info["dtype"], list(info["shape"]), blob[data_start + begin:data_start + end])
    return out


def load_safetensors(path: str) -> dict[str, np.ndarray]:
    """Reads every tensor of a .safetensors file as a float64 array of its stored shape."""
    tensors = {}
    for name, (dtype, shape, raw) in read_safetensors_raw(path).items():
        if dtype not in _ST_DTYPES:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dtype}")
        count = int(np.prod(shape)) if shape else 1
        arr = np.frombuffer(raw, dtype=_ST_DTYPES[dtype])
        if arr.size != count:
            raise ValueError(f"{path}: tensor {name}: {arr.size} elements for shape {shape}")
        if dtype == "BF16":
            arr = bf16_bits_to_float64(arr)
        else:
            arr = arr.astype(np.float64)
        tensors[name] = arr.reshape(shape)
    return tensors


def write_safetensors(path: str, tensors: dict[str, np.ndarray], dtype: str = "F32") -> None:
    """Writes float tensors as one safetensors file, all converted to `dtype` (F32, F16, BF16)."""
    header = {}
    chunks = []
    offset = 0
    for name in sorted(tensors):
        x = np.asarray(tensors[name])
        if dtype == "F32":
            raw = x.astype("<f4").tobytes()
        elif dtype == "F16":
            raw = x.astype("<f2").tobytes()
        elif dtype == "BF16":
            raw = float_to_bf16_bits(x).astype("<u2").tobytes()
        else:
            raise ValueError(f"unsupported dtype {dtype}")
        header[name] = {"dtype": dtype, "shape": list(x.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)  # the format pads the header to 8 bytes with spaces
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for raw in chunks:
            f.write(raw)


# ----------------------------------------------------------------------------------------------
# building blocks
# ----------------------------------------------------------------------------------------------

def linear(x, w, b=None):
    """y = x @ w^T (+ b), with w stored [out, in] as in torch.nn.Linear."""
    y = x @ w.T
    return y if b is None else y + b


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def layer_norm(x, w, b, eps):
    mean = np.mean(x, axis=-1, keepdims=True)
    var = np.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rope(x, positions, theta, inv_freq=None, scaling=1.0):
    """HF Llama rotary embedding on x [heads, T, D] at integer positions [T].  inv_freq [D/2]
    defaults to 1 / theta^(2i/D); cos and sin are multiplied by `scaling` (yarn)."""
    d = x.shape[-1]
    if inv_freq is None:
        inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    freqs = np.outer(np.asarray(positions, dtype=np.float64), inv_freq)  # [T, D/2]
    angle = np.concatenate([freqs, freqs], axis=-1)  # [T, D]
    return x * (np.cos(angle) * scaling) + rotate_half(x) * (np.sin(angle) * scaling)


def rope_parameters(config: dict) -> dict:
    """4.x rope_theta + rope_scaling ({type|rope_type, ...}) or 5.x rope_parameters ({rope_type,
    rope_theta, ...}) as one dict with rope_type and rope_theta set."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    params.setdefault("rope_theta", config.get("rope_theta") or 10000.0)
    return params


def rope_inv_freq_and_scaling(config: dict, dim: int):
    """float64 inverse frequencies [dim/2] and the cos/sin factor, from the formulas of the RoPE
    variants (transformers modeling_rope_utils.py: default, linear, dynamic below its original
    length, llama3, yarn), written out here independently of the C++ code."""
    p = rope_parameters(config)
    kind, base = p["rope_type"], float(p["rope_theta"])
    i = np.arange(0, dim, 2, dtype=np.float64)  # 2i
    inv = 1.0 / base ** (i / dim)
    if kind in ("default", "dynamic"):
        # dynamic NTK changes inv_freq only past the original length (the C++ side refuses those)
        return inv, 1.0
    factor = float(p["factor"])
    if kind == "linear":
        return inv / factor, 1.0
    if kind == "llama3":  # by wavelength: short kept, long divided, smoothed in between
        old = float(p["original_max_position_embeddings"])
        lo, hi = float(p["low_freq_factor"]), float(p["high_freq_factor"])
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - lo) / (hi - lo)
        return np.where(wavelen > old / lo, inv / factor, np.where(
            wavelen < old / hi, inv, (1 - smooth) * inv / factor + smooth * inv)), 1.0
    if kind == "yarn":
        orig = float(p.get("original_max_position_embeddings") or config["max_position_embeddings"])
        beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

        def corr_dim(rotations):  # the dimension whose wavelength fits `rotations` times in orig
            return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low, high = corr_dim(beta_fast), corr_dim(beta_slow)
        if p.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        high += 0.001 if low == high else 0.0
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
        keep = 1.0 - ramp  # weight of the unscaled (extrapolated) frequency
        out = inv / factor * (1 - keep) + inv * keep

        def mscale(scale, m=1.0):
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        att = p.get("attention_factor")
        if att is None and p.get("mscale") and p.get("mscale_all_dim"):
            att = mscale(factor, p["mscale"]) / mscale(factor, p["mscale_all_dim"])
        return out, float(mscale(factor) if att is None else att)
    raise NotImplementedError(f"rope type {kind!r}")


def causal_attention(q, k, v, start_pos, scale, window=None):
    """q [nH, T, D]; k, v [nH, S, D] holding positions 0..S-1; query i sits at start_pos + i.
    With a sliding `window` W (Mistral), query p sees keys p - W < j <= p."""
    t, s = q.shape[1], k.shape[1]
    scores = (q @ k.transpose(0, 2, 1)) * scale  # [nH, T, S]
    query_pos = start_pos + np.arange(t)[:, None]
    key_pos = np.arange(s)[None, :]
    visible = key_pos <= query_pos
    if window:
        visible &= key_pos > query_pos - window
    scores = np.where(visible, scores, -np.inf)
    return softmax(scores, axis=-1) @ v  # [nH, T, D]


def split_heads(x, n_heads):
    """[T, n*D] -> [n, T, D]"""
    t = x.shape[0]
    return x.reshape(t, n_heads, -1).transpose(1, 0, 2)


def merge_heads(x):
    """[n, T, D] -> [T, n*D]"""
    n, t, d = x.shape
    return x.transpose(1, 0, 2).reshape(t, n * d)


class KVCache:
    """Per-layer keys and values [n_kv_heads, positions, head_dim], grown by concatenation."""

    def __init__(self, n_layers):
        self.k = [None] * n_layers
        self.v = [None] * n_layers
        self.length = 0

    def update(self, layer, start_pos, k_new, v_new):
        """Keeps positions < start_pos, appends the new ones, returns the full (k, v)."""
        if start_pos == 0 or self.k[layer] is None:
            if start_pos != 0:
                raise ValueError(f"start_pos {start_pos} on an empty cache")
            k, v = k_new, v_new
        else:
            if start_pos > self.k[layer].shape[1]:
                raise ValueError(f"start_pos {start_pos} beyond cache of {self.k[layer].shape[1]}")
            k = np.concatenate([self.k[layer][:, :start_pos], k_new], axis=1)
            v = np.concatenate([self.v[layer][:, :start_pos], v_new], axis=1)
        self.k[layer], self.v[layer] = k, v
        self.length = k.shape[1]
        return k, v


def _get(tensors, name):
    if name not in tensors:
        raise KeyError(f"missing tensor {name}")
    return tensors[name]


# ----------------------------------------------------------------------------------------------
# Llama
# ----------------------------------------------------------------------------------------------

class LlamaModel:
    """Llama, and the same decoder as Mistral (sliding-window mask) and Qwen2 (q/k/v biases)."""
    model_type = "llama"

    def __init__(self, config: dict, tensors: dict[str, np.ndarray]):
        c = config
        if c.get("hidden_act", "silu") != "silu":
            raise NotImplementedError(f"hidden_act {c['hidden_act']}")
        kind = c.get("model_type", "llama")
        self.model_type = kind
        self.config = c
        self.n_layers = c["num_hidden_layers"]
        self.hidden = c["hidden_size"]
        self.n_heads = c["num_attention_heads"]
        self.n_kv_heads = c.get("num_key_value_heads") or self.n_heads
        self.head_dim = c.get("head_dim") or self.hidden // self.n_heads
        self.eps = c.get("rms_norm_eps", 1e-6)  # LlamaConfig's default
        self.inv_freq, self.rope_scaling = rope_inv_freq_and_scaling(c, self.head_dim)
        self.theta = rope_parameters(c)["rope_theta"]
        self.sliding_window = c.get("sliding_window") if kind == "mistral" else None
        if kind == "qwen2" and c.get("use_sliding_window", False):
            raise NotImplementedError("qwen2 use_sliding_window")
        # which Linear layers have biases: Llama attention_bias (q, k, v, o) / mlp_bias (gate, up,
        # down); Qwen2 q, k, v always; Mistral none
        biased = set()
        if kind == "llama" and c.get("attention_bias", False):
            biased |= {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"}
        if kind == "llama" and c.get("mlp_bias", False):
            biased |= {"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}
        if kind == "qwen2":
            biased |= {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}
        self.vocab = c["vocab_size"]
        self.embed = _get(tensors, "model.embed_tokens.weight")
        self.layers = []
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            layer = {
                name: _get(tensors, p + name + ".weight") for name in (
                    "input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                    "self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj",
                    "mlp.up_proj", "mlp.down_proj")}
            for name in list(layer):
                layer[name + ".bias"] = _get(tensors, p + name + ".bias") if name in biased else None
            self.layers.append(layer)
        self.norm = _get(tensors, "model.norm.weight")
        if c.get("tie_word_embeddings", False):  # LlamaConfig's default is untied
            self.lm_head = self.embed
        else:
            self.lm_head = _get(tensors, "lm_head.weight")
        self.cache = KVCache(self.n_layers)

    def forward(self, tokens, start_pos: int) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.int64)
        positions = start_pos + np.arange(len(tokens))
        group = self.n_heads // self.n_kv_heads
        h = self.embed[tokens]  # [T, H]

        def lin(w, name, x):
            return linear(x, w[name], w[name + ".bias"])

        for i, w in enumerate(self.layers):
            x = rms_norm(h, w["input_layernorm"], self.eps)
            q = split_heads(lin(w, "self_attn.q_proj", x), self.n_heads)
            k = split_heads(lin(w, "self_attn.k_proj", x), self.n_kv_heads)
            v = split_heads(lin(w, "self_attn.v_proj", x), self.n_kv_heads)
            q = rope(q, positions, self.theta, self.inv_freq, self.rope_scaling)
            k = rope(k, positions, self.theta, self.inv_freq, self.rope_scaling)
            k_all, v_all = self.cache.update(i, start_pos, k, v)
            # GQA: query head j reads KV head j // group (HF repeat_kv)
            k_all = np.repeat(k_all, group, axis=0)
            v_all = np.repeat(v_all, group, axis=0)
            a = causal_attention(q, k_all, v_all, start_pos, 1.0 / math.sqrt(self.head_dim),
                                 self.sliding_window)
            h = h + lin(w, "self_attn.o_proj", merge_heads(a))
            x = rms_norm(h, w["post_attention_layernorm"], self.eps)
            m = silu(lin(w, "mlp.gate_proj", x)) * lin(w, "mlp.up_proj", x)
            h = h + lin(w, "mlp.down_proj", m)
        return linear(rms_norm(h, self.norm, self.eps), self.lm_head)


# ----------------------------------------------------------------------------------------------
# OPT
# ----------------------------------------------------------------------------------------------

class OPTModel:
    model_type = "opt"
    POSITION_OFFSET = 2  # HF OPTLearnedPositionalEmbedding.offset
    LN_EPS = 1e-5  # torch.nn.LayerNorm default, used by HF OPT

    def __init__(self, config: dict, tensors: dict[str, np.ndarray]):
        c = config
        # do_layer_norm_before=false (OPT-350m): LayerNorm after each residual add, no final LN
        self.pre_ln = c.get("do_layer_norm_before", True)
        if c.get("_remove_final_layer_norm", False):
            raise NotImplementedError("_remove_final_layer_norm")
        if c.get("activation_function", "relu") != "relu":
            raise NotImplementedError(f"activation {c['activation_function']}")
        if not c.get("enable_bias", True) or not c.get("layer_norm_elementwise_affine", True):
            raise NotImplementedError("OPT without biases / affine LayerNorm")
        # word_embed_proj_dim P != hidden_size: embeddings [V, P], project_in [H, P] after the
        # lookup, project_out [P, H] before the head
        self.proj = c.get("word_embed_proj_dim", c["hidden_size"]) != c["hidden_size"]
        self.config = c
        self.n_layers = c["num_hidden_layers"]
        self.hidden = c["hidden_size"]
        self.n_heads = c["num_attention_heads"]
        self.head_dim = self.hidden // self.n_heads
        self.vocab = c["vocab_size"]
        p = "model.decoder."
        self.embed = _get(tensors, p + "embed_tokens.weight")
        self.embed_positions = _get(tensors, p + "embed_positions.weight")
        self.layers = []
        for i in range(self.n_layers):
            lp = f"{p}layers.{i}."
            self.layers.append({
                f"{name}.{wb}": _get(tensors, f"{lp}{name}.{wb}") for name in (
                    "self_attn_layer_norm", "self_attn.q_proj", "self_attn.k_proj",
                    "self_attn.v_proj", "self_attn.out_proj", "final_layer_norm", "fc1", "fc2")
                for wb in ("weight", "bias")})
        if self.pre_ln:
            self.final_ln_w = _get(tensors, p + "final_layer_norm.weight")
            self.final_ln_b = _get(tensors, p + "final_layer_norm.bias")
        if self.proj:
            self.project_in = _get(tensors, p + "project_in.weight")
            self.project_out = _get(tensors, p + "project_out.weight")
        if c.get("tie_word_embeddings", True):  # PretrainedConfig's default: tied
            self.lm_head = self.embed
        else:
            self.lm_head = _get(tensors, "lm_head.weight")
        self.cache = KVCache(self.n_layers)

    def forward(self, tokens, start_pos: int) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.int64)
        positions = start_pos + np.arange(len(tokens))
        e = self.embed[tokens]
        if self.proj:
            e = linear(e, self.project_in)
        h = e + self.embed_positions[positions + self.POSITION_OFFSET]

        def ln(x, w, name):
            return layer_norm(x, w[name + ".weight"], w[name + ".bias"], self.LN_EPS)

        for i, w in enumerate(self.layers):
            x = ln(h, w, "self_attn_layer_norm") if self.pre_ln else h
            q = linear(x, w["self_attn.q_proj.weight"], w["self_attn.q_proj.bias"])
            q = q * self.head_dim ** -0.5
            k = linear(x, w["self_attn.k_proj.weight"], w["self_attn.k_proj.bias"])
            v = linear(x, w["self_attn.v_proj.weight"], w["self_attn.v_proj.bias"])
            q, k, v = (split_heads(t, self.n_heads) for t in (q, k, v))
            k_all, v_all = self.cache.update(i, start_pos, k, v)
            a = causal_attention(q, k_all, v_all, start_pos, 1.0)  # q already scaled
            h = h + linear(merge_heads(a), w["self_attn.out_proj.weight"],
                           w["self_attn.out_proj.bias"])
            if not self.pre_ln:
                h = ln(h, w, "self_attn_layer_norm")
            x = ln(h, w, "final_layer_norm") if self.pre_ln else h
            m = np.maximum(linear(x, w["fc1.weight"], w["fc1.bias"]), 0.0)
            h = h + linear(m, w["fc2.weight"], w["fc2.bias"])
            if not self.pre_ln:
                h = ln(h, w, "final_layer_norm")
        if self.pre_ln:
            h = layer_norm(h, self.final_ln_w, self.final_ln_b, self.LN_EPS)
        if self.proj:
            h = linear(h, self.project_out)
        return linear(h, self.lm_head)


# ----------------------------------------------------------------------------------------------
# entry points
# ----------------------------------------------------------------------------------------------

def build_model(config: dict, tensors: dict[str, np.ndarray]):
    model_type = config.get("model_type")
    if model_type in ("llama", "mistral", "qwen2"):
        return LlamaModel(config, tensors)
    if model_type == "opt":
        return OPTModel(config, tensors)
    raise NotImplementedError(f"model_type {model_type!r}")


def load_model(model_dir: str):
    """Loads DIR/config.json and DIR/model.safetensors (or the shards listed in
    DIR/model.safetensors.index.json) into a float64 Llama or OPT model."""
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index) and not os.path.exists(os.path.join(model_dir, "model.safetensors")):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            tensors.update(load_safetensors(os.path.join(model_dir, shard)))
        if set(weight_map) - set(tensors):
            raise KeyError(f"{index}: tensors not in their shards: {sorted(set(weight_map) - set(tensors))[:5]}")
    else:
        tensors = load_safetensors(os.path.join(model_dir, "model.safetensors"))
    return build_model(config, tensors)


def greedy_generate(model, prompt, steps: int):
    """fd-generate's contract: prefill then steps-1 one-token decodes.

    Returns (generated [steps] ints, logits [steps, vocab]); logits row 0 is at the last prompt
    position, row i after feeding generated[i-1]; generated[i] = argmax(row i).
    """
    rows = [model.forward(prompt, 0)[-1]]
    generated = [int(np.argmax(rows[0]))]
    for i in range(1, steps):
        rows.append(model.forward([generated[-1]], len(prompt) + i - 1)[-1])
        generated.append(int(np.argmax(rows[-1])))
    return generated, np.stack(rows)


def teacher_forced_logits(model, prompt, generated):
    """Logits rows as fd-generate would produce them for `generated`, from one causal forward
    over prompt + generated[:-1]: rows len(prompt)-1 ... end.  Shape [len(generated), vocab]."""
    tokens = list(prompt) + list(generated[:-1])
    return model.forward(tokens, 0)[len(prompt) - 1:]


def expected_tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """HF tensor names and shapes of a checkpoint for `config` (the fd-weights contract)."""
    c = config
    n_layers, h, v = c["num_hidden_layers"], c["hidden_size"], c["vocab_size"]
    shapes: dict[str, tuple[int, ...]] = {}
    if c["model_type"] in ("llama", "mistral", "qwen2"):
        kind = c["model_type"]
        attn_bias = (kind == "llama" and c.get("attention_bias", False)) or kind == "qwen2"
        o_bias = kind == "llama" and c.get("attention_bias", False)
        mlp_bias = kind == "llama" and c.get("mlp_bias", False)
        n_heads = c["num_attention_heads"]
        n_kv = c.get("num_key_value_heads") or n_heads
        d = c.get("head_dim") or h // n_heads
        inter = c["intermediate_size"]
        shapes["model.embed_tokens.weight"] = (v, h)
        for i in range(n_layers):
            p = f"model.layers.{i}."
            shapes[p + "input_layernorm.weight"] = (h,)
            shapes[p + "self_attn.q_proj.weight"] = (n_heads * d, h)
            shapes[p + "self_attn.k_proj.weight"] = (n_kv * d, h)
            shapes[p + "self_attn.v_proj.weight"] = (n_kv * d, h)
            shapes[p + "self_attn.o_proj.weight"] = (h, n_heads * d)
            shapes[p + "post_attention_layernorm.weight"] = (h,)
            shapes[p + "mlp.gate_proj.weight"] = (inter, h)
            shapes[p + "mlp.up_proj.weight"] = (inter, h)
            shapes[p + "mlp.down_proj.weight"] = (h, inter)
            for proj, on in (("q", attn_bias), ("k", attn_bias), ("v", attn_bias), ("o", o_bias)):
                if on:  # a Linear's bias has its out_features
                    shapes[f"{p}self_attn.{proj}_proj.bias"] = (shapes[f"{p}self_attn.{proj}_proj.weight"][0],)
            for proj in ("gate", "up", "down") if mlp_bias else ():
                shapes[f"{p}mlp.{proj}_proj.bias"] = (shapes[f"{p}mlp.{proj}_proj.weight"][0],)
        shapes["model.norm.weight"] = (h,)
        if not c.get("tie_word_embeddings", False):
            shapes["lm_head.weight"] = (v, h)
    elif c["model_type"] == "opt":
        f = c["ffn_dim"]
        p = "model.decoder."
        e = c.get("word_embed_proj_dim", h)
        shapes[p + "embed_tokens.weight"] = (v, e)
        shapes[p + "embed_positions.weight"] = (c["max_position_embeddings"] + 2, h)
        if e != h:
            shapes[p + "project_in.weight"] = (h, e)
            shapes[p + "project_out.weight"] = (e, h)
        for i in range(n_layers):
            lp = f"{p}layers.{i}."
            for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                shapes[f"{lp}self_attn.{proj}.weight"] = (h, h)
                shapes[f"{lp}self_attn.{proj}.bias"] = (h,)
            for ln in ("self_attn_layer_norm", "final_layer_norm"):
                shapes[f"{lp}{ln}.weight"] = (h,)
                shapes[f"{lp}{ln}.bias"] = (h,)
            shapes[lp + "fc1.weight"] = (f, h)
            shapes[lp + "fc1.bias"] = (f,)
            shapes[lp + "fc2.weight"] = (h, f)
            shapes[lp + "fc2.bias"] = (h,)
        if c.get("do_layer_norm_before", True):
            shapes[p + "final_layer_norm.weight"] = (h,)
            shapes[p + "final_layer_norm.bias"] = (h,)
        if not c.get("tie_word_embeddings", True):
            shapes["lm_head.weight"] = (v, e)
    else:
        raise NotImplementedError(c["model_type"])
    return shapes


def random_weights(config: dict, seed: int, std: float | None = None) -> dict[str, np.ndarray]:
    """Random float32 weights for `config` (independent of fd-weights; for self-tests and for
    checking this module against HF).  Norm weights ~ 1 + N(0, 0.1^2), biases ~ N(0, 0.1^2),
    matrices ~ N(0, std^2) with std = 1/sqrt(fan_in) (shape[1]) unless `std` is given, which keeps
    activations and logits O(1) at any size."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in expected_tensor_shapes(config).items():
        x = rng.standard_normal(shape)
        if len(shape) == 2:
            x = x * (std if std is not None else 1.0 / math.sqrt(shape[1]))
        elif "norm" in name and name.endswith(".weight"):
            x = 1.0 + 0.1 * x
        else:
            x = 0.1 * x
        out[name] = x.astype(np.float32)
    return out
