#!/usr/bin/env bash
# On the GPU machine (PyTorch + transformers, no package manager): builds with the `cuda` preset using
# the unpacked Debian packages in .deps/ (scripts/device-deps.sh), runs the unit tests and pytest, the
# quick-start, and the transformers cross-check (fp16 and bf16 weights, and the zoo: hf_crosscheck_zoo.json). Results go to $1 (default
# results/gpu-crosscheck); artifacts/ holds the committed copies. A tree copied without git history
# records its commit from FD_GIT_COMMIT (set it when sending the tree).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/gpu-crosscheck}"
mkdir -p "$out"
source scripts/device-env.sh
export CUDACXX="${CUDACXX:-/usr/local/cuda/bin/nvcc}" OMP_WAIT_POLICY=PASSIVE
{ cmake --preset cuda && cmake --build --preset cuda -j "$(nproc)"; } >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
rc=0
ctest --test-dir build/cuda -L unit -j 8 >"$out/unit_tests.log" 2>&1 || rc=1
tail -8 "$out/unit_tests.log"
FD_BIN_DIR=build/cuda/bin FD_REQUIRE_BINARIES=1 python3 -m pytest -q -p no:cacheprovider tests/python >"$out/pytest.log" 2>&1 || rc=1
tail -4 "$out/pytest.log"
build/cuda/bin/fd-bench run experiments/quickstart.json --out "$out/quickstart" --quiet || rc=1
cp "$out/quickstart/summary.json" "$out/quickstart_summary.json"
python3 tests/gpu/hf_crosscheck.py --bin-dir build/cuda/bin --out "$out/hf_crosscheck_fp16.json" || rc=1
python3 tests/gpu/hf_crosscheck.py --bin-dir build/cuda/bin --dtype bf16 --seed 77 \
  --models tiny-llama-gqa,tiny-opt,small-llama,llama-3-8b:1 --out "$out/hf_crosscheck_bf16.json" || rc=1
# the published-model zoo (experiments/models/README.md) at 1-2 layers, as sharded checkpoints
python3 tests/gpu/hf_crosscheck.py --bin-dir build/cuda/bin --zoo --seed 91 --out "$out/hf_crosscheck_zoo.json" || rc=1
exit $rc
