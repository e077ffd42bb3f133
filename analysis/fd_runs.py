"""What the analysis scripts read from fd-bench run folders, defined once.

Decode-only steps: the steps that processed no prompt tokens (admission over or waiting) and decoded
something; their decode throughput is decode tokens over their wall time.
"""


def decode_steps(steps):
    return [x for x in steps if x.get("prefill_tokens", 0) == 0 and x.get("decode_tokens", 0) > 0]


def decode_tokens_per_s(dec):
    return sum(x["decode_tokens"] for x in dec) / (sum(x["step_ms"] for x in dec) / 1e3) if dec else 0.0
