#!/usr/bin/env python3
"""Cross-check FastDecode's fp32 C++ reference model against HuggingFace transformers.

Run on the GPU machine (needs torch, transformers, numpy; no network):

    python3 tests/gpu/hf_crosscheck.py --out results/hf_crosscheck.json
    python3 tests/gpu/hf_crosscheck.py --models tiny-opt,llama-2-7b:2 --out x.json
    python3 tests/gpu/hf_crosscheck.py --zoo --out results/hf_crosscheck_zoo.json

For each model spec NAME[:LAYERS] (NAME = experiments/models/NAME.json, or a path to a config):

1. ``fd-weights random --model CONFIG --seed S --dtype fp16 [--layers N] --out W`` and
   ``fd-generate --weights W --prompt P --steps 32 --out G``, with P = 16 token ids drawn in
   [3, vocab) by numpy.random.default_rng(S).  (``--candidate numpy`` instead writes random
   weights with fd_numpy_ref.random_weights and runs the float64 NumPy model in place of
   fd-generate, to check the harness and the NumPy oracle before the C++ programs exist.)
2. loads W with ``transformers.AutoModelForCausalLM.from_pretrained(W, dtype=torch.float32,
   attn_implementation="eager")`` on the GPU (TF32 off, float32 matmul precision "highest");
   missing / unexpected checkpoint keys are an error.
3. one forward over prompt + generated[:-1] (teacher forcing on the candidate's tokens); rows
   len(prompt)-1 ... are compared with logits.npy element-wise:
       pass  <=>  |cand - hf| <= ATOL + RTOL * |hf| everywhere,  ATOL = RTOL = 1e-3 (options)
   reported: max abs err, max rel err (err / max(|hf|, 1e-6)), max err/tolerance, first bad
   (row, index).
4. HF greedy ``generate(max_new_tokens=32, do_sample=False)`` from the prompt (EOS stopping
   disabled, pad_token_id set): whether its tokens equal fd-generate's, and at the first
   divergence the logit margins between the two tokens in both models.  A divergence is
   reported, not failed: random models have near-ties, and the logits check above is the gate.
5. unless --no-numpy: the float64 NumPy model (tests/python/fd_numpy_ref.py) on the same
   weights and tokens, compared with HF under the same tolerance (checks the CI oracle itself).

Writes one JSON file (--out) with per-model results and provenance (date, versions, GPU, CPU,
git commit, command line, binary hashes), prints a table, and exits 1 if any model fails a
tolerance or errors.  Each model runs in its own try/except: one failure does not stop the
others.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
MODELS_DIR = REPO_ROOT / "experiments" / "models"
sys.path.insert(0, str(REPO_ROOT / "tests" / "python"))

DEFAULT_MODELS = "tiny-llama,tiny-llama-gqa,tiny-opt,llama-2-7b:2,llama-3-8b:2"
# --zoo: every published model of experiments/models/ (README.md there) at 1-2 layers. The 5.x-form
# config (llama-3.1-8b-v5) needs transformers >= 5 to be read as llama3 RoPE; with 4.x it is expected
# to fail the logits check (4.x ignores rope_parameters), which the report then shows.
ZOO_MODELS = ("llama-2-7b:1,llama-2-13b:1,llama-3-8b:1,llama-3.1-8b:1,llama-3.1-8b-v5:1,llama-3.2-1b:2,"
              "mistral-7b-v0.1:1,qwen2.5-0.5b:2,vicuna-7b-v1.5-16k:1,opt-125m:2,opt-350m:2,opt-175b:1")
ZOO_SHARD_GB = 0.5
HF_DTYPE = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------

def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(args, timeout=1800) -> None:
    args = [str(a) for a in args]
    log("$ " + shlex.join(args))
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {shlex.join(args)}\n--- stdout ---\n"
                           f"{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}")


def parse_spec(spec: str) -> tuple[str, Path, int | None]:
    """'NAME[:LAYERS]' -> (label, config path, layers or None)."""
    name, _, layers = spec.partition(":")
    path = Path(name) if name.endswith(".json") else MODELS_DIR / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"model config {path} not found")
    return spec, path, int(layers) if layers else None


def compare(cand: np.ndarray, hf: np.ndarray, atol: float, rtol: float) -> dict:
    """Element-wise |cand - hf| <= atol + rtol*|hf|; returns numbers for the report."""
    cand = np.asarray(cand, dtype=np.float64)
    hf = np.asarray(hf, dtype=np.float64)
    if cand.shape != hf.shape:
        return {"pass": False, "error": f"shape {cand.shape} vs HF {hf.shape}"}
    err = np.abs(cand - hf)
    ratio = err / (atol + rtol * np.abs(hf))
    bad = np.argwhere(~(ratio <= 1.0))
    out = {
        "pass": bool(len(bad) == 0),
        "max_abs_err": float(np.nanmax(err)),
        "max_rel_err": float(np.nanmax(err / np.maximum(np.abs(hf), 1e-6))),
        "max_err_over_tol": float(np.nanmax(ratio)),
        "n_bad": int(len(bad)),
        "max_abs_logit": float(np.max(np.abs(hf))),
        "max_abs_err_per_row": [float(v) for v in np.nanmax(err, axis=1)],
    }
    if len(bad):
        r, i = (int(v) for v in bad[0])
        out["first_bad"] = {"row": r, "index": i, "candidate": float(cand[r, i]),
                            "hf": float(hf[r, i])}
    return out


def top2_margin(row: np.ndarray) -> float:
    top = np.sort(np.asarray(row, dtype=np.float64))[-2:]
    return float(top[1] - top[0])


def provenance(argv) -> dict:
    import torch
    import transformers

    def git(*a):
        try:
            return subprocess.run(["git", "-C", str(REPO_ROOT), *a], capture_output=True,
                                  text=True, timeout=30, check=True).stdout.strip()
        except Exception:  # noqa: BLE001 - provenance is best effort
            return None

    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import safetensors
        st_version = safetensors.__version__
    except Exception:  # noqa: BLE001
        st_version = None
    status = git("status", "--porcelain")
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, str(Path(__file__).resolve()), *argv]),
        "host": platform.node(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "safetensors": st_version,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        # FD_GIT_COMMIT names the commit of a tree copied to another machine; when set it wins over
        # the copy's own .git, which may be stale (as harness/provenance.cpp).
        "git_commit": os.environ.get("FD_GIT_COMMIT") or git("rev-parse", "--verify", "-q", "HEAD") or None,
        "git_dirty": None if os.environ.get("FD_GIT_COMMIT") or status is None
        or not git("rev-parse", "--verify", "-q", "HEAD") else bool(status),
    }


def sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


# ----------------------------------------------------------------------------------------------
# HF side
# ----------------------------------------------------------------------------------------------

def load_hf(model_dir: Path, device: str):
    import torch
    from transformers import AutoModelForCausalLM

    kwargs = dict(attn_implementation="eager", output_loading_info=True)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                           **kwargs)
    except TypeError:  # transformers < 4.56 calls it torch_dtype
        model, info = AutoModelForCausalLM.from_pretrained(str(model_dir),
                                                           torch_dtype=torch.float32, **kwargs)
    info = {k: sorted(map(str, v)) if isinstance(v, (list, set, tuple)) else str(v)
            for k, v in dict(info).items()}
    if info.get("missing_keys") or info.get("unexpected_keys") or info.get("mismatched_keys"):
        raise RuntimeError(f"HF checkpoint keys do not match the model: {info}")
    model = model.to(device).eval()
    for p in model.parameters():
        if p.dtype != torch.float32:
            raise RuntimeError(f"HF parameter dtype {p.dtype}, expected float32")
    return model, info


def hf_forward(model, tokens, device) -> np.ndarray:
    import torch
    ids = torch.tensor([tokens], dtype=torch.long, device=device)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=False)
    return out.logits[0].double().cpu().numpy()


def hf_generate(model, prompt, steps, device, pad_token_id) -> tuple[list[int], np.ndarray]:
    import torch
    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    # generate() falls back to the model's generation_config for any field left at its global
    # default, so EOS stopping is switched off on the model's own generation_config.
    gc = model.generation_config
    gc.eos_token_id = None
    gc.forced_eos_token_id = None
    gc.forced_bos_token_id = None
    gc.pad_token_id = pad_token_id
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps,
                             min_new_tokens=None, do_sample=False, num_beams=1,
                             pad_token_id=pad_token_id, eos_token_id=None, use_cache=True,
                             return_dict_in_generate=True, output_logits=True)
    tokens = [int(t) for t in out.sequences[0, len(prompt):].tolist()]
    logits = np.stack([s[0].double().cpu().numpy() for s in out.logits])
    return tokens, logits


# ----------------------------------------------------------------------------------------------
# one model
# ----------------------------------------------------------------------------------------------

def make_candidate(args, config_path, layers, seed, wdir: Path, gdir: Path, prompt) -> dict:
    """Writes weights to wdir and result.json + logits.npy to gdir; returns the file contents."""
    import fd_numpy_ref as ref

    if args.candidate == "fd":
        cmd = [args.bin_dir / "fd-weights", "random", "--model", config_path, "--seed", seed,
               "--dtype", args.dtype, "--out", wdir]
        if layers is not None:
            cmd += ["--layers", layers]
        if args.max_shard_gb is not None:  # sharded checkpoint + model.safetensors.index.json
            cmd += ["--max-shard-gb", args.max_shard_gb]
        run(cmd)
        run([args.bin_dir / "fd-generate", "--weights", wdir, "--prompt",
             ",".join(map(str, prompt)), "--steps", args.steps, "--out", gdir])
    else:  # numpy stands in for both programs
        config = json.loads(Path(config_path).read_text())
        if layers is not None:
            config["num_hidden_layers"] = layers
        config["torch_dtype"] = HF_DTYPE[args.dtype]
        wdir.mkdir(parents=True, exist_ok=True)
        gdir.mkdir(parents=True, exist_ok=True)
        (wdir / "config.json").write_text(json.dumps(config, indent=2))
        st = {"fp16": "F16", "bf16": "BF16", "fp32": "F32"}[args.dtype]
        ref.write_safetensors(str(wdir / "model.safetensors"), ref.random_weights(config, seed),
                              st)
        log("numpy candidate: greedy generate")
        gen, logits = ref.greedy_generate(ref.load_model(str(wdir)), prompt, args.steps)
        (gdir / "result.json").write_text(json.dumps(
            {"prompt": prompt, "generated": gen, "model_type": config["model_type"]}))
        np.save(gdir / "logits.npy", logits.astype(np.float32))
    result = json.loads((gdir / "result.json").read_text())
    logits = np.load(gdir / "logits.npy")
    gen = result["generated"]
    if result.get("prompt") != prompt:
        raise RuntimeError(f"result.json prompt {result.get('prompt')} != {prompt}")
    if len(gen) != args.steps or logits.shape[0] != args.steps:
        raise RuntimeError(f"{len(gen)} tokens / {logits.shape} logits for {args.steps} steps")
    return {"generated": [int(t) for t in gen], "logits": logits,
            "model_type": result.get("model_type")}


def check_model(args, spec: str, seed: int, device: str) -> dict:
    import torch
    import fd_numpy_ref as ref

    label, config_path, layers = parse_spec(spec)
    src = json.loads(config_path.read_text())
    vocab = src["vocab_size"]
    prompt = [int(t) for t in np.random.default_rng(seed).integers(3, vocab, size=args.prompt_len)]
    base = args.work_dir / label.replace(":", "_L").replace("/", "_")
    if base.exists():
        shutil.rmtree(base)
    wdir, gdir = base / "weights", base / "gen"
    res: dict = {"model": label, "config": str(config_path), "layers": layers,
                 "model_type": src["model_type"], "seed": seed, "dtype": args.dtype,
                 "candidate": args.candidate, "prompt": prompt, "steps": args.steps}

    t0 = time.time()
    cand = make_candidate(args, config_path, layers, seed, wdir, gdir, prompt)
    res["candidate_seconds"] = round(time.time() - t0, 2)
    res["generated"] = cand["generated"]
    if cand["model_type"] != src["model_type"]:
        raise RuntimeError(f"result.json model_type {cand['model_type']!r}")

    t0 = time.time()
    model, info = load_hf(wdir, device)
    res["hf_class"] = type(model).__name__
    emb = model.get_input_embeddings().weight
    res["hf_lm_head_tied"] = bool(model.get_output_embeddings().weight.data_ptr() ==
                                  emb.data_ptr())
    tokens = prompt + cand["generated"][:-1]
    hf_rows = hf_forward(model, tokens, device)[len(prompt) - 1:]
    res["logits"] = compare(cand["logits"], hf_rows, args.atol, args.rtol)

    pad = src.get("pad_token_id")
    hf_tokens, hf_gen_logits = hf_generate(model, prompt, args.steps, device,
                                           pad if pad is not None else 0)
    res["hf_seconds"] = round(time.time() - t0, 2)
    res["hf_generated"] = hf_tokens
    greedy = {"identical": hf_tokens == cand["generated"], "hf_length": len(hf_tokens)}
    div = next((i for i, (a, b) in enumerate(zip(hf_tokens, cand["generated"])) if a != b), None)
    if div is None and len(hf_tokens) != len(cand["generated"]):
        div = min(len(hf_tokens), len(cand["generated"]))
    if div is not None:
        greedy["first_divergence"] = div
        if div < min(len(hf_tokens), len(cand["generated"])):
            c_tok, h_tok = cand["generated"][div], hf_tokens[div]
            c_row = cand["logits"][div].astype(np.float64)
            greedy.update({
                "candidate_token": c_tok, "hf_token": h_tok,
                # how much the candidate prefers its token over HF's (>= 0), and vice versa
                "candidate_margin": float(c_row[c_tok] - c_row[h_tok]),
                "hf_margin": float(hf_gen_logits[div][h_tok] - hf_gen_logits[div][c_tok]),
                "candidate_top2_margin": top2_margin(c_row),
            })
    # the candidate's own argmax consistency
    greedy["candidate_tokens_are_argmax"] = (
        [int(i) for i in np.argmax(cand["logits"], axis=1)] == cand["generated"])
    res["greedy"] = greedy

    if not args.no_numpy:
        t0 = time.time()
        np_model = ref.load_model(str(wdir))
        np_rows = ref.teacher_forced_logits(np_model, prompt, cand["generated"])
        del np_model
        res["numpy_vs_hf"] = compare(np_rows, hf_rows, args.atol, args.rtol)
        res["numpy_vs_candidate"] = compare(cand["logits"], np_rows, args.atol, args.rtol)
        res["numpy_seconds"] = round(time.time() - t0, 2)

    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    res["pass"] = bool(res["logits"]["pass"] and
                       (args.no_numpy or res["numpy_vs_hf"]["pass"]) and
                       greedy["candidate_tokens_are_argmax"])
    return res


# ----------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------

def print_table(results) -> None:
    head = ("model", "cand", "max_abs", "max_rel", "err/tol", "tokens", "diverge@(c/hf margin)",
            "numpy~hf", "result")
    rows = []
    for r in results:
        if "error" in r:
            rows.append((r["model"], r.get("candidate", "?"), "-", "-", "-", "-", "-", "-",
                         "ERROR: " + r["error"].splitlines()[0][:60]))
            continue
        lg, g = r["logits"], r["greedy"]
        if g["identical"]:
            div = "-"
        elif "candidate_margin" in g:
            div = (f"{g['first_divergence']} ({g['candidate_margin']:.1e}/"
                   f"{g['hf_margin']:.1e})")
        else:
            div = f"{g.get('first_divergence')} (length)"
        nh = r.get("numpy_vs_hf")
        rows.append((r["model"], r["candidate"], f"{lg.get('max_abs_err', float('nan')):.2e}",
                     f"{lg.get('max_rel_err', float('nan')):.2e}",
                     f"{lg.get('max_err_over_tol', float('nan')):.2e}",
                     "same" if g["identical"] else "DIFFER", div,
                     "-" if nh is None else f"{nh['max_abs_err']:.1e} "
                                            f"{'ok' if nh['pass'] else 'FAIL'}",
                     "PASS" if r["pass"] else "FAIL"))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    for row in (head, *rows):
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(
        description="Compare FastDecode's fp32 reference (fd-weights + fd-generate) with "
                    "HuggingFace transformers (fp32, eager attention, TF32 off) logits and "
                    "greedy tokens.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--models", default=DEFAULT_MODELS,
                    help="comma-separated NAME[:LAYERS]; NAME is experiments/models/NAME.json "
                         "or a path to a config .json; LAYERS reduces num_hidden_layers")
    ap.add_argument("--out", type=Path, required=True, help="JSON results file to write")
    ap.add_argument("--bin-dir", type=Path,
                    default=Path(os.environ.get("FD_BIN_DIR") or
                                 REPO_ROOT / "build" / "default" / "bin"),
                    help="directory with fd-weights and fd-generate ($FD_BIN_DIR)")
    ap.add_argument("--candidate", choices=("fd", "numpy"), default="fd",
                    help="fd: the C++ programs; numpy: fd_numpy_ref writes random weights and "
                         "generates (checks the harness and the NumPy oracle without binaries)")
    ap.add_argument("--seed", type=int, default=1234, help="base seed; model i uses seed + i")
    ap.add_argument("--dtype", choices=("fp16", "bf16", "fp32"), default="fp16",
                    help="stored weight dtype (all compute is fp32/fp64)")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance (fp32 vs fp32; measured max error ~1.5e-5 on llama-3-8b shapes)")
    ap.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance")
    ap.add_argument("--device", default=None, help="torch device (default: cuda if available)")
    ap.add_argument("--no-numpy", action="store_true",
                    help="skip the float64 NumPy model (it needs ~4x the weights in host RAM)")
    ap.add_argument("--work-dir", type=Path, default=None,
                    help="where weights/outputs go (default: a temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep weights and outputs")
    ap.add_argument("--max-shard-gb", type=float, default=None,
                    help="passed to fd-weights random: write model-0000k-of-0000n.safetensors "
                         "shards of at most G GB and model.safetensors.index.json")
    ap.add_argument("--zoo", action="store_true",
                    help=f"check the zoo: --models {ZOO_MODELS} with --max-shard-gb {ZOO_SHARD_GB} "
                         "unless given")
    args = ap.parse_args(argv)
    if args.zoo:
        if args.models != DEFAULT_MODELS:
            ap.error("--zoo and --models are exclusive")
        args.models = ZOO_MODELS
        if args.max_shard_gb is None:
            args.max_shard_gb = ZOO_SHARD_GB

    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")

    tmp = None
    if args.work_dir is None:
        tmp = tempfile.mkdtemp(prefix="fd_hf_crosscheck_")
        args.work_dir = Path(tmp)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    args.bin_dir = args.bin_dir.resolve()

    prov = provenance(argv)
    prov.update({"device": device, "tf32": False, "atol": args.atol, "rtol": args.rtol,
                 "candidate": args.candidate})
    if args.candidate == "fd":
        prov["binaries"] = {p: {"path": str(args.bin_dir / p),
                                "sha256": sha256(args.bin_dir / p)}
                            for p in ("fd-weights", "fd-generate")}
    log(f"device {device} ({prov['gpu']}), torch {prov['torch']}, "
        f"transformers {prov['transformers']}")

    results = []
    for i, spec in enumerate(s.strip() for s in args.models.split(",") if s.strip()):
        log(f"=== {spec}")
        t0 = time.time()
        try:
            res = check_model(args, spec, args.seed + i, device)
        except Exception as e:  # noqa: BLE001 - record and go on with the next model
            traceback.print_exc()
            res = {"model": spec, "candidate": args.candidate, "pass": False,
                   "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        res["seconds"] = round(time.time() - t0, 2)
        results.append(res)
        if "error" not in res:
            lg = res["logits"]
            log(f"{spec}: max abs err {lg.get('max_abs_err')}, max rel err "
                f"{lg.get('max_rel_err')}, err/tol {lg.get('max_err_over_tol')}, "
                f"greedy identical {res['greedy']['identical']}, pass {res['pass']}")

    ok = all(r["pass"] for r in results)
    report = {"provenance": prov, "all_pass": ok, "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print()
    print_table(results)
    print(f"\nwrote {args.out}; {'ALL PASS' if ok else 'FAILURES'}")
    if tmp and not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
