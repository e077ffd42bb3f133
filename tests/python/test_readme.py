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
