"""Numbers the MODELLED tables share (analysis/claims.py, analysis/balance_map.py), defined once.

SHAPES: per model, the parameters of one decoder layer, the fp16 KV bytes per token per layer, the layers and
the fp16 weight bytes (experiments/models/ configs; analysis/fig_kv_memory.py counts the same from the configs).
PAPER_HW: the paper's hardware as MODELLED (NVIDIA A10 datasheet; AMD EPYC 7003: 8 channels of DDR4-3200 =
204.8 GB/s per socket, of which a STREAM-like 75 % is taken as sustained).
"""

SHAPES = {"llama-2-7b": {"layer_params": 202.4e6, "kv_tok_layer": 2 * 4096 * 2, "layers": 32, "weights": 13.5e9},
          "llama-2-13b": {"layer_params": 317.7e6, "kv_tok_layer": 2 * 5120 * 2, "layers": 40, "weights": 26.0e9}}
SOCKET_BW = 0.75 * 204.8e9
PAPER_HW = {"gpu_bw": 600e9, "gpu_flops": 125e12, "gemm_eff": 0.7, "gpu_mem": 24e9, "socket_bw": SOCKET_BW, "sockets": 8}


def layer_weight_bytes(model):
    """fp16 bytes of one layer's weights."""
    return 2 * SHAPES[model]["layer_params"]
