"""Shared pytest fixtures for the Python tests of FastDecode.

* ``fd_bin_dir`` / ``fd_bin``: where the C++ programs (fd-weights, fd-generate) are: $FD_BIN_DIR,
  else <repo>/build/default/bin.  When they are missing, tests that need them are skipped with
  the reason, unless FD_REQUIRE_BINARIES=1 (CI sets it), in which case they fail.
* ``run_program``: runs a command, returns its CompletedProcess, and fails the test showing the
  command, exit status, stdout and stderr when it exits non-zero or times out.
* ``workdir``: a fresh temporary directory for one test; ``session_dir``: one shared by the
  whole session (used to cache generated weights/outputs between tests).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
MODELS_DIR = REPO_ROOT / "experiments" / "models"
# Small inputs for tests of the analysis and the programs (tests/fixtures/README.md: where each came from, how trimmed).
FIXTURES = REPO_ROOT / "tests" / "fixtures"
PROGRAMS = ("fd-weights", "fd-generate", "fd-bench", "fd-transport-bench", "fd-sim", "fd-attn-bench")

# Make fd_numpy_ref importable whatever the rootdir / import mode.
sys.path.insert(0, str(Path(__file__).resolve().parent))

# A file whose every test skipped is "Skipped" in ctest, not "Passed" (fd_skip_status.py).
pytest_plugins = ["fd_skip_status"]


def _require_binaries() -> bool:
    return os.environ.get("FD_REQUIRE_BINARIES", "") not in ("", "0")


def _bin_dir() -> Path:
    env = os.environ.get("FD_BIN_DIR")
    return Path(env) if env else REPO_ROOT / "build" / "default" / "bin"


def load_analysis(name: str):
    """A fresh instance of analysis/<name>.py as a module (analysis/ on sys.path for its own imports)."""
    import importlib.util
    sys.path.insert(0, str(REPO_ROOT / "analysis"))
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "analysis" / f"{name}.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def models_dir() -> Path:
    return MODELS_DIR


@pytest.fixture(scope="session")
def fd_bin_dir() -> Path:
    """Directory holding fd-weights and fd-generate; skips (or fails, see module doc) if absent."""
    d = _bin_dir()
    missing = [p for p in PROGRAMS if not os.access(d / p, os.X_OK)]
    if missing:
        how = "$FD_BIN_DIR" if os.environ.get("FD_BIN_DIR") else "default build dir"
        reason = (f"C++ programs {', '.join(missing)} not found in {d} ({how}); build them "
                  f"(cmake --preset default && cmake --build build/default) or set FD_BIN_DIR")
        if _require_binaries():
            pytest.fail(reason + " [FD_REQUIRE_BINARIES=1]", pytrace=False)
        pytest.skip(reason)
    return d


@pytest.fixture(scope="session")
def fd_bin(fd_bin_dir):
    """fd_bin('fd-weights') -> absolute path string of that program."""
    return lambda name: str(fd_bin_dir / name)


def run_checked(args, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    """Runs `args`; on non-zero exit or timeout fails the current test with the full output."""
    args = [str(a) for a in args]
    cmd = shlex.join(args)
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"timed out after {timeout}s: {cmd}\n--- stdout ---\n{e.stdout}\n"
                    f"--- stderr ---\n{e.stderr}", pytrace=False)
    except OSError as e:
        pytest.fail(f"could not run {cmd}: {e}", pytrace=False)
    if proc.returncode != 0:
        pytest.fail(f"exit status {proc.returncode}: {cmd}\n--- stdout ---\n{proc.stdout}\n"
                    f"--- stderr ---\n{proc.stderr}", pytrace=False)
    return proc


@pytest.fixture(scope="session")
def run_program():
    """run_program([prog, arg, ...], timeout=600) -> CompletedProcess (fails the test on error)."""
    return run_checked


@pytest.fixture
def workdir(tmp_path) -> Path:
    return tmp_path


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fd_session")


# ----------------------------------------------------------------------------------------------
# measured numbers (max errors etc.), printed at the end of the run even with -q
# ----------------------------------------------------------------------------------------------

_MEASUREMENTS = pytest.StashKey[list]()


@pytest.fixture
def record_measurement(request):
    """record_measurement('text') -> printed in a 'FastDecode measurements' section at the end."""
    store = request.config.stash.setdefault(_MEASUREMENTS, [])

    def record(text: str) -> None:
        store.append(f"{request.node.name}: {text}")

    return record


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    lines = config.stash.get(_MEASUREMENTS, [])
    if lines:
        terminalreporter.section("FastDecode measurements")
        for line in lines:
            terminalreporter.write_line(line)
