#!/usr/bin/env python3
"""The HuggingFace transformers baseline: an experiment config's workload through `generate`, as a run folder.

    python3 baselines/hf/run_hf.py CONFIG [--set k=v ...] [--batch-size B] [--cache dynamic|static]
        [--device cuda|cpu] [--dtype fp16|bf16|fp32] [--bin-dir build/cuda/bin] [--out DIR]

The requests are the ones `fd-bench run` makes for the same config (`fd-bench workload`); the weights are the
config's `model.weights.dir`, else the seeded random weights it names, written once by `fd-weights random`
into --weights-cache (the same bytes the harness computes). Requests run in arrival order in static batches of
B, left-padded with an attention mask, greedy unless the config's `sampling` says otherwise. A streamer stamps
the end of every generation step. The run folder holds summary.json, steps.jsonl and requests.jsonl with our
field names (docs/EXPERIMENTS.md, baselines/hf/README.md).

Everything above the "torch" section imports without torch or transformers (tests/python/test_hf_driver.py).
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.util
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

ENGINE = "hf-transformers"
WORKLOAD_KEYS = {"id", "arrival_s", "prompt", "gen_len", "stop_at_eos", "sampling", "forced"}
DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


class DriverError(Exception):
    """Bad input (config, workload, options): exit 2, as fd-bench does for config errors."""


# ------------------------------------------------------------------------------------------------
# fd-bench / fd-weights
# ------------------------------------------------------------------------------------------------

def _program(bin_dir, name):
    p = Path(bin_dir) / name
    if not os.access(p, os.X_OK):
        raise DriverError(f"{p}: not found (build it, or pass --bin-dir)")
    return str(p)


def _run(args):
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if proc.returncode != 0:
        msg = f"{shlex.join(map(str, args))} exited {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}"
        raise DriverError(msg) if proc.returncode == 2 else RuntimeError(msg)
    return proc


def _set_args(sets):
    out = []
    for s in sets:
        out += ["--set", s]
    return out


def resolved_config(bin_dir, config, sets):
    """The config with defaults filled in, as `fd-bench run --check` prints it (and echoes in summary.json)."""
    proc = _run([_program(bin_dir, "fd-bench"), "run", config, "--check", *_set_args(sets)])
    return json.loads(proc.stdout)


def fd_bench_workload(bin_dir, config, sets, path):
    """Writes the config's requests to `path` with `fd-bench workload` and reads them back."""
    _run([_program(bin_dir, "fd-bench"), "workload", config, *_set_args(sets), "-o", path])
    return read_workload(path)


def read_workload(path):
    """fd-bench workload's JSONL: one request per line, checked for the keys this driver relies on."""
    reqs = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError as e:
                raise DriverError(f"{path}:{n}: not JSON ({e})")
            if not isinstance(r, dict):
                raise DriverError(f"{path}:{n}: expected a JSON object")
            unknown = set(r) - WORKLOAD_KEYS
            missing = {"id", "arrival_s", "prompt", "gen_len", "stop_at_eos"} - set(r)
            if unknown or missing:
                raise DriverError(f"{path}:{n}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
            if not r["prompt"] or not all(isinstance(t, int) for t in r["prompt"]):
                raise DriverError(f"{path}:{n}: 'prompt' must be a non-empty list of token ids")
            if not isinstance(r["gen_len"], int) or r["gen_len"] < 1:
                raise DriverError(f"{path}:{n}: 'gen_len' must be an integer >= 1")
            reqs.append(r)
    if not reqs:
        raise DriverError(f"{path}: no requests")
    return reqs


def check_supported(reqs, run_sampling):
    """generate() runs one sampling setting per batch and cannot teacher-force: refuse what it cannot do."""
    for r in reqs:
        if r.get("forced"):
            raise DriverError(f"request {r['id']}: teacher-forced (workload.score); generate() cannot force tokens")
        if "sampling" in r and r["sampling"] != run_sampling:
            raise DriverError(f"request {r['id']}: its own sampling {r['sampling']} differs from the run's {run_sampling}; "
                              "generate() samples a whole batch one way")


def weights_dir(cfg, bin_dir, cache_dir):
    """The checkpoint folder HF loads: model.weights.dir, else the seeded random weights written once into
    cache_dir/<model>-l<layers>-s<seed>-<dtype>-<hash of the model config> by fd-weights random."""
    m = cfg["model"]
    w = m["weights"]
    if w.get("dir"):
        return w["dir"]
    model_cfg = m["config"]
    digest = hashlib.sha256(Path(model_cfg).read_bytes()).hexdigest()[:12]
    name = "%s-l%d-s%d-%s-%s" % (Path(model_cfg).stem, m["layers"], w["seed"], w["dtype"], digest)
    out = Path(cache_dir) / name
    if (out / "config.json").is_file() and (out / ".fd-weights-done").is_file():
        return str(out)
    tmp = Path(cache_dir) / (name + ".tmp-%d" % os.getpid())
    tmp.mkdir(parents=True, exist_ok=True)
    _run([_program(bin_dir, "fd-weights"), "random", "--model", model_cfg, "--layers", m["layers"], "--seed", w["seed"],
          "--dtype", w["dtype"], "--out", tmp, "--force", "--quiet"])
    (tmp / ".fd-weights-done").write_text("fd-weights random --model %s --layers %d --seed %d --dtype %s\n"
                                          % (model_cfg, m["layers"], w["seed"], w["dtype"]))
    if out.exists():  # another run finished first; keep its copy
        import shutil
        shutil.rmtree(tmp)
    else:
        tmp.rename(out)
    return str(out)


# ------------------------------------------------------------------------------------------------
# batching, padding, statistics (pure)
# ------------------------------------------------------------------------------------------------

def batches_in_arrival_order(reqs, batch_size):
    """Static batches of batch_size in arrival order (ties: id order), as HF users batch them."""
    if batch_size < 1:
        raise DriverError("--batch-size must be >= 1")
    order = sorted(reqs, key=lambda r: (r["arrival_s"], r["id"]))
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def left_pad(prompts, pad_id):
    """Rows of equal length, the prompts right-aligned; mask 1 on real tokens, 0 on padding."""
    n = max(len(p) for p in prompts)
    ids = [[pad_id] * (n - len(p)) + list(p) for p in prompts]
    mask = [[0] * (n - len(p)) + [1] * len(p) for p in prompts]
    return ids, mask


def percentile(v, q):
    """numpy's default (linear interpolation between order statistics); 0 for no values."""
    if not v:
        return 0.0
    s = sorted(v)
    x = (len(s) - 1) * q / 100.0
    lo = int(x)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (x - lo)


def distribution(v):
    """Our summary's {mean, p50, p90, p99, max, count} (harness/runner.cpp), plus p1."""
    return {"mean": sum(v) / len(v) if v else 0.0, "p1": percentile(v, 1), "p50": percentile(v, 50),
            "p90": percentile(v, 90), "p99": percentile(v, 99), "max": max(v) if v else 0.0, "count": len(v)}


def trim(row, gen_len, stop_at_eos, eos_id):
    """A request's tokens from its generated row: at most gen_len, up to and including eos when it stops there."""
    out = []
    for t in row[:gen_len]:
        out.append(t)
        if stop_at_eos and t == eos_id:
            break
    return out


def run_batches(reqs, batch_size, generate, eos_id, clock=time.perf_counter, sleep=time.sleep):
    """Runs every batch through generate(batch) -> (rows of generated tokens, end time of each step) and
    returns (steps, request records) with times in ms from the run's start (t = 0 at the call).

    A batch starts when its last member has arrived and the previous batch is done. Step k of a batch produced
    column k of every row; a request's i-th token is timed at the end of step i (as the harness times tokens).
    Rows past their own gen_len (or eos) keep computing, as HF does; their tokens are dropped and not counted.
    """
    t0 = clock()
    steps, records = [], []
    for batch in batches_in_arrival_order(reqs, batch_size):
        wait = max(r["arrival_s"] for r in batch) - (clock() - t0)
        if wait > 0:
            sleep(wait)
        start = clock()
        rows, ends = generate(batch)
        if len(rows) != len(batch) or any(len(row) != len(ends) for row in rows):
            raise RuntimeError("generate returned %d rows of %s tokens for %d requests and %d step times"
                               % (len(rows), sorted({len(r) for r in rows}), len(batch), len(ends)))
        kept = [trim(row, r["gen_len"], r["stop_at_eos"], eos_id) for row, r in zip(rows, batch)]
        for r, toks in zip(batch, kept):
            if len(toks) < r["gen_len"] and not (r["stop_at_eos"] and toks and toks[-1] == eos_id):
                raise RuntimeError("request %d: %d tokens generated of %d (generate stopped early)" % (r["id"], len(toks), r["gen_len"]))
        prev = start
        for k, end in enumerate(ends):
            active = [i for i, toks in enumerate(kept) if len(toks) > k]
            if not active:
                break  # every row of the batch is done: later steps only computed dropped tokens
            steps.append({
                "step": len(steps), "start_ms": (prev - t0) * 1e3, "step_ms": (end - prev) * 1e3,
                "batch": len(batch), "tokens": len(active), "new_tokens": len(active), "running": len(active),
                "finished": sum(1 for i in active if len(kept[i]) == k + 1),
                "prefill_tokens": sum(len(batch[i]["prompt"]) for i in active) if k == 0 else 0,
                "decode_tokens": len(active) if k > 0 else 0,
                "total_context": sum(len(batch[i]["prompt"]) + k for i in active),
                "breakdown_ms": {}})
            prev = end
        for r, toks in zip(batch, kept):
            arrive = r["arrival_s"] * 1e3
            times = [(ends[i] - t0) * 1e3 - arrive for i in range(len(toks))]
            records.append({"id": r["id"], "prompt_len": len(r["prompt"]), "output_len": len(toks), "arrival_ms": arrive,
                            "queue_ms": max(0.0, (start - t0) * 1e3 - arrive), "ttft_ms": times[0], "e2e_ms": times[-1],
                            "prompt": r["prompt"], "tokens": toks, "_times": times})
    records.sort(key=lambda x: x["id"])
    return steps, records


def results_of(steps, records, weights_load_s):
    """summary.json "results", with our names (harness/runner.cpp, docs/EXPERIMENTS.md): throughputs over
    the first step's start to the last step's end, and the latency distributions (plus p1)."""
    dur = (steps[-1]["start_ms"] + steps[-1]["step_ms"] - steps[0]["start_ms"]) / 1e3 if steps else 0.0
    out_tok = sum(r["output_len"] for r in records)
    prompt_tok = sum(r["prompt_len"] for r in records)
    tpot = [(r["_times"][-1] - r["_times"][0]) / (len(r["_times"]) - 1) for r in records if len(r["_times"]) > 1]
    itl = [b - a for r in records for a, b in zip(r["_times"], r["_times"][1:])]
    dec = [s for s in steps if s["prefill_tokens"] == 0 and s["decode_tokens"] > 0]  # analysis/fd_runs.py
    dec_ms = sum(s["step_ms"] for s in dec)
    return {
        "num_requests": len(records), "prompt_tokens": prompt_tok, "output_tokens": out_tok, "steps": len(steps),
        "duration_s": dur, "weights_load_s": weights_load_s,
        "output_throughput": out_tok / dur if dur > 0 else 0.0,
        "total_token_throughput": (out_tok + prompt_tok) / dur if dur > 0 else 0.0,
        "request_throughput": len(records) / dur if dur > 0 else 0.0,
        "decode_tokens_per_s": sum(s["decode_tokens"] for s in dec) / (dec_ms / 1e3) if dec_ms > 0 else 0.0,
        "step_ms": distribution([s["step_ms"] for s in steps]),
        "decode_step_ms": distribution([s["step_ms"] for s in dec]),
        "ttft_ms": distribution([r["ttft_ms"] for r in records]),
        "tpot_ms": distribution(tpot),
        "itl_ms": distribution(itl),
        "e2e_latency_ms": distribution([r["e2e_ms"] for r in records]),
        "queue_ms": distribution([r["queue_ms"] for r in records]),
        "max_batch": max((s["batch"] for s in steps), default=0),
        "mean_decode_batch": sum(s["decode_tokens"] for s in dec) / len(dec) if dec else 0.0,
        "step_breakdown_ms_mean": {},
    }


def provenance(command, gpus):
    """Our provenance keys (harness/provenance.cpp): FD_GIT_COMMIT wins over the copy's own .git."""
    commit, source, dirty = os.environ.get("FD_GIT_COMMIT"), "FD_GIT_COMMIT", None
    if not commit:
        repo = Path(__file__).resolve().parents[2]
        try:
            commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "-q", "HEAD"], capture_output=True,
                                    text=True).stdout.strip()
            dirty = bool(subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                                        capture_output=True, text=True).stdout.strip()) if commit else None
        except OSError:
            commit = ""
        source = "git" if commit else "none"
    cpu = platform.processor()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"git_commit": commit or "unknown", "git_commit_source": source, "git_dirty": dirty, "host": socket.gethostname(),
            "cpu_model": cpu, "cpu_cores": os.cpu_count(), "gpus": gpus, "cuda_built": bool(gpus),
            "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "command": command}


def model_name(config_path):
    """As fastdecode/model/model_config.cpp names a model: the file's stem, or its folder's for a config.json."""
    p = Path(config_path)
    return p.parent.name if p.stem == "config" else p.stem


def make_summary(cfg, config_file, sets, engine_info, prov, results, notes):
    """summary.json as ours: "engine" is the engine's name (a string, as analysis/*.py read it), what ran is
    in "engine_info", and the echoed config's engine section is replaced by this driver's (the file's own is
    kept in "config_engine_replaced")."""
    m = cfg["model"]
    w = m["weights"]
    echo = dict(cfg)
    echo["engine"] = {k: engine_info[k] for k in ("type", "cache", "batch_size", "dtype", "device")}
    return {"name": cfg["name"], "engine": ENGINE, "engine_info": engine_info, "config_file": config_file, "config": echo,
            "config_engine_replaced": cfg["engine"], "overrides": list(sets), "provenance": prov,
            "model": {"name": model_name(m["config"]), "layers": m["layers"],
                      "weights": ("checkpoint %s" % w["dir"]) if w.get("dir") else "random weights (seed %s, %s)" % (w["seed"], w["dtype"])},
            "results": results, "notes": notes}


def write_run_folder(out, summary, steps, records):
    out = Path(out)
    if (out / "summary.json").exists():
        raise DriverError(f"{out}: already holds a finished run (summary.json); choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "steps.jsonl", "w") as f:
        for s in steps:
            f.write(json.dumps(s) + "\n")
    with open(out / "requests.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps({k: v for k, v in r.items() if not k.startswith("_")}) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


def hardware_notes(cfg):
    """The balance emulation (hardware.gpu) is the harness's: transformers runs on the whole device."""
    g = cfg.get("hardware", {}).get("gpu", {})
    if not (g.get("memory_gb") or g.get("sm_count")):
        return []
    return ["hardware.gpu (memory_gb %s, sm_count %s) is NOT applied: transformers ran on the whole device, not the "
            "emulated balance" % (g.get("memory_gb"), g.get("sm_count"))]


def sampling_notes(run_sampling):
    greedy = run_sampling["temperature"] == 0 or run_sampling["top_k"] == 1
    if greedy:
        return True, []
    return False, ["sampled with generate(do_sample=True, temperature=%g, top_k=%d, top_p=%g) from torch's generator "
                   "seeded with %d: the tokens are not comparable with our engines' (whose draws are a function of "
                   "(seed, request, step))" % (run_sampling["temperature"], run_sampling["top_k"], run_sampling["top_p"],
                                                run_sampling["seed"])]


# ------------------------------------------------------------------------------------------------
# torch + transformers (imported only here)
# ------------------------------------------------------------------------------------------------

class HFGenerator:
    """One model on one device; __call__(batch) -> (rows of generated token ids, end time of each step)."""

    def __init__(self, ckpt, device, dtype, cache, run_sampling, stop_at_eos):
        import torch
        import transformers
        self.torch, self.tf = torch, transformers
        self.device, self.cache = device, cache
        if device == "cuda" and not torch.cuda.is_available():
            raise DriverError("--device cuda: torch sees no GPU")
        hf_cfg = json.loads((Path(ckpt) / "config.json").read_text())
        self.eos_id = hf_cfg.get("eos_token_id")
        if isinstance(self.eos_id, list):
            self.eos_id = self.eos_id[0]
        pad = hf_cfg.get("pad_token_id")
        self.pad_id = pad if pad is not None else (self.eos_id if self.eos_id is not None else 0)
        kw = {("dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"): getattr(torch, DTYPES[dtype])}
        t = time.perf_counter()
        self.model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, **kw).to(device).eval()
        if device == "cuda":
            torch.cuda.synchronize()
        self.load_s = time.perf_counter() - t
        self.greedy, _ = sampling_notes(run_sampling)
        self.sampling, self.stop_at_eos = run_sampling, stop_at_eos
        # No eos in the model's own generation defaults either: without stop_at_eos every row runs its length
        # and eos is an ordinary token (HF would otherwise pad after it, or mask it with min_new_tokens).
        if not stop_at_eos:
            self.model.generation_config.eos_token_id = None
        torch.manual_seed(run_sampling["seed"])

    def versions(self):
        return {"transformers": self.tf.__version__, "torch": self.torch.__version__}

    def gpus(self):
        torch = self.torch
        if self.device != "cuda":
            return []
        return [{"name": torch.cuda.get_device_name(i), "memory_gb": torch.cuda.get_device_properties(i).total_memory / 1e9,
                 "sm_count": torch.cuda.get_device_properties(i).multi_processor_count} for i in range(torch.cuda.device_count())]

    def __call__(self, batch, max_new=None):
        torch, tf = self.torch, self.tf
        ids, mask = left_pad([r["prompt"] for r in batch], self.pad_id)
        n = max_new or max(r["gen_len"] for r in batch)
        ends = []

        from transformers.generation.streamers import BaseStreamer

        class Stamp(BaseStreamer):
            """put() gets the prompt once, then each step's new tokens (already on the host): stamp those."""
            first = True

            def put(self, value):
                if self.first:
                    self.first = False
                else:
                    ends.append(time.perf_counter())

            def end(self):
                pass

        gen = dict(max_new_tokens=n, do_sample=not self.greedy, pad_token_id=self.pad_id, streamer=Stamp())
        if self.greedy:
            gen.update(temperature=None, top_k=None, top_p=None)
        else:
            gen.update(temperature=self.sampling["temperature"], top_k=self.sampling["top_k"], top_p=self.sampling["top_p"])
        if self.stop_at_eos:
            gen["eos_token_id"] = self.eos_id
        else:
            gen.update(eos_token_id=None, min_new_tokens=n)
        if self.cache == "static":
            gen["cache_implementation"] = "static"
            if hasattr(tf.GenerationConfig(), "disable_compile"):  # transformers >= 4.51 compiles static caches itself
                gen["disable_compile"] = True
        with torch.no_grad():
            out = self.model.generate(input_ids=torch.tensor(ids, device=self.device),
                                      attention_mask=torch.tensor(mask, device=self.device), **gen)
        rows = out[:, len(ids[0]):].tolist()
        if len(ends) != len(rows[0]):
            raise RuntimeError("streamer stamped %d steps for %d generated columns" % (len(ends), len(rows[0])))
        return rows, ends


# ------------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", help="experiment config (JSON), as for fd-bench run")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override, as fd-bench run --set")
    ap.add_argument("--batch-size", type=int, default=16, help="static batch size B (default %(default)s)")
    ap.add_argument("--cache", choices=("dynamic", "static"), default="dynamic", help="KV-cache implementation")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp16", help="dtype the model is loaded in")
    ap.add_argument("--bin-dir", default="build/cuda/bin", help="where fd-bench and fd-weights are (default %(default)s)")
    ap.add_argument("--weights-cache", default="results/hf-weights", help="folder for the random weights (default %(default)s)")
    ap.add_argument("--out", help="run folder (default results/hf/<name>/<UTC time>)")
    ap.add_argument("--no-warmup", action="store_true", help="skip the untimed 2-token warm-up generate")
    a = ap.parse_args(argv)
    command = shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(["run_hf.py", *argv])
    try:
        if a.batch_size < 1:
            raise DriverError("--batch-size must be >= 1")
        cfg = resolved_config(a.bin_dir, a.config, a.set)
        out = a.out or os.path.join("results", "hf", cfg["name"], time.strftime("%Y%m%d-%H%M%S", time.gmtime()))
        if (Path(out) / "summary.json").exists():
            raise DriverError(f"{out}: already holds a finished run (summary.json); choose another --out")
        Path(out).mkdir(parents=True, exist_ok=True)
        reqs = fd_bench_workload(a.bin_dir, a.config, a.set, os.path.join(out, "workload.jsonl"))
        check_supported(reqs, cfg["sampling"])
        missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
        if missing:
            print("run_hf.py: error: torch and transformers are needed to run (%s not importable); the GPU machine has them"
                  % " and ".join(missing), file=sys.stderr)
            return 1
        ckpt = weights_dir(cfg, a.bin_dir, a.weights_cache)
        stop = cfg["workload"]["stop_at_eos"]
        g = HFGenerator(ckpt, a.device, a.dtype, a.cache, cfg["sampling"], stop)
        if not a.no_warmup:
            g(batches_in_arrival_order(reqs, a.batch_size)[0][:2], max_new=2)
        print("%s: %s, %d requests in batches of %d, %s cache, %s on %s" % (ENGINE, cfg["name"], len(reqs), a.batch_size,
                                                                             a.cache, a.dtype, a.device), file=sys.stderr)
        steps, records = run_batches(reqs, a.batch_size, g, g.eos_id)
        _, notes = sampling_notes(cfg["sampling"])
        notes += hardware_notes(cfg)
        notes.append("static batches of %d in arrival order: a batch decodes until its longest request is done "
                     "(finished rows keep computing; their tokens are dropped and not counted)" % a.batch_size)
        info = {"type": ENGINE, "cache": a.cache, "batch_size": a.batch_size, "dtype": a.dtype, "device": a.device,
                "weights": ckpt, **g.versions()}
        summary = make_summary(cfg, a.config, a.set, info, provenance(command, g.gpus()), results_of(steps, records, g.load_s), notes)
        write_run_folder(out, summary, steps, records)
        r = summary["results"]
        print("%s: %d output tokens in %.2f s = %.1f tokens/s (decode %.1f); step p50 %.2f ms, p99 %.2f ms\nrun folder: %s"
              % (cfg["name"], r["output_tokens"], r["duration_s"], r["output_throughput"], r["decode_tokens_per_s"],
                 r["step_ms"]["p50"], r["step_ms"]["p99"], out))
        return 0
    except DriverError as e:
        print("run_hf.py: error: %s" % e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
