#!/usr/bin/env bash
# On the GPU machine: the R-workers in service before and after a change, with one profiler (issue 43).
#   usage: scripts/rworker-ab.sh OUT PATCH
# PATCH: `git diff OLD -- <files>` of the change (applied to this tree; made on the development machine, carried in
# results/). The tree's files with PATCH reversed are built into /tmp/rworker-before (fd-rworker only, CPU), then the
# service profile (scripts/model-validation.sh profile, its SERVICE_* settings) runs with that worker (SVC_TAG -before)
# and with this tree's (-after), in that order, AB_ROUNDS times (default 1); each file names its worker in
# r_service.rworker_binary. Needs build/cuda (scripts/gpu-sworker-bench.sh OUT build).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: scripts/rworker-ab.sh OUT PATCH}"
patch_file="$(realpath "${2:?usage: scripts/rworker-ab.sh OUT PATCH}")"
mkdir -p "$out"
[ -f scripts/device-env.sh ] && [ -d .deps ] && source scripts/device-env.sh
before=/tmp/rworker-before
rm -rf "$before" && mkdir -p "$before"
tar --exclude=./build --exclude=./.deps --exclude=./results --exclude=./.git -cf - . | tar -xf - -C "$before"
(cd "$before" && patch -R -p1 --quiet <"$patch_file") || { echo "the patch does not reverse on this tree"; exit 1; }
ln -s "$PWD/.deps" "$before/.deps" 2>/dev/null
{ cmake -S "$before" -B "$before/b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFD_ENABLE_CUDA=OFF -DFD_ENABLE_GLOO=OFF &&
  cmake --build "$before/b" -j "$(nproc)" --target fd-rworker; } >"$out/before_build.log" 2>&1 ||
  { tail -20 "$out/before_build.log"; exit 1; }
echo "before: $(find "$before/b" -name fd-rworker -type f | head -1) ($SECONDS s)"
rc=0
for round in $(seq 1 "${AB_ROUNDS:-1}"); do
  for side in before after; do
    bin=build/cuda/bin/fd-rworker
    [ "$side" = before ] && bin=$(find "$before/b" -name fd-rworker -type f | head -1)
    SVC_TAG="-$side$([ "${AB_ROUNDS:-1}" -gt 1 ] && echo "-r$round")" RWORKER_BINARY="$bin" SM_COUNTS=" " \
      scripts/model-validation.sh "$out" profile || rc=1
  done
done
exit $rc
