"""README's "What was found" is CLAIMS.md's (analysis/readme_findings.py): the README quotes no finding that the
generated report does not hold, and a changed claim changes it."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def module():
    spec = importlib.util.spec_from_file_location("readme_findings", REPO / "analysis" / "readme_findings.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_the_readme_findings_are_claims_md(tmp_path):
    rf = module()
    assert rf.main(["--check"]) == 0, "README's findings are stale: run analysis/readme_findings.py"
    # A claim whose number changes in CLAIMS.md makes the README stale, and regenerating carries it over.
    claims, readme = tmp_path / "CLAIMS.md", tmp_path / "README.md"
    shutil.copy(REPO / "README.md", readme)
    text = (REPO / "CLAIMS.md").read_text(encoding="utf-8")
    row = next(l for l in text.splitlines() if l.startswith("| Fig. 11: SLS (fixed-interval) latency / all-at-once's peak"))
    here = row.split(" | ")[2]
    claims.write_text(text.replace(row, row.replace(here, "99 % (planted)")), encoding="utf-8")
    assert rf.main(["--check", "--claims", str(claims), "--readme", str(readme)]) == 1
    assert rf.main(["--claims", str(claims), "--readme", str(readme)]) == 0
    assert "| SLS step latency / all-at-once's peak | 66-70 % | 99 % (planted) | holds |" in readme.read_text(encoding="utf-8")


def test_every_command_the_readme_runs_is_executable():
    # The README runs scripts/*.sh, analysis/*.py and build programs as commands (`analysis/compare.py ...`): each
    # file it names at the start of a command must exist and be executable (compare.py once lost its mode, and the
    # tour's third command failed with "Permission denied").
    import os
    import re
    text = (REPO / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"(?m)^\s*((?:scripts|analysis)/[\w./-]+\.(?:sh|py))\b", text))
    named |= set(re.findall(r"`((?:scripts|analysis)/[\w./-]+\.(?:sh|py)) ", text))
    assert "analysis/compare.py" in named and "scripts/quickstart.sh" in named, named
    bad = sorted(p for p in named if not os.access(REPO / p, os.X_OK))
    assert not bad, f"named as commands in README.md but not executable: {bad}"
