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
}


@pytest.mark.parametrize("rule", sorted(PLANTS))
def test_a_planted_violation_is_caught(tree, rule):
    PLANTS[rule](tree)
    proc = run(tree)
    assert proc.returncode == 1, proc.stdout
    assert rule in proc.stdout, proc.stdout
