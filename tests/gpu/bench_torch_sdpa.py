#!/usr/bin/env python3
"""PyTorch CPU scaled_dot_product_attention for decode: the baseline fd-attn-bench is compared with.

Shapes as fd-attn-bench: q [B, H, 1, D], k/v [B, Hkv, ctx, D] (GQA: enable_gqa=True when the installed
torch accepts it, else K/V expanded to H heads outside the timed region). Per (dtype, B, ctx): warm-up,
then --reps timed calls, median reported.
  KV GB/s = B * ctx * Hkv * D * 2 (K and V) * dtype_bytes / median time   (the bytes a decode step must read)
  tokens/s = B / median time
Runs on the GPU machine's CPU (torch 2.11 there), e.g.
  python3 tests/gpu/bench_torch_sdpa.py --threads 16 --json artifacts/.../torch_sdpa.json
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit():
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        out = subprocess.run(["git", "-C", src, "rev-parse", "--verify", "-q", "HEAD"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except OSError:
        pass
    return os.environ.get("FD_GIT_COMMIT", "unknown")


def mem_total_gb():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 1e6
    except OSError:
        pass
    return 16.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads (default: all cores)")
    ap.add_argument("--dtype", nargs="+", default=["bf16", "fp16", "fp32"], choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 4, 16, 64, 256, 1024])
    ap.add_argument("--context", nargs="+", type=int, default=[128, 256, 512, 1024, 2048, 4096, 8192])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=32)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--memory-gb", type=float, default=0.4 * mem_total_gb(),
                    help="skip shapes whose K+V (plus a GQA expansion) need more than this")
    ap.add_argument("--quick", action="store_true", help="batch 1 16 64, context 512 2048 8192")
    ap.add_argument("--json", help="write records and provenance here")
    a = ap.parse_args()
    import torch
    import torch.nn.functional as F

    if a.quick:
        a.batch, a.context = [1, 16, 64], [512, 2048, 8192]
    torch.set_num_threads(a.threads)
    H, Hkv, D = a.heads, a.kv_heads, a.head_dim
    if H % Hkv:
        ap.error("--heads must be a multiple of --kv-heads")
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    gqa_kw = None
    if Hkv != H:
        try:  # enable_gqa exists from torch 2.5
            q = torch.zeros(1, H, 1, 32)
            kv = torch.zeros(1, Hkv, 4, 32)
            F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
            gqa_kw = {"enable_gqa": True}
        except TypeError:
            gqa_kw = None
    records, skipped = [], []
    print(f"torch {torch.__version__}, {a.threads} threads, heads {H}/{Hkv}, head_dim {D}, "
          f"GQA via {'enable_gqa' if gqa_kw else ('expand' if Hkv != H else 'n/a')}")
    print(f"{'dtype':5} {'B':>5} {'ctx':>5} {'ms':>10} {'tokens/s':>11} {'KV GB/s':>9}")
    for dn in a.dtype:
        dt = dtypes[dn]
        esz = torch.tensor([], dtype=dt).element_size()
        for B in a.batch:
            for C in a.context:
                kv_bytes = B * C * Hkv * D * 2 * esz
                need = kv_bytes * (1 if (Hkv == H or gqa_kw) else 1 + H // Hkv)
                if need / 1e9 > a.memory_gb:
                    print(f"{dn:5} {B:5d} {C:5d}   skipped: {need / 1e9:.1f} GB over the {a.memory_gb:.1f} GB cap")
                    skipped.append({"dtype": dn, "batch": B, "context": C, "needed_gb": need / 1e9})
                    continue
                g = torch.Generator().manual_seed(0)
                q = torch.randn(B, H, 1, D, generator=g).to(dt)
                k = torch.randn(B, Hkv, C, D, generator=g).to(dt)
                v = torch.randn(B, Hkv, C, D, generator=g).to(dt)
                kw = {}
                if Hkv != H:
                    if gqa_kw:
                        kw = gqa_kw
                    else:
                        k = k.repeat_interleave(H // Hkv, dim=1)
                        v = v.repeat_interleave(H // Hkv, dim=1)
                times = []
                with torch.inference_mode():
                    for i in range(a.warmup + a.reps):
                        t0 = time.perf_counter()
                        o = F.scaled_dot_product_attention(q, k, v, **kw)
                        t1 = time.perf_counter()
                        if i >= a.warmup:
                            times.append(t1 - t0)
                del o
                t = statistics.median(times)
                rec = {"dtype": dn, "batch": B, "context": C, "n_heads": H, "n_kv_heads": Hkv, "head_dim": D,
                       "threads": a.threads, "reps": a.reps, "warmup": a.warmup, "kv_bytes": kv_bytes,
                       "median_s": t, "times_s": times, "tokens_per_s": B / t, "kv_GBps": kv_bytes / t / 1e9,
                       "gqa": "enable_gqa" if gqa_kw else ("expand" if Hkv != H else "none")}
                records.append(rec)
                print(f"{dn:5} {B:5d} {C:5d} {t * 1e3:10.3f} {B / t:11.0f} {kv_bytes / t / 1e9:9.1f}", flush=True)
                del q, k, v
    if a.json:
        out = {"tool": "bench_torch_sdpa.py",
               "provenance": {"torch": torch.__version__, "threads": a.threads, "cpu_model": cpu_model(),
                              "cpu_cores": os.cpu_count(), "host": platform.node(), "git_commit": git_commit(),
                              "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                              "command": " ".join(sys.argv)},
               "formulas": {"kv_bytes": "B * ctx * Hkv * D * 2 * dtype_bytes", "kv_GBps": "kv_bytes / median_s / 1e9",
                            "tokens_per_s": "B / median_s"},
               "records": records, "skipped": skipped}
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
