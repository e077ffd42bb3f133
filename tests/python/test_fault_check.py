"""scripts/fault-check.sh's bookkeeping: the ctest log parser (scripts/fault_check_log.py) on the endings ctest
writes (all passed with some skipped, failures of every kind, labels after the status), and the planted-fault lists
(CMakeLists.txt FD_FAULTS / FD_GPU_FAULTS, fastdecode/core/fault.h) agreeing with the code: every listed fault is
planted behind its #ifdef outside the tests, in a file that includes its generated header, and every
#ifdef FD_FAULT_ names a listed fault."""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from fault_check_log import parse  # noqa: E402

ALL_PASSED_SOME_SKIPPED = """\
56/56 Test #275: Models/GpuEngines.CudaGraphsSameTokensAsEager/"tiny-llama-gqa" ....   Passed    2.23 sec

100% tests passed out of 56

Label Time Summary:
gpu    = 132.37 sec*proc (56 tests)

Total Test time (real) = 132.41 sec

The following tests did not run:
\t220 - SmLimitedNoDevice.ThrowsClearly (Skipped)
\t221 - pytest.test_network_emulation (Skipped)
"""

SOME_FAILED = """\
96% tests passed, 4 tests failed out of 391

Label Time Summary:
unit    = 100.00 sec*proc (300 tests)

Total Test time (real) = 548.00 sec

The following tests did not run:
\t 12 - GpuOnly.Something (Skipped)

The following tests FAILED:
\t 40 - Placement.GoesWhereTheFutureLoadsItSharesAreSmallest (Failed)
\t 41 - Models/FastDecodeVsReference.SameGreedyTokens/"tiny-llama" (Failed)   unit
\t 77 - fd_engine_tests: GpuOnlyAsyncChain.*:EngineContract.* (SEGFAULT)
\t301 - pytest.test_load_control (Timeout)
\t302 - RWorkerService.FuzzHundredThousandMutatedMessages (Subprocess aborted)
Errors while running CTest
"""


def test_all_passed_with_skips_counts_every_test():
    r = parse(ALL_PASSED_SOME_SKIPPED)
    assert r["tests"] == 56
    assert r["failed_tests"] == []
    assert r["skipped_tests"] == ["SmLimitedNoDevice.ThrowsClearly", "pytest.test_network_emulation"]


def test_every_kind_of_failure_is_a_failure():
    r = parse(SOME_FAILED)
    assert r["tests"] == 391
    assert r["failed_tests"] == [
        "Placement.GoesWhereTheFutureLoadsItSharesAreSmallest",
        'Models/FastDecodeVsReference.SameGreedyTokens/"tiny-llama"',
        "fd_engine_tests: GpuOnlyAsyncChain.*:EngineContract.*",
        "pytest.test_load_control",
        "RWorkerService.FuzzHundredThousandMutatedMessages",
    ]
    assert r["failed_status"] == ["Failed", "Failed", "SEGFAULT", "Timeout", "Subprocess aborted"]
    assert r["skipped_tests"] == ["GpuOnly.Something"]


def test_a_log_without_a_summary_has_no_tests():
    assert parse("ctest: no tests were found\n")["tests"] == 0


def cmake_list(name):
    m = re.search(r"^set\(%s (.*)\)$" % name, (ROOT / "CMakeLists.txt").read_text(), re.M)
    assert m, "%s must be set on one line (scripts/fault-check.sh reads it so)" % name
    return m.group(1).split()


def test_fault_lists_agree_with_the_code():
    faults, gpu = cmake_list("FD_FAULTS"), cmake_list("FD_GPU_FAULTS")
    assert len(set(faults)) == len(faults)
    assert set(gpu) <= set(faults)
    header = (ROOT / "fastdecode/core/fault.h").read_text()
    planted = {}
    for folder in ("fastdecode", "kernels", "baselines", "extensions", "harness"):
        for p in (ROOT / folder).rglob("*"):
            if p.suffix in (".h", ".cpp", ".cu", ".cuh"):
                for name in re.findall(r"#ifdef FD_FAULT_([A-Z0-9_]+)", p.read_text(errors="replace")):
                    planted.setdefault(name.lower(), []).append(p)
    for f in faults:
        assert re.search(r"^//\s+%s\s" % re.escape(f), header, re.M), "%s is not described in fault.h" % f
        assert f in planted, "%s is listed in FD_FAULTS but no #ifdef FD_FAULT_%s plants it" % (f, f.upper())
        for p in planted[f]:
            assert '#include "fd_fault_%s.h"' % f in p.read_text(), "%s holds %s without its header" % (p, f)
    assert set(planted) <= set(faults), "planted but not in FD_FAULTS: %s" % sorted(set(planted) - set(faults))
