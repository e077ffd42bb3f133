"""ctest sees a pytest file whose every test skipped as Skipped (fd_skip_status.py: exit code
$FD_PYTEST_ALL_SKIPPED_EXIT, ctest's SKIP_RETURN_CODE 77), never as a silent pass; a file with a test run passes, and a
failure stays a failure."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

CASES = {
    "all_skipped": ("import pytest\n\ndef test_a():\n    pytest.skip('no device')\n\n"
                    "@pytest.mark.skipif(True, reason='no tool')\ndef test_b():\n    pass\n", 77),
    "one_ran": "import pytest\n\ndef test_a():\n    pytest.skip('no device')\n\ndef test_b():\n    assert 1\n",
    "one_failed": "import pytest\n\ndef test_a():\n    pytest.skip('x')\n\ndef test_b():\n    assert 0\n",
}


def run(tmp_path, name, body, env_code="77"):
    f = tmp_path / f"test_{name}.py"
    f.write_text(body)
    env = dict(os.environ, PYTHONPATH=str(HERE), PYTHONDONTWRITEBYTECODE="1")
    env.pop("FD_PYTEST_ALL_SKIPPED_EXIT", None)
    if env_code:
        env["FD_PYTEST_ALL_SKIPPED_EXIT"] = env_code
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "fd_skip_status",
                           "--rootdir", str(tmp_path), str(f)], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=120).returncode


@pytest.mark.parametrize("name,expected", [("all_skipped", 77), ("one_ran", 0), ("one_failed", 1)])
def test_exit_codes(tmp_path, name, expected):
    body = CASES[name][0] if isinstance(CASES[name], tuple) else CASES[name]
    assert run(tmp_path, name, body) == expected


def test_without_the_variable_nothing_changes(tmp_path):
    assert run(tmp_path, "plain", CASES["all_skipped"][0], env_code=None) == 0
