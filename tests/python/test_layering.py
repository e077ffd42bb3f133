"""tests/layering/check_layering.py catches a violation of each rule: the rules hold on the tree, and a
copy of the tree with one planted violation fails with that rule's message."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "tests" / "layering" / "check_layering.py"
DIRS = ("fastdecode", "baselines", "extensions", "kernels", "harness", "tests", "analysis")


def run(root: Path):
    return subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True, timeout=120)


def test_rules_hold_on_the_tree():
    proc = run(REPO_ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all rules hold" in proc.stdout


@pytest.fixture
def tree(tmp_path):
    for d in DIRS:
        shutil.copytree(REPO_ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return tmp_path


def append(path: Path, text: str):
    path.write_text(path.read_text() + text)


def prepend(path: Path, text: str):
    path.write_text(text + path.read_text())


def plant(path: Path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


A = "arti" + "facts"
LINES = {p: len((REPO_ROOT / p).read_text().splitlines()) for p in ("tests/python/test_crossover.py", "tests/python/test_stage_reports.py")}


PLANTS = {
    "kernels include only fastdecode/core/":
        lambda t: prepend(t / "kernels/cpu/kv_quant.cpp", '#include "fastdecode/model/weights.h"\n'),
    "nothing under fastdecode/ includes the harness":
        lambda t: prepend(t / "fastdecode/rworker/server.cpp", '#include "harness/provenance.h"\n'),
    "nothing under baselines/ includes the harness":
        lambda t: prepend(t / "baselines/reference/reference_engine.cpp", '#include "harness/engines.h"\n'),
    "nothing under extensions/ includes the harness":
        lambda t: prepend(t / "extensions/hybrid/hybrid_config.cpp", '#include "harness/runner.h"\n'),
    "nothing under fastdecode/ includes an extension":
        lambda t: prepend(t / "fastdecode/sworker/srank.cpp", '#include "extensions/hybrid/hybrid_rank.h"\n'),
    "nothing under baselines/ includes an extension":
        lambda t: prepend(t / "baselines/gpu_only/gpu_only_engine.cpp", '#include "extensions/hybrid/hybrid_engine.h"\n'),
    "nothing under baselines/ links an extension":
        lambda t: append(t / "baselines/gpu_only/CMakeLists.txt", "target_link_libraries(baselines_gpu_only PUBLIC extensions_hybrid)\n"),
    "extensions/hybrid/ includes only its EXTENSION_DEPS (found baselines/paged_swap/scheduler.h)":
        lambda t: prepend(t / "extensions/hybrid/hybrid_rank.cpp", '#include "baselines/paged_swap/scheduler.h"\n'),
    "extensions/hybrid/ links only its EXTENSION_DEPS (found baselines_paged_swap)":
        lambda t: append(t / "extensions/hybrid/CMakeLists.txt", "target_link_libraries(extensions_hybrid PUBLIC baselines_paged_swap)\n"),
    "extensions/extra/ is not in EXTENSION_DEPS":
        lambda t: ((t / "extensions/extra").mkdir(), (t / "extensions/extra/extra.cpp").write_text('#include "fastdecode/core/error.h"\n')),
    "fastdecode/engine/ includes no implementation":
        lambda t: prepend(t / "fastdecode/engine/engine.cpp", '#include "fastdecode/spart/spart.h"\n'),
    "fastdecode/parallel/ includes only fastdecode/core/":
        lambda t: prepend(t / "fastdecode/parallel/comm.cpp", '#include "fastdecode/model/weights.h"\n'),
    "only harness/engines.cpp names the engines (make_fastdecode_engine used here)":
        lambda t: append(t / "harness/runner.cpp", "\n// auto e = make_fastdecode_engine(c, ctx);\n"),
    "only harness/engines.cpp includes an engine's header":
        lambda t: prepend(t / "harness/profile.cpp", '#include "baselines/gpu_only/gpu_only_engine.h"\n'),
    "is named fastdecode_sched":
        lambda t: (t / "fastdecode/sched/CMakeLists.txt").write_text(
            (t / "fastdecode/sched/CMakeLists.txt").read_text().replace("fastdecode_sched", "fd_scheduling")),
    "source fd_extra.cpp is not in harness/programs/":
        lambda t: append(t / "harness/programs/CMakeLists.txt", "fd_program(fd-extra)\n"),
    "no source file over 600 lines":
        lambda t: append(t / "fastdecode/core/error.cpp", "\n" * 700),
    "one definition of fd::StepPlan":
        lambda t: append(t / "baselines/paged_swap/scheduler.h", "\nnamespace fd {\nstruct StepPlan {\n  int x;\n};\n}  // namespace fd\n"),
    "median is defined once":
        lambda t: append(t / "harness/profile.cpp", "\nstatic double median(std::vector<double> v) { return v[0]; }\n"),
    # artifacts/ holds results, never code; a test names an artifacts/ path only as tests/ARTIFACT_READS.md declares it.
    # (The folder's name is put together here, A, so that this file names no artifacts/ path itself.)
    A + "/ holds results, never code (found " + A + "/paper/runs/run.sh)":
        lambda t: plant(t / A / "paper/runs/run.sh", "#!/usr/bin/env bash\nfd-bench run x.json\n"),
    A + "/ holds results, never code (found " + A + "/rworker/x/ablation.patch)":
        lambda t: plant(t / A / "rworker/x/ablation.patch", "--- a/x.cpp\n+++ b/x.cpp\n"),
    "tests/python/test_planted.py:3: names " + A + "/paper/runs, which tests/ARTIFACT_READS.md does not declare for it":
        lambda t: plant(t / "tests/python/test_planted.py", f'from pathlib import Path\nREPO = Path(".")\nRUNS = REPO / "{A}" / "paper" / "runs"\n'),
    "tests/python/test_crossover.py:" + str(LINES["tests/python/test_crossover.py"] + 2) + ": names " + A + "/baselines/run1-a40a146,":
        lambda t: append(t / "tests/python/test_crossover.py", f'\nOTHER = "{A}/baselines/run1-a40a146"\n'),
    "tests/python/test_stage_reports.py:" + str(LINES["tests/python/test_stage_reports.py"] + 2) + ": names " + A + "/hybrid/llama-2-7b/*,":
        lambda t: append(t / "tests/python/test_stage_reports.py", f'\nGRID = os.path.join(REPO, "{A}", "hybrid", "llama-2-7b", name)\n'),
    "tests/unit/test_planted.cpp:2: names " + A + "/sworker/gpu-machine/e2e,":
        lambda t: plant(t / "tests/unit/test_planted.cpp", f'// a comment may name {A}/paper/runs\nconst char* kRuns = "{A}/sworker/gpu-machine/e2e";\n'),
    "declares a read of " + A + "/paper/runs that tests/python/test_fd_sim.py does not make":
        lambda t: (t / "tests/ARTIFACT_READS.md").write_text((t / "tests/ARTIFACT_READS.md").read_text().replace(
            "|---|---|---|\n", f"|---|---|---|\n| `tests/python/test_fd_sim.py` | `{A}/paper/runs` | planted |\n", 1)),
}


def test_prose_naming_artifacts_is_no_read(tree):
    """A comment, a docstring or an assert message may name a result folder: only code that builds the path counts."""
    plant(tree / "tests/python/test_prose.py",
          f'"""Reads nothing from {A}/paper/runs."""\n# see {A}/baselines/README.md\n\n\ndef test_x():\n'
          f'    """{A}/hybrid/README.md says why."""\n    assert 1, "regenerate it ({A}/paper/README.md)"\n')
    plant(tree / "tests/unit/test_prose.cpp", f"// measured: {A}/sworker\n/* and {A}/stages */\nint x = 1;\n")
    proc = run(tree)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("rule", sorted(PLANTS))
def test_a_planted_violation_is_caught(tree, rule):
    PLANTS[rule](tree)
    proc = run(tree)
    assert proc.returncode == 1, proc.stdout
    assert rule in proc.stdout, proc.stdout
