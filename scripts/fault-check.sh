#!/usr/bin/env bash
# The fault-planting check: does the test suite go red when the code is wrong?
#
# Builds the project once per planted fault (cmake -DFD_PLANT_FAULT=NAME in build/faults; the faults are
# listed in fastdecode/core/fault.h and CMakeLists.txt FD_FAULTS), runs the whole suite (ctest, as
# scripts/test.sh does) against each, and requires every fault to turn it red; the same build without a fault
# must be green. Not part of the suite itself (it builds and runs the suite once per fault and once clean:
# on the 2-core development machine ~10 minutes each).
#
#   scripts/fault-check.sh [--gpu] [--out DIR] [--faults A,B,...] [--ctest-args 'ARGS']
#                          [--ctest-args-for FAULT 'ARGS']... [--build-dir DIR] [FAULT...]
#
# Default: every fault but those of FD_GPU_FAULTS (CMakeLists.txt: only a GPU can show them), on the CPU
# suite. --gpu (on the GPU machine; it sources scripts/device-env.sh itself): the cuda preset in build/cuda,
# FD_REQUIRE_GPU=1, only the gpu-labelled tests, for the clean build and by default the FD_GPU_FAULTS
# (gpu_probe_fails: a failed device query must fail the GPU tests, not skip them; cuda_decode_skips_last_kv).
# --faults (or FAULT... as arguments) chooses the faults, CPU or GPU; --ctest-args adds ctest arguments to every run,
# the clean build's included (a part of the suite, e.g. "-LE 'python|layering'": the GoogleTest entries and the
# fuzz run), --ctest-args-for to one fault's run instead; the record lists each run's ctest arguments. --build-dir: a
# build tree of the same preset to plant the faults in (e.g. build/default, already built: switching the fault rebuilds
# the fault's files only, not the whole project; it is left without a fault). Writes DIR/faults.json, DIR/FAULTS.md
# and each run's ctest log (default DIR: results/faults).
# Exit 0 when every fault was caught and the clean build passed.
set -uo pipefail
cd "$(dirname "$0")/.."
gpu=0
out=results/faults
faults=()
extra_ctest=""
bdir_arg=""
declare -A extra_for=()
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu) gpu=1 ;;
    --out) out="$2"; shift ;;
    --faults) IFS=, read -r -a more <<<"$2"; faults+=("${more[@]}"); shift ;;
    --ctest-args) extra_ctest="$2"; shift ;;
    --ctest-args-for) extra_for["$2"]="$3"; shift 2 ;;
    --build-dir) bdir_arg="$2"; shift ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    -*) echo "fault-check: unknown option $1" >&2; exit 2 ;;
    *) faults+=("$1") ;;
  esac
  shift
done
all=$(sed -n 's/^set(FD_FAULTS \(.*\))$/\1/p' CMakeLists.txt)
gpu_only=$(sed -n 's/^set(FD_GPU_FAULTS \(.*\))$/\1/p' CMakeLists.txt)
[ -n "$all" ] && [ -n "$gpu_only" ] || { echo "fault-check: FD_FAULTS / FD_GPU_FAULTS not found in CMakeLists.txt" >&2; exit 2; }
if [ ${#faults[@]} -eq 0 ]; then
  if [ $gpu -eq 1 ]; then read -r -a faults <<<"$gpu_only"
  else for f in $all; do [[ " $gpu_only " == *" $f "* ]] || faults+=("$f"); done; fi
fi
for f in "${faults[@]}" "${!extra_for[@]}"; do
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
  bdir=build/cuda  # the GPU machine's build: switching the fault rebuilds the fault's files only
  preset=cuda
  export FD_REQUIRE_GPU=1
  ctest_args+=(-L gpu)
fi
[ -n "$bdir_arg" ] && bdir="$bdir_arg"
export OMP_WAIT_POLICY=PASSIVE
# Missing programs fail the CPU suite, as in CI. Not with --gpu: the cuda preset leaves Gloo out on purpose, and the
# Gloo-only tests (tensor ranks sharing one GPU) would then fail instead of skipping (seen on the H100 at 6b65906:
# the clean build's only 10 failures); the GPU tests are held to the device by FD_REQUIRE_GPU=1.
[ $gpu -eq 1 ] || export FD_REQUIRE_BINARIES=1

runs="$out/runs.tsv"
: >"$runs"
run_one() {  # $1: fault name or "" (clean); appends a row to $runs: label, build ok, ctest exit, seconds, ctest args
  local f="$1" label="${1:-none}" t0 t1 rc log args=("${ctest_args[@]}") more=""
  more="$extra_ctest"
  if [ -n "$f" ]; then more="${extra_for[$f]-$extra_ctest}"; fi
  if [ -n "$more" ]; then eval "args+=($more)"; fi  # quoted as on a command line: -LE 'python|fuzz'
  t0=$(date +%s)
  log="$out/ctest_${label}.log"
  echo "== fault: $label"
  if ! { cmake --preset "$preset" -B "$bdir" -DFD_PLANT_FAULT="$f" >"$out/build_${label}.log" 2>&1 &&
         cmake --build "$bdir" -j "$(nproc)" >>"$out/build_${label}.log" 2>&1; }; then
    echo "   build failed (see $out/build_${label}.log)"
    printf '%s\t0\t\t\t\n' "$label" >>"$runs"
    return
  fi
  ctest --test-dir "$bdir" --output-on-failure "${args[@]}" >"$log" 2>&1
  rc=$?
  t1=$(date +%s)
  printf '%s\t1\t%s\t%s\t%s\n' "$label" "$rc" "$((t1 - t0))" "${args[*]}" >>"$runs"
  echo "   ctest exit $rc ($((t1 - t0)) s)"
  python3 scripts/fault_check_log.py --brief "$log" | sed 's/^/     /'
}

# Writes DIR/faults.json and DIR/FAULTS.md from the runs so far: after each run ($1 = partial: a record cut short
# still says what ran), and at the end ($1 = final: printed, and the exit status).
summarize() {
python3 - "$out" "$gpu" "$runs" "${ctest_args[*]}" "$extra_ctest" "${faults[*]}" "$extra_json" "$1" "$bdir_arg" <<'EOF'
import json, os, platform, subprocess, sys, datetime
sys.path.insert(0, "scripts")
from fault_check_log import parse
out, gpu, runs_tsv, base_args, extra, faults = sys.argv[1], sys.argv[2] == "1", sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6].split()
bdir_arg = sys.argv[9]
extra_for = dict(l.split("\t", 1) for l in sys.argv[7].splitlines() if l)
final = sys.argv[8] == "final"
def sh(*a):
    try:
        return subprocess.run(a, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""
rows = []
for line in open(runs_tsv):
    label, ok, rc, secs, args = line.rstrip("\n").split("\t")
    r = {"fault": label, "build_ok": ok == "1"}
    if r["build_ok"]:
        p = parse(open(os.path.join(out, "ctest_%s.log" % label), errors="replace").read())
        r.update({"ctest_exit": int(rc), "ctest_args": args, "tests": p["tests"], "failed": len(p["failed_tests"]),
                  "failed_tests": p["failed_tests"], "failed_status": p["failed_status"],
                  "skipped": len(p["skipped_tests"]), "skipped_tests": p["skipped_tests"], "seconds": int(secs)})
    rows.append(r)
# FD_GIT_COMMIT names the commit of a tree copied to another machine (whose git metadata, if any, is stale): then
# whether it had changes is not known here and is not claimed either way.
env_commit = os.environ.get("FD_GIT_COMMIT")
commit = env_commit or sh("git", "rev-parse", "--short", "HEAD")
dirty = None if env_commit else sh("git", "status", "--porcelain", "--untracked-files=no")
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
gpus = sh("nvidia-smi", "--query-gpu=name", "--format=csv,noheader") if gpu else ""
clean = next(r for r in rows if r["fault"] == "none")
faulty = [r for r in rows if r["fault"] != "none"]
# The clean build must pass every test it ran, and each fault must fail at least one.
ok = bool(clean.get("build_ok") and clean.get("ctest_exit") == 0 and clean.get("failed") == 0 and clean.get("tests", 0) > 0
          and all(r.get("build_ok") and r.get("failed", 0) > 0 for r in faulty))
cmd = (["scripts/fault-check.sh"] + (["--gpu"] if gpu else []) + (["--build-dir", bdir_arg] if bdir_arg else [])
       + (['--ctest-args "%s"' % extra] if extra else [])
       + ['--ctest-args-for %s "%s"' % kv for kv in sorted(extra_for.items())] + ["--faults", ",".join(faults)])
suite = "ctest -L gpu with FD_REQUIRE_GPU=1 (cuda preset)" if gpu else "the whole ctest suite (default preset)"
if extra or extra_for:
    suite += "; a part of it where the column ctest arguments narrows it"
prov = {"git_commit": commit, "git_commit_source": "FD_GIT_COMMIT" if env_commit else "git",
        "tracked_changes": None if dirty is None else bool(dirty),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "host": platform.node(),
        "cpu_model": cpu, "cpu_cores": os.cpu_count(), "gpus": [g for g in gpus.splitlines() if g],
        "command": " ".join(cmd), "ctest": "ctest --output-on-failure " + base_args,
        "suite": suite}
done = "" if final else "PARTIAL: %d of %d runs done (the clean build and %s). " % (
    len(rows), len(faults) + 1, ", ".join(faults))
json.dump({"all_caught": ok if final else None, "complete": final, "runs": rows, "provenance": prov}, open(os.path.join(out, "faults.json"), "w"), indent=1)
with open(os.path.join(out, "FAULTS.md"), "w") as f:
    f.write("# Planted faults vs the test suite (%s)\n\n" % prov["suite"])
    f.write(done)
    f.write("Commit `%s`%s, %s, %s (%d cores)%s. `%s`.\n\n" % (
        commit, " WITH UNCOMMITTED CHANGES" if dirty else (" (from FD_GIT_COMMIT)" if env_commit else ""), prov["date_utc"], cpu, os.cpu_count(),
        ", " + ", ".join(prov["gpus"]) if prov["gpus"] else "", prov["command"]))
    f.write("| planted fault | ctest arguments | tests failed | of | skipped | seconds | failing tests |\n"
            "| --- | --- | --- | --- | --- | --- | --- |\n")
    for r in rows:
        if not r.get("build_ok"):
            f.write("| %s | | build failed | | | | |\n" % r["fault"])
            continue
        names = ", ".join("`%s`%s" % (t.replace("|", "\\|"), "" if s == "Failed" else " (%s)" % s)
                          for t, s in zip(r["failed_tests"], r["failed_status"]))
        f.write("| %s | `%s` | %d | %d | %d | %d | %s |\n" % (r["fault"] if r["fault"] != "none" else "none (clean build)",
                r["ctest_args"].replace("|", "\\|"), r["failed"], r["tests"], r["skipped"], r["seconds"], names))
    skipped = clean.get("skipped_tests", [])
    if skipped:
        f.write("\nSkipped in the clean build (%d): %s.\n" % (len(skipped), ", ".join("`%s`" % t for t in skipped)))
    if final:
        f.write("\n%s\n" % ("Every planted fault turned the suite red; the clean build passed." if ok else
                            "NOT every fault was caught (or the clean build failed): see faults.json."))
if final:
    print(open(os.path.join(out, "FAULTS.md")).read())
sys.exit(0 if ok or not final else 1)
EOF
}
extra_json=$(for k in "${!extra_for[@]}"; do printf '%s\t%s\n' "$k" "${extra_for[$k]}"; done)
run_one ""
summarize partial
for f in "${faults[@]}"; do run_one "$f"; summarize partial; done
# Leave the tree clean: the fault build directory without a fault.
cmake --preset "$preset" -B "$bdir" -DFD_PLANT_FAULT= >/dev/null 2>&1
summarize final

