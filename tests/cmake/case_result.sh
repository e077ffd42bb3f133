#!/bin/sh
# ctest's entry for one test case that runs inside a batch (a pytest file: tests/cmake/pytest_cases.cmake; GoogleTest
# suites: tests/cmake/gtest_suites.cmake, CASES): RESULT RUN_ID BATCH_ENTRY. Reports what the batch's run (ctest entry
# BATCH_ENTRY, in this ctest invocation RUN_ID) wrote for the case in RESULT (tests/python/fd_skip_status.py,
# tests/unit/case_results.cpp): passed -> exit 0; skipped -> the reason, exit 77 (ctest: "Skipped"); failed -> the
# failure, exit 1. No result from this invocation is a failure, never a pass.
result=$1 run_id=$2 entry=$3
if [ ! -f "$result" ]; then
  echo "FAILED: no result: $entry (which runs this case) did not run in this ctest invocation or stopped before" \
       "this case; select it too (ctest -R '$entry')"
  exit 1
fi
{ read -r id outcome; detail=$(cat); } < "$result"
if [ "$id" != "$run_id" ]; then
  echo "FAILED: no result from this ctest invocation (the one found is from an earlier run): select $entry too" \
       "(ctest -R '$entry')"
  exit 1
fi
case "$outcome" in
  passed) echo "PASSED (run by $entry)"; exit 0 ;;
  skipped) echo "SKIPPED: $detail"; exit 77 ;;
  *) echo "FAILED (run by $entry; its output has the whole report):"; echo "$detail"; exit 1 ;;
esac
