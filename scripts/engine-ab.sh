#!/usr/bin/env bash
# On the GPU machine: one engine's runs from two builds side by side, alternating, in one call (a refactor's
# "benchmarks within noise", issue 46; the S-worker's pinning, issue 41).
#   usage: scripts/engine-ab.sh OUT OLD_SRC
# OLD_SRC: the older tree as a .tar.gz made on the development machine (`git archive OLD | gzip >F`, carried in
# results/); it is unpacked into /tmp/engine-ab-old and built there (cuda preset, fd-bench and fd-rworker only, with
# this tree's .deps). This tree's build/cuda is (re)built first. Then for each round, for each batch size, each side
# runs `fd-bench run AB_CONFIG --set workload.requests=B` with its own build and its own copy of the config:
#   old   the older tree's fd-bench
#   new   this tree's fd-bench
#   pin   this tree's fd-bench with --set engine.sworker_cpus=AB_SWORKER_CPUS (only when AB_SWORKER_CPUS is set: "rest",
#         the cores the config's pinned R-workers leave free, or a list such as 12-15): once the workers are spawned
#         on their own cores, every S-worker thread is moved to these. (A `taskset` around fd-bench cannot do it: the
#         engine refuses to pin workers to cores its own process may not use.)
# Settings: AB_CONFIG (default experiments/baselines/llama-2-7b-fastdecode.json), AB_BATCHES (default "256 1024"),
# AB_ROUNDS (default 2), AB_SIDES (default "old new", plus pin when AB_SWORKER_CPUS is set).
# Results: OUT/AB.md and OUT/ab.json (per side and B: each run's decode steps' median step_ms and busiest-worker compute,
# decode-only tokens/s; written after every run, so a call cut short still returns what ran), OUT/runs.tar.gz (the
# run folders' summary.json and steps.jsonl), OUT/ab.log. A tree copied without git history records its commit from
# FD_GIT_COMMIT (set it when sending the tree); the old side's runs record the commit `git archive` wrote into OLD_SRC.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: scripts/engine-ab.sh OUT OLD_SRC}"
old_src="$(realpath "${2:?usage: scripts/engine-ab.sh OUT OLD_SRC}")"
# The older tree's commit, for its runs' provenance (`git archive` writes it into the tar; else "unknown-old"): without
# it the old side would take this tree's FD_GIT_COMMIT.
old_commit="$(gzip -dc "$old_src" | git get-tar-commit-id 2>/dev/null)" || true
old_commit="${old_commit:-unknown-old}"
mkdir -p "$out/runs"
[ -f scripts/device-env.sh ] && [ -d .deps ] && source scripts/device-env.sh
export CUDACXX="${CUDACXX:-/usr/local/cuda/bin/nvcc}" OMP_WAIT_POLICY=PASSIVE
config="${AB_CONFIG:-experiments/baselines/llama-2-7b-fastdecode.json}"
sides="${AB_SIDES:-old new${AB_SWORKER_CPUS:+ pin}}"
old=/tmp/engine-ab-old
log="$out/ab.log"
{ cmake --preset cuda && cmake --build --preset cuda -j "$(nproc)" --target fd-bench fd-rworker; } >"$out/build_new.log" 2>&1 ||
  { tail -30 "$out/build_new.log"; exit 1; }
echo "new built ($SECONDS s)" | tee -a "$log"
if [[ " $sides " == *" old "* ]]; then
  if [ ! -x "$old/build/cuda/bin/fd-bench" ]; then
    rm -rf "$old" && mkdir -p "$old" && tar -xzf "$old_src" -C "$old" || { echo "cannot unpack $old_src"; exit 1; }
    ln -s "$PWD/.deps" "$old/.deps"
    (cd "$old" && cmake --preset cuda && cmake --build --preset cuda -j "$(nproc)" --target fd-bench fd-rworker) \
      >"$out/build_old.log" 2>&1 || { tail -30 "$out/build_old.log"; exit 1; }
  fi
  echo "old built ($SECONDS s)" | tee -a "$log"
fi
summarize() {
python3 - "$out" <<'EOF'
import glob, json, os, statistics, sys
out = sys.argv[1]
rows = {}
for d in sorted(glob.glob(os.path.join(out, "runs", "*"))):
    side, b, rnd = os.path.basename(d).rsplit("-", 2)
    try:
        s = json.load(open(os.path.join(d, "summary.json")))
        steps = [json.loads(l) for l in open(os.path.join(d, "steps.jsonl")) if l.strip()]
    except (OSError, ValueError):
        continue
    dec = [x for x in steps if x.get("decode_tokens", 0) > 0 and x.get("prefill_tokens", 0) == 0]
    if not dec or s.get("status") != "ok":
        continue
    r = {"run": os.path.basename(d), "status": s.get("status"), "decode_steps": len(dec),
         "step_ms_p50": statistics.median(x["step_ms"] for x in dec),
         "r_compute_max_ms_p50": statistics.median(x["breakdown_ms"].get("r_compute_max", 0) for x in dec),
         "decode_tok_s": s["results"].get("decode_only", {}).get("tokens_per_s"),
         "commit": s.get("provenance", {}).get("git_commit")}
    rows.setdefault("%s b=%s" % (side, b), []).append(r)
json.dump(rows, open(os.path.join(out, "ab.json"), "w"), indent=1)
with open(os.path.join(out, "AB.md"), "w") as f:
    f.write("| side, B | runs | decode step p50, ms (each run) | busiest worker p50, ms | decode tok/s |\n|---|---|---|---|---|\n")
    for k in sorted(rows):
        rs = rows[k]
        f.write("| %s | %d | %s | %s | %s |\n" % (k, len(rs), " / ".join("%.2f" % r["step_ms_p50"] for r in rs),
                " / ".join("%.2f" % r["r_compute_max_ms_p50"] for r in rs),
                " / ".join("%.0f" % r["decode_tok_s"] if r["decode_tok_s"] else "-" for r in rs)))
print(open(os.path.join(out, "AB.md")).read())
EOF
}
rc=0
for round in $(seq 1 "${AB_ROUNDS:-2}"); do
  for b in ${AB_BATCHES:-256 1024}; do
    for side in $sides; do
      run="$out/runs/$side-$b-$round"
      case "$side" in
        old) cmd=(env -C "$old" FD_GIT_COMMIT="$old_commit" build/cuda/bin/fd-bench run "$config") ;;
        new) cmd=(build/cuda/bin/fd-bench run "$config") ;;
        pin) cmd=(build/cuda/bin/fd-bench run "$config" --set engine.sworker_cpus="${AB_SWORKER_CPUS:?pin needs AB_SWORKER_CPUS}") ;;
        *) echo "unknown side $side"; exit 2 ;;
      esac
      t0=$SECONDS
      "${cmd[@]}" --set workload.requests="$b" --out "$(realpath -m "$run")" --quiet >>"$log" 2>&1 || { rc=1; echo "$side B=$b round $round failed" | tee -a "$log"; }
      echo "$side B=$b round $round: $((SECONDS - t0)) s" | tee -a "$log"
      rm -f "$run"/trace.json "$run"/requests.jsonl
      summarize >/dev/null
    done
  done
done
summarize
tar -czf "$out/runs.tar.gz" -C "$out" runs && rm -rf "$out/runs"
exit $rc
