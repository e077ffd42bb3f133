#!/usr/bin/env python3
"""Lists the ctest entries that skipped, each with its reason, from ctest's JUnit report (ctest --output-junit FILE;
scripts/test.sh runs this after ctest). ctest counts and names its skips but prints no reason; the reason is in each
entry's output: a pytest case's entry prints "SKIPPED: <reason>" (tests/cmake/pytest_case_result.sh), a file whose
every case skipped pytest's "-rs" lines, a GoogleTest case gtest's "<file>:<line>: Skipped" and its message, an
entry that could not be built "<name> did not run: <why>". Usage: ctest_skips.py JUNIT.xml"""
from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET

SKIP_MESSAGES = ("SKIP_RETURN_CODE", "SKIP_REGULAR_EXPRESSION_MATCHED")


def reasons(out: str) -> list[str]:
    lines = [ln.rstrip() for ln in out.splitlines()]
    found: list[str] = []
    for i, ln in enumerate(lines):
        m = (re.match(r"SKIPPED: (.*)", ln) or re.match(r"SKIPPED \[\d+\] \S+:\d+: (.*)", ln)
             or re.search(r" did not run: (.*)", ln))
        if m:
            found.append(m.group(1))
        elif re.search(r":\d+: Skipped$", ln) and i + 1 < len(lines) and lines[i + 1].strip():
            found.append(lines[i + 1].strip())
    return list(dict.fromkeys(found))


def main(path: str) -> int:
    skipped = []
    for case in ET.parse(path).getroot().iter("testcase"):
        sk = case.find("skipped")
        if case.get("status") == "notrun" and sk is not None and (sk.get("message") or "").startswith(SKIP_MESSAGES):
            why = reasons(case.findtext("system-out") or "")
            skipped.append((case.get("name"), "; ".join(why) or "(no reason in its output: see ctest's LastTest.log)"))
    print(f"{len(skipped)} ctest entries skipped:")
    for name, why in skipped:
        print(f"  {name}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
