"""What a ctest log says (scripts/fault-check.sh): how many tests ran, which failed (with ctest's status: Failed,
Timeout, SEGFAULT, Subprocess aborted, ...) and which were skipped.

ctest ends with "N% tests passed, K tests failed out of T", or "100% tests passed out of T" when none failed (as
when some were skipped), then "The following tests did not run:" (the skipped, "(Skipped)" or "(Disabled)") and
"The following tests FAILED:" (each "  12 - name (Status)", labels may follow).

  python3 scripts/fault_check_log.py [--brief] CTEST_LOG   (JSON; --brief: a count line and the first 8 failures)
"""
import json
import re
import sys

_SUMMARY = re.compile(r"^\d+% tests passed(?:, (\d+) tests failed)? out of (\d+)\s*$")
_ENTRY = re.compile(r"^\s*\d+ - (.+?) \(([A-Za-z_ ]+)\)(?:\s+\S.*)?$")


def parse(text):
    total, failed, status, skipped = 0, [], [], []
    section = None
    for line in text.splitlines():
        m = _SUMMARY.match(line.strip())
        if m:
            total = int(m.group(2))
            continue
        if line.startswith("The following tests FAILED:"):
            section = "failed"
            continue
        if line.startswith("The following tests did not run:"):
            section = "skipped"
            continue
        if section:
            e = _ENTRY.match(line)
            if not e:
                section = None
                continue
            if section == "failed":
                failed.append(e.group(1))
                status.append(e.group(2))
            else:
                skipped.append(e.group(1))
    return {"tests": total, "failed_tests": failed, "failed_status": status, "skipped_tests": skipped}


def main(argv):
    brief = "--brief" in argv
    paths = [a for a in argv if a != "--brief"]
    if len(paths) != 1:
        sys.exit("usage: fault_check_log.py [--brief] CTEST_LOG")
    r = parse(open(paths[0], errors="replace").read())
    if not brief:
        print(json.dumps(r, indent=1))
        return
    print("%d of %d tests failed, %d skipped" % (len(r["failed_tests"]), r["tests"], len(r["skipped_tests"])))
    for t, s in list(zip(r["failed_tests"], r["failed_status"]))[:8]:
        print(t if s == "Failed" else "%s (%s)" % (t, s))


if __name__ == "__main__":
    main(sys.argv[1:])
