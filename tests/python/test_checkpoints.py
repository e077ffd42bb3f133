"""Checkpoints on disk in the HuggingFace Hub layout (fastdecode/model/checkpoint.h).

* ``fd-weights random --max-shard-gb X`` writes model-0000k-of-0000N.safetensors + model.safetensors.index.json
  as transformers' save_pretrained does; parsed here with plain Python (names, sorted keys, total_size,
  format metadata, every tensor in exactly one shard, the same bytes as the single-file checkpoint).
* ``fd-generate`` on sharded and single-file weights gives identical logits.npy and tokens.
* Bad folders make fd-generate / fd-weights exit 2 before any work, naming the file and the tensor.
* If the ``safetensors`` Python package is importable, every shard is loaded with it too (else a
  visible skip).

Only fd-weights and fd-generate are needed ($FD_BIN_DIR, else build/default/bin); without them the
tests skip, or fail under FD_REQUIRE_BINARIES=1 (as conftest.py does for the other programs).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from fd_numpy_ref import expected_tensor_shapes, read_safetensors_header, read_safetensors_raw

INDEX = "model.safetensors.index.json"
SHARD_RE = re.compile(r"model-(\d{5})-of-(\d{5})\.safetensors")
MODEL = "tiny-llama-gqa.json"
MAX_SHARD_GB = "0.00006"  # 60000 bytes: several shards for the tiny model, embeddings in a shard of their own
DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2}


@pytest.fixture(scope="module")
def bins() -> dict[str, str]:
    env = os.environ.get("FD_BIN_DIR")
    d = Path(env) if env else Path(__file__).resolve().parents[2] / "build" / "default" / "bin"
    progs = {p: d / p for p in ("fd-weights", "fd-generate")}
    missing = [p for p, path in progs.items() if not os.access(path, os.X_OK)]
    if missing:
        reason = f"{', '.join(missing)} not found in {d}; build them or set FD_BIN_DIR"
        if os.environ.get("FD_REQUIRE_BINARIES", "") not in ("", "0"):
            pytest.fail(reason + " [FD_REQUIRE_BINARIES=1]", pytrace=False)
        pytest.skip(reason)
    return {p: str(path) for p, path in progs.items()}


def weights(run_program, bins, models_dir, out, *extra, seed=3, dtype="bf16"):
    run_program([bins["fd-weights"], "random", "--model", models_dir / MODEL, "--seed", seed, "--dtype", dtype,
                 "--out", out, "--quiet", *extra])
    return out


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory, run_program, bins, models_dir):
    """The same seeded weights twice: one model.safetensors, and Hub-style shards."""
    root = tmp_path_factory.mktemp("ckpts")
    single = weights(run_program, bins, models_dir, root / "single")
    sharded = weights(run_program, bins, models_dir, root / "sharded", "--max-shard-gb", MAX_SHARD_GB)
    return single, sharded


def shard_files(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if SHARD_RE.fullmatch(p.name))


def copy_ckpt(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def expect_exit_2(args, *parts):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    for part in parts:
        assert str(part) in p.stderr, f"{part!r} not in stderr: {p.stderr}"
    return p


def test_sharded_layout_is_the_hub_layout(ckpts, models_dir):
    single, sharded = ckpts
    assert not (sharded / "model.safetensors").exists()
    text = (sharded / INDEX).read_text()
    pairs = json.loads(text, object_pairs_hook=lambda kv: kv)  # keeps key order as in the file
    assert [k for k, _ in pairs] == ["metadata", "weight_map"]
    index = json.loads(text)
    weight_map = index["weight_map"]
    order = [k for k, _ in dict(pairs)["weight_map"]]
    assert order == sorted(order), "weight_map keys must be sorted (transformers writes sort_keys=True)"

    files = shard_files(sharded)
    n = len(files)
    assert n >= 3
    assert [int(SHARD_RE.fullmatch(f.name).group(1)) for f in files] == list(range(1, n + 1))
    assert all(int(SHARD_RE.fullmatch(f.name).group(2)) == n for f in files)
    assert set(weight_map.values()) == {f.name for f in files}

    seen: dict[str, str] = {}
    total = 0
    for f in files:
        with open(f, "rb") as fh:
            (hlen,) = struct.unpack("<Q", fh.read(8))
            full_header = json.loads(fh.read(hlen))
        assert full_header["__metadata__"]["format"] == "pt"
        header, _ = read_safetensors_header(str(f))
        for name, info in header.items():
            assert name not in seen, f"{name} in both {seen[name]} and {f.name}"
            seen[name] = f.name
            assert weight_map[name] == f.name
            begin, end = info["data_offsets"]
            total += end - begin
            n_el = 1
            for dim in info["shape"]:
                n_el *= dim
            assert end - begin == n_el * DTYPE_BYTES[info["dtype"]]
    assert set(seen) == set(weight_map), "every tensor of the index in exactly one shard"
    assert index["metadata"]["total_size"] == total

    config = json.loads((sharded / "config.json").read_text())
    assert {k: list(v) for k, v in expected_tensor_shapes(config).items()} == \
        {k: info["shape"] for f in files for k, info in read_safetensors_header(str(f))[0].items()}
    # Same bytes as the single file.
    one = read_safetensors_raw(str(single / "model.safetensors"))
    for f in files:
        for name, raw in read_safetensors_raw(str(f)).items():
            assert raw == one[name], name


def test_one_shard_is_a_plain_model_safetensors(run_program, bins, models_dir, ckpts, tmp_path):
    single, _ = ckpts
    d = weights(run_program, bins, models_dir, tmp_path / "w", "--max-shard-gb", "10")
    assert sorted(p.name for p in d.iterdir()) == ["config.json", "model.safetensors"]
    assert (d / "model.safetensors").read_bytes() == (single / "model.safetensors").read_bytes()


def test_rewrite_with_force_leaves_one_checkpoint(run_program, bins, models_dir, tmp_path):
    d = weights(run_program, bins, models_dir, tmp_path / "w", "--max-shard-gb", MAX_SHARD_GB)
    # Without --force an existing checkpoint is refused, before anything is written.
    expect_exit_2([bins["fd-weights"], "random", "--model", models_dir / MODEL, "--seed", "1", "--out", d],
                  "--force", d)
    weights(run_program, bins, models_dir, d, "--force")
    assert sorted(p.name for p in d.iterdir()) == ["config.json", "model.safetensors"]
    weights(run_program, bins, models_dir, d, "--force", "--max-shard-gb", MAX_SHARD_GB)
    assert not (d / "model.safetensors").exists() and (d / INDEX).exists()


def test_fd_generate_sharded_equals_single_file(run_program, bins, ckpts, tmp_path):
    outs = []
    for w in ckpts:  # single file, then shards
        out = tmp_path / w.name
        run_program([bins["fd-generate"], "--weights", w, "--prompt", "5,17,42,7", "--steps", "6", "--out", out])
        outs.append(out)
    a, b = outs
    assert (a / "logits.npy").read_bytes() == (b / "logits.npy").read_bytes()
    ra, rb = (json.loads((o / "result.json").read_text()) for o in outs)
    assert ra["generated"] == rb["generated"] and len(ra["generated"]) == 6


def test_info_lists_every_tensor_with_its_shard(run_program, bins, ckpts, models_dir):
    _, sharded = ckpts
    weight_map = json.loads((sharded / INDEX).read_text())["weight_map"]
    for target in (sharded, sharded / INDEX):
        p = run_program([bins["fd-weights"], "info", target, "--model", sharded / "config.json"])
        rows = {line.split()[0]: line.split()[-1] for line in p.stdout.splitlines() if line.startswith(("model.", "lm_head"))}
        assert rows == weight_map
    f = shard_files(sharded)[0]
    p = run_program([bins["fd-weights"], "info", f])
    header, _ = read_safetensors_header(str(f))
    assert [line.split()[0] for line in p.stdout.splitlines()[:-1]] == list(header)


def test_bad_folders_exit_2_naming_file_and_tensor(bins, ckpts, tmp_path):
    _, sharded = ckpts
    weight_map = json.loads((sharded / INDEX).read_text())["weight_map"]
    files = shard_files(sharded)
    gen = lambda w: [bins["fd-generate"], "--weights", w, "--prompt", "5,6", "--out", tmp_path / "never"]

    # A shard the index names is missing.
    d = copy_ckpt(sharded, tmp_path / "missing_shard")
    gone = shard_files(d)[1]
    gone.unlink()
    first = min(k for k, v in weight_map.items() if v == gone.name)
    expect_exit_2(gen(d), d / INDEX, gone, first)

    # A truncated shard: its last tensor's data reach past the end.
    d = copy_ckpt(sharded, tmp_path / "truncated")
    last = shard_files(d)[-1]
    last_tensor = list(read_safetensors_header(str(last))[0])[-1]
    with open(last, "r+b") as fh:
        fh.truncate(last.stat().st_size - 1)
    expect_exit_2(gen(d), last, last_tensor, "truncated")

    # The index maps a tensor to a shard that does not hold it.
    d = copy_ckpt(sharded, tmp_path / "wrong_map")
    index = json.loads((d / INDEX).read_text())
    name = next(k for k, v in sorted(index["weight_map"].items()) if v == files[0].name)
    index["weight_map"][name] = files[1].name
    (d / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True))
    expect_exit_2(gen(d), d / INDEX, name, files[1].name, "does not hold it")

    # A shard holds a tensor the index does not list.
    d = copy_ckpt(sharded, tmp_path / "unlisted")
    index = json.loads((d / INDEX).read_text())
    shared = [v for v in index["weight_map"].values() if list(index["weight_map"].values()).count(v) > 1]
    name = sorted(k for k, v in index["weight_map"].items() if v in shared)[0]  # its shard stays in the index
    shard = index["weight_map"].pop(name)
    (d / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True))
    expect_exit_2(gen(d), d / shard, name, "not listed in the index")

    # The config implies other shapes (4 KV heads where the files have 2).
    d = copy_ckpt(sharded, tmp_path / "shape")
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_key_value_heads"] = 4
    (d / "config.json").write_text(json.dumps(cfg))
    k0 = "model.layers.0.self_attn.k_proj.weight"
    expect_exit_2(gen(d), d / weight_map[k0], k0, "[64, 128]", "[128, 128]")

    # The config needs a layer the files lack.
    d = copy_ckpt(sharded, tmp_path / "deeper")
    cfg["num_key_value_heads"] = 2
    cfg["num_hidden_layers"] = 4
    (d / "config.json").write_text(json.dumps(cfg))
    expect_exit_2(gen(d), d / INDEX, "model.layers.3.", "does not have it")

    # The files hold a layer the config does not have (a 3-layer checkpoint, a 2-layer config).
    d = copy_ckpt(sharded, tmp_path / "shallower")
    cfg["num_hidden_layers"] = 2
    (d / "config.json").write_text(json.dumps(cfg))
    extra = "model.layers.2.input_layernorm.weight"
    expect_exit_2(gen(d), d / weight_map[extra], extra, "not a tensor of this model")

    # fd-weights info reports the same errors.
    expect_exit_2([bins["fd-weights"], "info", tmp_path / "missing_shard"], gone.name, first)
    assert not (tmp_path / "never").exists(), "fd-generate must fail before any work"


def test_shards_load_with_the_safetensors_package(run_program, bins, models_dir, tmp_path):
    if importlib.util.find_spec("safetensors") is None:
        pytest.skip("the safetensors Python package is not installed (pip install safetensors): "
                    "shards were checked with the plain-Python reader only")
    from safetensors.numpy import load_file  # noqa: PLC0415  (NumPy has no bfloat16: fp16 weights here)

    single = weights(run_program, bins, models_dir, tmp_path / "single", dtype="fp16")
    sharded = weights(run_program, bins, models_dir, tmp_path / "sharded", "--max-shard-gb", MAX_SHARD_GB,
                      dtype="fp16")
    index = json.loads((sharded / INDEX).read_text())
    loaded = {}
    for f in shard_files(sharded):
        for name, arr in load_file(str(f)).items():
            assert index["weight_map"][name] == f.name
            loaded[name] = arr
    assert set(loaded) == set(index["weight_map"])
    for name, arr in load_file(str(single / "model.safetensors")).items():
        assert arr.dtype == loaded[name].dtype and (arr == loaded[name]).all(), name
