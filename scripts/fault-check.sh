#!/usr/bin/env bash
# The fault-planting check: does the test suite go red when the code is wrong?
#
# Builds the project once per planted fault (cmake -DFD_PLANT_FAULT=NAME in build/faults; the faults are
# listed in fastdecode/core/fault.h), runs the whole suite (ctest, as scripts/test.sh does) against each,
# and requires every fault to turn it red; the same build without a fault must be green. Not part of
# the suite itself (it builds and runs the suite several times: ~15 minutes on 2 cores).
#
#   scripts/fault-check.sh [--gpu] [--out DIR] [FAULT...]
#
# Default: every fault but gpu_probe_fails, on the CPU suite. --gpu (on the GPU machine, after
# scripts/device-env.sh): the CUDA preset, FD_REQUIRE_GPU=1, and only the gpu-labelled tests, for the
# clean build and gpu_probe_fails (a failed device query must fail the GPU tests, not skip them).
# Writes DIR/faults.json and DIR/FAULTS.md (default DIR: results/faults). Exit 0 when every fault was
# caught and the clean build passed.
set -uo pipefail
cd "$(dirname "$0")/.."
gpu=0
out=results/faults
faults=()
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu) gpu=1 ;;
    --out) out="$2"; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "fault-check: unknown option $1" >&2; exit 2 ;;
    *) faults+=("$1") ;;
  esac
  shift
done
all=$(sed -n 's/^set(FD_FAULTS \(.*\))$/\1/p' CMakeLists.txt)
if [ ${#faults[@]} -eq 0 ]; then
  if [ $gpu -eq 1 ]; then faults=(gpu_probe_fails); else for f in $all; do [ "$f" = gpu_probe_fails ] || faults+=("$f"); done; fi
fi
for f in "${faults[@]}"; do
  [[ " $all " == *" $f "* ]] || { echo "fault-check: unknown fault '$f' (one of: $all)" >&2; exit 2; }
done
mkdir -p "$out"
[ $gpu -eq 0 ] && scripts/setup.sh
bdir=build/faults
preset=default
ctest_args=(-j "$(nproc)")
if [ $gpu -eq 1 ]; then
  source scripts/device-env.sh
  export CUDACXX="${CUDACXX:-/usr/local/cuda/bin/nvcc}"
  bdir=build/cuda  # the GPU machine's build: switching the fault rebuilds device_info.cu only
  preset=cuda
  export FD_REQUIRE_GPU=1
  ctest_args+=(-L gpu)
fi
export FD_REQUIRE_BINARIES=1 OMP_WAIT_POLICY=PASSIVE

results="[]"
run_one() {  # $1: fault name or "" (clean); appends a JSON row to $results
  local f="$1" label="${1:-none}" t0 t1 rc log failed n_failed n_total
  t0=$(date +%s)
  log="$out/ctest_${label}.log"
  echo "== fault: $label"
  if ! { cmake --preset "$preset" -B "$bdir" -DFD_PLANT_FAULT="$f" >"$out/build_${label}.log" 2>&1 &&
         cmake --build "$bdir" -j "$(nproc)" >>"$out/build_${label}.log" 2>&1; }; then
    echo "   build failed (see $out/build_${label}.log)"
    results=$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); r.append({"fault":sys.argv[2],"build_ok":False}); print(json.dumps(r))' "$results" "$label")
    return
  fi
  ctest --test-dir "$bdir" --output-on-failure "${ctest_args[@]}" >"$log" 2>&1
  rc=$?
  t1=$(date +%s)
  failed=$(sed -n 's/^[[:space:]]*[0-9]* - \(.*\) (Failed)\( .*\)\{0,1\}$/\1/p' "$log")
  n_failed=$(printf '%s' "$failed" | grep -c . || true)
  # "N% tests passed, K tests failed out of T", or "100% tests passed out of T" when some were skipped
  n_total=$(sed -n 's/.*tests \(passed\|failed\) out of \([0-9]*\).*/\2/p' "$log" | tail -1)
  echo "   ctest exit $rc: $n_failed of ${n_total:-?} tests failed ($((t1 - t0)) s)"
  printf '%s\n' "$failed" | head -8 | sed 's/^/     /'
  results=$(python3 -c '
import json, sys
r = json.loads(sys.argv[1])
failed = [l for l in sys.argv[5].splitlines() if l]
r.append({"fault": sys.argv[2], "build_ok": True, "ctest_exit": int(sys.argv[3]), "tests": int(sys.argv[4] or 0),
          "failed": len(failed), "failed_tests": failed, "seconds": int(sys.argv[6])})
print(json.dumps(r))' "$results" "$label" "$rc" "${n_total:-0}" "$failed" "$((t1 - t0))")
}

run_one ""
for f in "${faults[@]}"; do run_one "$f"; done
# Leave the tree clean: the fault build directory without a fault.
cmake --preset "$preset" -B "$bdir" -DFD_PLANT_FAULT= >/dev/null 2>&1

python3 - "$out" "$gpu" "$results" <<'EOF'
import json, os, platform, subprocess, sys, datetime
out, gpu, rows = sys.argv[1], sys.argv[2] == "1", json.loads(sys.argv[3])
def sh(*a):
    try:
        return subprocess.run(a, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""
commit = os.environ.get("FD_GIT_COMMIT") or sh("git", "rev-parse", "--short", "HEAD")
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
gpus = sh("nvidia-smi", "--query-gpu=name", "--format=csv,noheader") if gpu else ""
clean = next(r for r in rows if r["fault"] == "none")
faulty = [r for r in rows if r["fault"] != "none"]
ok = clean.get("build_ok") and clean.get("ctest_exit") == 0 and all(r.get("build_ok") and r.get("failed", 0) > 0 for r in faulty)
prov = {"git_commit": commit, "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "host": platform.node(),
        "cpu_model": cpu, "cpu_cores": os.cpu_count(), "gpus": [g for g in gpus.splitlines() if g],
        "command": " ".join(["scripts/fault-check.sh"] + (["--gpu"] if gpu else []) + [r["fault"] for r in faulty]),
        "suite": "ctest -L gpu with FD_REQUIRE_GPU=1 (cuda preset)" if gpu else "the whole ctest suite (default preset)"}
json.dump({"all_caught": bool(ok), "runs": rows, "provenance": prov}, open(os.path.join(out, "faults.json"), "w"), indent=1)
with open(os.path.join(out, "FAULTS.md"), "w") as f:
    f.write("# Planted faults vs the test suite (%s)\n\n" % prov["suite"])
    f.write("Commit `%s`, %s, %s (%d cores)%s. `%s`.\n\n" % (commit, prov["date_utc"], cpu, os.cpu_count(),
            ", " + ", ".join(prov["gpus"]) if prov["gpus"] else "", prov["command"]))
    f.write("| planted fault | tests failed | of | first failing tests |\n| --- | --- | --- | --- |\n")
    for r in rows:
        if not r.get("build_ok"):
            f.write("| %s | build failed | | |\n" % r["fault"])
            continue
        names = ", ".join("`%s`" % t for t in r["failed_tests"][:4]) + (" …" if r["failed"] > 4 else "")
        f.write("| %s | %s | %d | %s |\n" % (r["fault"] if r["fault"] != "none" else "none (clean build)",
                                            r["failed"], r["tests"], names))
    f.write("\n%s\n" % ("Every planted fault turned the suite red; the clean build passed." if ok else
                        "NOT every fault was caught (or the clean build failed): see faults.json."))
print(open(os.path.join(out, "FAULTS.md")).read())
sys.exit(0 if ok else 1)
EOF
