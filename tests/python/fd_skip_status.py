"""A pytest plugin (loaded by conftest.py; ctest's entries name it with -p) that makes every skipped case a ctest skip
(tests/cmake/pytest_cases.cmake registers the entries; docs/CORRECTNESS.md, "Skips are visible"). Each part acts only
when its variable is set; without them pytest behaves as usual.

* FD_PYTEST_COLLECT_OUT=DIR (with --collect-only): when ctest starts, one collection of every test file writes
  DIR/cases.cmake, a call `fd_pytest_case(<file stem> <case id> <key>)` per collected case, and DIR/<stem>.cases, the
  case ids of each file one a line.
* FD_PYTEST_RESULTS=DIR, FD_PYTEST_RUN_ID=ID, FD_PYTEST_CASES=FILE (ctest's entry pytest.<stem>, which runs the whole
  file in one process): each case's outcome goes to DIR/<key>, "ID passed|skipped|failed" then the skip reason or the
  failure, read by the case's own entry pytest.<stem>::<case id> (tests/cmake/case_result.sh). A case run here
  that FILE does not list, or one FILE lists that is not collected, fails the session (the list is from an older
  collection: FD_PYTEST_STALE removes it, so the next ctest collects again).
* FD_PYTEST_ALL_SKIPPED_EXIT=CODE: a session in which no case passed or failed but some skipped (a case, or the whole
  module at collection) exits CODE (ctest's SKIP_RETURN_CODE, 77) rather than 0 (or pytest's 5, "no tests ran"), so
  that the file's entry is "Skipped", not "Passed"."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

_ran = {"passed": 0, "failed": 0, "skipped": 0}
_state: dict = {"cases": {}, "mismatch": [], "registered": None}


def case_key(stem: str, case_id: str) -> str:
    """The name of a case's result file: the same at collection and in the run, whatever characters the id holds."""
    return hashlib.sha1(f"{stem}::{case_id}".encode()).hexdigest()[:20]


def _split(nodeid: str) -> tuple[str, str]:
    """(file stem, case id within the file): the node id less its file part, whichever rootdir pytest chose."""
    path, case_id = nodeid.split("::", 1)
    return Path(path).stem, case_id


def _bracket(s: str) -> str:
    """s as a CMake bracket argument ([=[...]=] with enough '=' that s cannot close it)."""
    n = 1
    while (s + f"]{'=' * n}]").find(f"]{'=' * n}]") != len(s):
        n += 1
    return f"[{'=' * n}[{s}]{'=' * n}]"


def _reason(report) -> str:
    lr = report.longrepr
    if isinstance(lr, tuple) and len(lr) == 3:  # a skip: (file, line, "Skipped: reason")
        msg = str(lr[2])
        return msg[len("Skipped: "):] if msg.startswith("Skipped: ") else msg
    return str(lr) if lr else ""


def pytest_collection_finish(session):
    out = os.environ.get("FD_PYTEST_COLLECT_OUT")
    if out:
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        for old in d.glob("*.cases"):
            old.unlink()
        by_file: dict[str, list[str]] = {}
        for item in session.items:
            stem, cid = _split(item.nodeid)
            by_file.setdefault(stem, []).append(cid)
        lines = []
        for stem, cids in by_file.items():
            (d / f"{stem}.cases").write_text("".join(c + "\n" for c in cids))
            lines += [f"fd_pytest_case({_bracket(stem)} {_bracket(c)} {_bracket(case_key(stem, c))})\n" for c in cids]
        (d / "cases.cmake").write_text("".join(lines))
    listed = os.environ.get("FD_PYTEST_CASES")
    if listed is not None and os.environ.get("FD_PYTEST_RESULTS") and not session.testsfailed:
        p = Path(listed)
        registered = p.read_text().splitlines() if p.is_file() else []
        here = [_split(item.nodeid)[1] for item in session.items]
        new = [c for c in here if c not in set(registered)]
        gone = [c for c in registered if c not in set(here)]
        if new or gone:
            _state["mismatch"] = [f"collected but not registered with ctest: {c}" for c in new] + \
                                 [f"registered with ctest but not collected: {c}" for c in gone]
            stale = os.environ.get("FD_PYTEST_STALE")
            if stale and os.path.exists(stale):
                os.remove(stale)


def pytest_sessionstart(session):
    d = os.environ.get("FD_PYTEST_RESULTS")
    if d:
        Path(d).mkdir(parents=True, exist_ok=True)
        for f in Path(d).iterdir():
            if f.is_file():
                f.unlink()


def _write_result(nodeid: str, outcome: str, detail: str) -> None:
    d = os.environ.get("FD_PYTEST_RESULTS")
    if not d:
        return
    stem, cid = _split(nodeid)
    run_id = os.environ.get("FD_PYTEST_RUN_ID", "")
    (Path(d) / case_key(stem, cid)).write_text(f"{run_id} {outcome}\n{detail}\n")


def pytest_runtest_logreport(report):
    if report.when == "call" and report.passed:
        _ran["passed"] += 1
    elif report.failed:
        _ran["failed"] += 1
    elif report.skipped and report.when in ("setup", "call"):
        _ran["skipped"] += 1
    # One outcome a case, written at its teardown: failed if any phase failed, else skipped if setup or call skipped
    # (an xfail counts as skipped: it did not pass), else passed.
    c = _state["cases"].setdefault(report.nodeid, {"outcome": None, "detail": ""})
    if report.failed and c["outcome"] != "failed":
        c["outcome"], c["detail"] = "failed", f"{report.when} failed:\n{report.longreprtext}"
    elif report.skipped and c["outcome"] is None:
        why = _reason(report)
        if hasattr(report, "wasxfail"):
            why = f"xfail: {report.wasxfail or why}"
        c["outcome"], c["detail"] = "skipped", why
    elif report.when == "call" and report.passed and c["outcome"] is None:
        c["outcome"] = "passed"
    if report.when == "teardown":
        _write_result(report.nodeid, c["outcome"] or "failed", c["detail"] or "no outcome recorded")


def pytest_collectreport(report):
    if report.skipped:  # the whole module skipped at collection (pytest.skip(..., allow_module_level=True))
        _ran["skipped"] += 1


def pytest_terminal_summary(terminalreporter):
    for m in _state["mismatch"]:
        terminalreporter.write_line(f"fd_skip_status: {m}", red=True)
    if _state["mismatch"]:
        terminalreporter.write_line("fd_skip_status: the case list ctest registered is older than the test file: "
                                    "run ctest again (it collects anew)", red=True)


def pytest_sessionfinish(session, exitstatus):
    if _state["mismatch"]:
        session.exitstatus = 1
        return
    code = os.environ.get("FD_PYTEST_ALL_SKIPPED_EXIT")
    if code and int(exitstatus) in (0, 5) and _ran["passed"] == 0 and _ran["failed"] == 0 and _ran["skipped"] > 0:
        session.exitstatus = int(code)
