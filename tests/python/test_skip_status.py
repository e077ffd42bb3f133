"""Skips you can see (docs/CORRECTNESS.md). ctest counts every skipped pytest case: a file's entry runs it
(fd_skip_status.py records each case's outcome; a file whose every test skipped exits $FD_PYTEST_ALL_SKIPPED_EXIT,
ctest's SKIP_RETURN_CODE 77) and each case has its own entry (tests/cmake/pytest_cases.cmake) that reports it Passed,
Skipped with its reason, or Failed, never a silent pass; and every kernel-grid case of an ISA the CPU lacks skips as
its own GoogleTest case (tests/unit/require_isa.h), each its own ctest entry (the kernel grids' through
fd_gtest_suites' CASES: tests/cmake/gtest_suites.cmake, tests/unit/case_results.cpp)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

CASES = {
    "all_skipped": ("import pytest\n\ndef test_a():\n    pytest.skip('no device')\n\n"
                    "@pytest.mark.skipif(True, reason='no tool')\ndef test_b():\n    pass\n", 77),
    "one_ran": "import pytest\n\ndef test_a():\n    pytest.skip('no device')\n\ndef test_b():\n    assert 1\n",
    "one_failed": "import pytest\n\ndef test_a():\n    pytest.skip('x')\n\ndef test_b():\n    assert 0\n",
    "module_skipped": "import pytest\npytest.skip('no matplotlib', allow_module_level=True)\n\ndef test_a():\n    pass\n",
}


def run(tmp_path, name, body, env_code="77"):
    f = tmp_path / f"test_{name}.py"
    f.write_text(body)
    env = dict(os.environ, PYTHONPATH=str(HERE), PYTHONDONTWRITEBYTECODE="1")
    for k in [k for k in env if k.startswith("FD_PYTEST_")]:
        env.pop(k)
    if env_code:
        env["FD_PYTEST_ALL_SKIPPED_EXIT"] = env_code
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "fd_skip_status",
                           "--rootdir", str(tmp_path), str(f)], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=120).returncode


@pytest.mark.parametrize("name,expected", [("all_skipped", 77), ("one_ran", 0), ("one_failed", 1),
                                           ("module_skipped", 77)])
def test_exit_codes(tmp_path, name, expected):
    body = CASES[name][0] if isinstance(CASES[name], tuple) else CASES[name]
    assert run(tmp_path, name, body) == expected


def test_without_the_variable_nothing_changes(tmp_path):
    assert run(tmp_path, "plain", CASES["all_skipped"][0], env_code=None) == 0


# ---- Through ctest: tests/cmake/pytest_cases.cmake on throwaway test files, as ctest reads it ----

MIXED = ("import pytest\n\ndef test_pass():\n    assert 1\n\ndef test_skip():\n    pytest.skip('no widget here')\n\n"
         "@pytest.mark.skipif(True, reason='no tool here')\ndef test_marker():\n    pass\n\n"
         "@pytest.mark.parametrize('x', ['a;b', 'c]=]d'])\ndef test_odd_ids(x):\n    assert x\n")
ALL_SKIPPED = "import pytest\n\ndef test_one():\n    pytest.skip('no device here')\n"
FAILING = "def test_ok():\n    assert 1\n\ndef test_bad():\n    assert 1 == 2, 'planted'\n"


def ctest_command() -> str:
    c = os.environ.get("FD_CTEST_COMMAND") or shutil.which("ctest")
    if not c:
        pytest.skip("ctest not found (FD_CTEST_COMMAND unset and no ctest on PATH)")
    return c


def make_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    """A source folder of test files (the plugin beside them) and a ctest folder whose CTestTestfile.cmake includes
    the real pytest_cases.cmake, set up as tests/CMakeLists.txt's include file sets it."""
    src, build = tmp_path / "src", tmp_path / "build"
    src.mkdir()
    build.mkdir()
    shutil.copy(HERE / "fd_skip_status.py", src / "fd_skip_status.py")
    (src / "conftest.py").write_text('pytest_plugins = ["fd_skip_status"]\n')
    for name, body in files.items():
        (src / f"{name}.py").write_text(body)
    test_files = ";".join(str(src / f"{n}.py") for n in sorted(files))
    (build / "CTestTestfile.cmake").write_text(
        f"set(FD_PYTEST_PYTHON [==[{sys.executable}]==])\n"
        f"set(FD_PYTEST_CMAKE [==[{Path(ctest_command()).with_name('cmake')}]==])\n"
        f"set(FD_PYTEST_FILES [==[{test_files}]==])\n"
        f"set(FD_PYTEST_DIR [==[{src}]==])\n"
        f"set(FD_PYTEST_WORKDIR [==[{src}]==])\n"
        f"set(FD_PYTEST_OUT [==[{build / 'pytest'}]==])\n"
        f"set(FD_PYTEST_REPORT [==[{REPO / 'tests/cmake/case_result.sh'}]==])\n"
        f"set(FD_PYTEST_INCLUDE [==[{build / 'CTestTestfile.cmake'}]==])\n"
        "set(FD_PYTEST_ENV [==[PYTHONDONTWRITEBYTECODE=1;FD_PYTEST_ALL_SKIPPED_EXIT=77]==])\n"
        f"include([==[{REPO / 'tests/cmake/pytest_cases.cmake'}]==])\n")
    return build


def ctest(build: Path, *args: str) -> tuple[int, dict[str, tuple[str, str]], str]:
    """ctest's exit status, {entry: (status, output)} from its JUnit report, and its console output."""
    junit = build / "junit.xml"
    junit.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FD_PYTEST_")}
    p = subprocess.run([ctest_command(), "--test-dir", str(build), "-j2", "--output-junit", str(junit), *args],
                       capture_output=True, text=True, env=env, timeout=300)
    out = {}
    for c in ET.parse(junit).getroot().iter("testcase"):
        sk = c.find("skipped")
        status = c.get("status")
        if status == "notrun" and sk is not None and (sk.get("message") or "").startswith("SKIP_"):
            status = "skipped"
        out[c.get("name")] = (status, c.findtext("system-out") or "")
    return p.returncode, out, p.stdout + p.stderr


def test_every_skipped_case_is_a_ctest_skip_with_its_reason(tmp_path):
    build = make_tree(tmp_path, {"test_mixed": MIXED, "test_none_ran": ALL_SKIPPED, "test_failing": FAILING})
    rc, got, console = ctest(build)
    assert {k: v[0] for k, v in got.items()} == {
        "pytest.test_mixed": "run",  # a case passed and none failed: the file's entry passes
        "pytest.test_mixed::test_pass": "run",
        "pytest.test_mixed::test_skip": "skipped",
        "pytest.test_mixed::test_marker": "skipped",
        "pytest.test_mixed::test_odd_ids[a,b]": "run",  # ';' would split a CMake list: ',' in the entry's name
        "pytest.test_mixed::test_odd_ids[c]=]d]": "run",
        "pytest.test_none_ran": "skipped",  # no case ran: the file's entry skips too
        "pytest.test_none_ran::test_one": "skipped",
        "pytest.test_failing": "fail",  # a case failed: its entry and its file's fail, the others stand
        "pytest.test_failing::test_ok": "run",
        "pytest.test_failing::test_bad": "fail",
    }, console
    assert rc != 0
    assert "SKIPPED: no widget here" in got["pytest.test_mixed::test_skip"][1]
    assert "SKIPPED: no tool here" in got["pytest.test_mixed::test_marker"][1]
    assert "SKIPPED: no device here" in got["pytest.test_none_ran::test_one"][1]
    assert "planted" in got["pytest.test_failing::test_bad"][1]
    # scripts/test.sh's list: every skip with its reason.
    listing = subprocess.run([sys.executable, str(REPO / "scripts/ctest_skips.py"), str(build / "junit.xml")],
                             capture_output=True, text=True, check=True).stdout
    assert "4 ctest entries skipped:" in listing
    assert "pytest.test_mixed::test_skip: no widget here" in listing
    assert "pytest.test_none_ran: no device here" in listing

    # A case selected without its file's entry has no result from this ctest: a failure that says so, not the old pass.
    rc, got, _ = ctest(build, "-R", "test_pass")
    assert rc != 0 and got["pytest.test_mixed::test_pass"][0] == "fail"
    assert "no result from this ctest invocation" in got["pytest.test_mixed::test_pass"][1]

    # A case added while the list kept looks newer than the file (a copy that moved timestamps): the file's run finds
    # a case without an entry and fails; the next ctest collects again and registers it.
    (tmp_path / "src" / "test_mixed.py").write_text(MIXED + "\ndef test_new():\n    assert 1\n")
    future = time.time() + 3600
    os.utime(build / "pytest" / "cases" / "cases.cmake", (future, future))
    rc, got, _ = ctest(build, "-R", "test_mixed")
    assert rc != 0 and got["pytest.test_mixed"][0] == "fail" and "pytest.test_mixed::test_new" not in got
    assert "collected but not registered with ctest: test_new" in got["pytest.test_mixed"][1]
    rc, got, console = ctest(build, "-R", "test_mixed")
    assert rc == 0 and got["pytest.test_mixed::test_new"][0] == "run", console


# ---- GoogleTest: an ISA this CPU lacks skips each of its grid cases (tests/unit/require_isa.h) ----

def unit_tests() -> str:
    exe = os.environ.get("FD_UNIT_TESTS")
    if exe and os.access(exe, os.X_OK):
        return exe
    reason = f"fd_unit_tests not found ({exe or 'FD_UNIT_TESTS unset'}): ctest sets it"
    if os.environ.get("FD_REQUIRE_BINARIES", "") not in ("", "0"):
        pytest.fail(reason + " [FD_REQUIRE_BINARIES=1]", pytrace=False)
    pytest.skip(reason)


ISAS = ("scalar", "avx2", "avx512", "avx512vnni")


def test_every_isa_dependent_grid_has_a_case_per_isa():
    out = subprocess.run([unit_tests(), "--gtest_list_tests"], capture_output=True, text=True, check=True,
                         timeout=60).stdout
    suites: dict[str, list[str]] = {}
    suite = None
    for line in out.splitlines():
        if not line.startswith(" "):
            suite = line.split()[0]
        elif suite:
            suites.setdefault(suite, []).append(line.split()[0])
    for grid in ("DecodeAttention/DecodeAttentionGrid.", "DecodeAttention/DecodeAttentionQ8Grid."):
        names = suites[grid]
        shapes = {isa: sorted(n.split("/")[1][len(isa) + 1:] for n in names if n.split("/")[1].startswith(isa + "_b"))
                  for isa in ISAS}
        assert len(names) == 4 * len(shapes["scalar"]) and len(shapes["scalar"]) >= 30, grid
        assert all(shapes[isa] == shapes["scalar"] for isa in ISAS), grid
    for suite, n in (("DecodeAttention/DecodeAttentionKnobs.", "PrefetchAndHeadsPerTaskKeepTheBits"),
                     ("DecodeAttention/DecodeAttentionSplit.", "LongSingleSequenceIsSplitAndMerged"),
                     ("Convert/ConvertIsa.", "EmptyAndTailsAreExact")):
        assert sorted(c for c in suites[suite] if c.startswith(n + "/")) == sorted(f"{n}/{isa}" for isa in ISAS), suite


def test_a_missing_isa_skips_its_cases_with_the_reason(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("FD_REQUIRE_ISA", "FD_TEST_HIDE_ISA")}
    cmd = [unit_tests(), "--gtest_filter=Convert/ConvertIsa.EmptyAndTailsAreExact/*"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                       env=dict(env, FD_TEST_HIDE_ISA="avx512", FD_CASE_RESULTS=str(tmp_path), FD_CASE_RUN_ID="r1"))
    assert p.returncode == 0, p.stdout
    assert "[  SKIPPED ] Convert/ConvertIsa.EmptyAndTailsAreExact/avx512 " in p.stdout
    assert "ISA avx512 hidden by FD_TEST_HIDE_ISA" in p.stdout
    assert "[       OK ] Convert/ConvertIsa.EmptyAndTailsAreExact/scalar " in p.stdout
    # What a batch's run leaves for its case entries (tests/unit/case_results.cpp; fd_gtest_suites' CASES).
    result = tmp_path / "Convert%ConvertIsa.EmptyAndTailsAreExact%avx512"
    assert result.read_text() == "r1 skipped\nISA avx512 hidden by FD_TEST_HIDE_ISA\n"
    assert (tmp_path / "Convert%ConvertIsa.EmptyAndTailsAreExact%scalar").read_text() == "r1 passed\n\n"
    report = subprocess.run(["/bin/sh", str(REPO / "tests/cmake/case_result.sh"), str(result), "r1", "batch"],
                            capture_output=True, text=True)
    assert report.returncode == 77 and "SKIPPED: ISA avx512 hidden by FD_TEST_HIDE_ISA" in report.stdout
    # FD_REQUIRE_ISA (the GPU machine's scripts) turns that skip into a failure.
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                       env=dict(env, FD_TEST_HIDE_ISA="avx512", FD_REQUIRE_ISA="avx512"))
    assert p.returncode != 0 and "but FD_REQUIRE_ISA lists it" in p.stdout
