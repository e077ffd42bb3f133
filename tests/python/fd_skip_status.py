"""A pytest plugin (loaded by conftest.py): a session in which every test skipped and none ran exits with the code in
$FD_PYTEST_ALL_SKIPPED_EXIT (ctest sets 77, its SKIP_RETURN_CODE for the pytest entries), so that ctest lists the file
as "Skipped" rather than "Passed". A file with some tests run and some skipped passes as before, its skips listed by
-rs. Without the variable nothing changes."""
from __future__ import annotations

import os

_ran = {"passed": 0, "failed": 0, "skipped": 0}


def pytest_runtest_logreport(report):
    if report.when == "call" and report.passed:
        _ran["passed"] += 1
    elif report.failed:
        _ran["failed"] += 1
    elif report.skipped and report.when in ("setup", "call"):
        _ran["skipped"] += 1


def pytest_sessionfinish(session, exitstatus):
    code = os.environ.get("FD_PYTEST_ALL_SKIPPED_EXIT")
    if code and int(exitstatus) == 0 and _ran["passed"] == 0 and _ran["failed"] == 0 and _ran["skipped"] > 0:
        session.exitstatus = int(code)
