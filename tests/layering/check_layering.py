#!/usr/bin/env python3
"""The layering rules of docs/ARCHITECTURE.md, checked from the sources and CMake files.

    tests/layering/check_layering.py [REPO_ROOT]

Prints every violation (file:line: rule) and exits 1 if there is one, 0 otherwise. The rules:

  kernels       kernels/ includes only fastdecode/core/ (and kernels/ itself)
  harness       nothing under fastdecode/, baselines/, extensions/ or kernels/ includes harness/
  extensions    extensions/ holds the engines beyond the paper, between the paper's code and the harness: each
                folder under it includes (and links) only the folders EXTENSION_DEPS lists for it, and nothing
                under fastdecode/, baselines/ or kernels/ includes or links extensions/
  engine        fastdecode/engine/ includes no implementation (only fastdecode/core/, fastdecode/model/)
  parallel      fastdecode/parallel/ (the communicators) includes only fastdecode/core/ (and itself)
  engines       only harness/engines.cpp names the engines: a make_X_engine factory is used outside its
                own folder only there, and no other harness file includes an engine's header
  targets       every library a CMakeLists.txt under fastdecode/, baselines/, extensions/, kernels/, harness/ defines
                is named after its folder (fastdecode/core -> fastdecode_core, harness -> harness), and
                every program's source lives in the folder that defines it
  size          no source file over 600 lines
  stats         median / percentile are defined once, in fastdecode/core/stats.*
  odr           no two files define a class or struct of the same name in the same named namespace (one
                program links every engine: two layouts under one name is an ODR violation, and the linker
                keeps one type's inline members for both; a paged-swap StepPlan beside the S-worker's crashed
                fd-bench). Types in an anonymous namespace, and nested ones, are each file's own.
  artifacts     artifacts/ holds results with provenance, never code: no file there with a source extension
                (ARTIFACT_SOURCE_EXT; a command that produced a result is a "Command" section of its README)
  artifact-reads  a file under tests/ names an artifacts/ path in code only where tests/ARTIFACT_READS.md declares
                that read for that file (a test regenerates a committed report, or checks what the committed
                results say); analysis logic is tested on fixtures under tests/fixtures/ or synthetic data. Comments,
                docstrings and assert messages are prose, not reads. A declared read its file no longer makes is an
                error too, so the list stays the list of what is read.

ctest runs it (test `layering`); tests/python/test_layering.py plants a violation of each rule in a copy
of the tree and checks that this script catches it.
"""
from __future__ import annotations

import ast
import fnmatch
import re
import sys
from pathlib import Path

SRC_EXT = {".cpp", ".h", ".cu", ".cuh"}
LIB_DIRS = ("fastdecode", "baselines", "extensions", "kernels", "harness")
# The folders each engine beyond the paper (extensions/<name>/) builds on, as include prefixes; the CMake libraries
# it may link are the same folders' (fastdecode/sworker/ -> fastdecode_sworker). A new extension adds its line.
EXTENSION_DEPS = {
    # the hybrid: the GPU-only rank and engine it extends, the FastDecode engine's R-worker config and spawning, the
    # wire to the R-workers, its placement controller (fastdecode/sched/hybrid.h), the CUDA kernels it calls
    "extensions/hybrid": ("fastdecode/core/", "fastdecode/engine/", "fastdecode/sched/", "fastdecode/sworker/",
                          "fastdecode/wire/", "kernels/cuda/", "baselines/gpu_only/"),
}
PROJECT_LIB = re.compile(r"\b((?:fastdecode|baselines|extensions|kernels)_\w+|harness)\b")
MAX_LINES = 600
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
ARTIFACT_SOURCE_EXT = {".sh", ".py", ".cu", ".cuh", ".cpp", ".cc", ".c", ".h", ".hpp", ".patch"}
ARTIFACT_READS = "tests/ARTIFACT_READS.md"
ART_PATH = re.compile(r"(?<![\w.\-/])artifacts(?:/[\w.\-*]+)*")


def sources(root: Path, top: str):
    base = root / top
    if not base.is_dir():
        return []
    return sorted(p for p in base.rglob("*") if p.suffix in SRC_EXT and p.is_file())


def includes(path: Path):
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        m = INCLUDE.match(line)
        if m:
            yield n, m.group(1)


def check(root: Path) -> list[str]:
    bad: list[str] = []
    rel = lambda p: p.relative_to(root).as_posix()  # noqa: E731

    # kernels: only core (and themselves)
    for p in sources(root, "kernels"):
        for n, inc in includes(p):
            if "/" in inc and not inc.startswith(("fastdecode/core/", "kernels/")):
                bad.append(f"{rel(p)}:{n}: kernels include only fastdecode/core/ (found {inc})")
    # harness: never included from below
    for top in ("fastdecode", "baselines", "extensions", "kernels"):
        for p in sources(root, top):
            for n, inc in includes(p):
                if inc.startswith("harness/"):
                    bad.append(f"{rel(p)}:{n}: nothing under {top}/ includes the harness (found {inc})")
    # extensions: above the paper's code (nothing there includes or links them), each on its declared folders only
    for top in ("fastdecode", "baselines", "kernels"):
        for p in sources(root, top):
            for n, inc in includes(p):
                if inc.startswith("extensions/"):
                    bad.append(f"{rel(p)}:{n}: nothing under {top}/ includes an extension (found {inc})")
        base = root / top
        for cm in sorted(base.rglob("CMakeLists.txt")) if base.is_dir() else []:
            for n, line in enumerate(cm.read_text(errors="replace").splitlines(), 1):
                if not line.lstrip().startswith("#") and re.search(r"\bextensions_\w+", line):
                    bad.append(f"{rel(cm)}:{n}: nothing under {top}/ links an extension ({line.strip()})")
    for p in sources(root, "extensions"):
        parts = rel(p).split("/")
        folder = "/".join(parts[:2]) if len(parts) > 2 else "extensions"
        allowed = EXTENSION_DEPS.get(folder)
        if allowed is None:
            bad.append(f"{rel(p)}:1: {folder}/ is not in EXTENSION_DEPS: an extension declares the folders it builds on")
            continue
        for n, inc in includes(p):
            if "/" in inc and not inc.startswith(allowed + (folder + "/",)):
                bad.append(f"{rel(p)}:{n}: {folder}/ includes only its EXTENSION_DEPS (found {inc})")
    for folder, allowed in EXTENSION_DEPS.items():
        cm = root / folder / "CMakeLists.txt"
        if not cm.is_file():
            continue
        libs = {a.rstrip("/").replace("/", "_") for a in allowed} | {folder.replace("/", "_")}
        text = cm.read_text(errors="replace")
        for m in re.finditer(r"target_link_libraries\(([^)]*)\)", text):
            n = text.count("\n", 0, m.start()) + 1
            for lib in PROJECT_LIB.findall(m.group(1)):
                if lib not in libs:
                    bad.append(f"{rel(cm)}:{n}: {folder}/ links only its EXTENSION_DEPS (found {lib})")
    # engine: the interface only
    for p in sources(root, "fastdecode/engine"):
        for n, inc in includes(p):
            if "/" in inc and not inc.startswith(("fastdecode/core/", "fastdecode/model/", "fastdecode/engine/")):
                bad.append(f"{rel(p)}:{n}: fastdecode/engine/ includes no implementation (found {inc})")

    # parallel: the communicators stand on core alone, so every S-Part and engine may use them
    for p in sources(root, "fastdecode/parallel"):
        for n, inc in includes(p):
            if "/" in inc and not inc.startswith(("fastdecode/core/", "fastdecode/parallel/")):
                bad.append(f"{rel(p)}:{n}: fastdecode/parallel/ includes only fastdecode/core/ (found {inc})")

    # engines: factories and engine headers named only in harness/engines.cpp
    factory_def = re.compile(r"std::unique_ptr<Engine>\s+(make_\w+_engine)\s*\(")
    factories: dict[str, str] = {}  # name -> folder of its declaration
    engine_headers: set[str] = set()
    for top in LIB_DIRS:
        for p in sources(root, top):
            if p.suffix != ".h":
                continue
            for name in factory_def.findall(p.read_text(errors="replace")):
                factories[name] = p.parent.relative_to(root).as_posix()
                engine_headers.add(rel(p))
    registry = "harness/engines.cpp"
    for top in LIB_DIRS:
        for p in sources(root, top):
            r = rel(p)
            if r == registry:
                continue
            text = p.read_text(errors="replace")
            for name, folder in factories.items():
                if r.startswith(folder + "/"):
                    continue
                for n, line in enumerate(text.splitlines(), 1):
                    if re.search(r"\b" + name + r"\b", line):
                        bad.append(f"{r}:{n}: only {registry} names the engines ({name} used here)")
            if r.startswith("harness/"):
                for n, inc in includes(p):
                    if inc in engine_headers:
                        bad.append(f"{r}:{n}: only {registry} includes an engine's header (found {inc})")

    # targets: libraries named after their folder, programs' sources in their folder
    lib_def = re.compile(r"add_library\(\s*([\w-]+)\s+(STATIC|SHARED|OBJECT|INTERFACE)?")
    exe_def = re.compile(r"add_executable\(\s*([\w-]+)\s+([^\s)]+)")
    prog_def = re.compile(r"fd_program\(\s*([\w-]+)")
    for top in LIB_DIRS:
        base = root / top
        if not base.is_dir():
            continue
        for cm in sorted(base.rglob("CMakeLists.txt")):
            folder = cm.parent.relative_to(root).as_posix()
            expect = folder.replace("/", "_")
            text = cm.read_text(errors="replace")
            for n, line in enumerate(text.splitlines(), 1):
                if line.lstrip().startswith("#"):
                    continue
                for m in lib_def.finditer(line):
                    if m.group(1) != expect:
                        bad.append(f"{rel(cm)}:{n}: a library defined in {folder}/ is named {expect} (found {m.group(1)})")
                for m in exe_def.finditer(line):
                    src = m.group(2)
                    if "${" not in src and not (cm.parent / src).is_file():
                        bad.append(f"{rel(cm)}:{n}: program {m.group(1)}'s source {src} is not in {folder}/")
                for m in prog_def.finditer(line):
                    if "function(" in line:
                        continue
                    src = m.group(1).replace("-", "_") + ".cpp"
                    if not (cm.parent / src).is_file():
                        bad.append(f"{rel(cm)}:{n}: program {m.group(1)}'s source {src} is not in {folder}/")

    # size
    for top in LIB_DIRS + ("tests", "analysis"):
        base = root / top
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            if p.is_file() and (p.suffix in SRC_EXT or p.suffix == ".py"):
                n = sum(1 for _ in p.open(errors="replace"))
                if n > MAX_LINES:
                    bad.append(f"{rel(p)}:{n}: no source file over {MAX_LINES} lines ({n})")

    # stats: one median / percentile
    stats_def = re.compile(r"^\s*(?:static\s+|inline\s+)?double\s+(median|percentile)\s*\(")
    for top in LIB_DIRS + ("tests",):
        for p in sources(root, top):
            if rel(p).startswith("fastdecode/core/stats."):
                continue
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
                m = stats_def.match(line)
                if m:
                    bad.append(f"{rel(p)}:{n}: {m.group(1)} is defined once, in fastdecode/core/stats.h")
    # odr: a namespace-scope type is defined in one file only
    ns_open = re.compile(r"^namespace\s*([\w:]*)\s*\{")
    ns_close = re.compile(r"^\}\s*//\s*namespace")
    type_def = re.compile(r"^(?:template\s*<[^>]*>\s*)?(?:struct|class)\s+(?:\[\[\w+\]\]\s+)?(\w+)\s*(?:final\s*)?(?:\{|:(?!:))")
    defined: dict[tuple[str, str], str] = {}
    for top in LIB_DIRS:
        for p in sources(root, top):
            stack: list[str] = []
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
                m = ns_open.match(line)
                if m:
                    stack.append(m.group(1))
                    continue
                if ns_close.match(line):
                    if stack:
                        stack.pop()
                    continue
                m = type_def.match(line)
                if not m or "" in stack:
                    continue
                key = ("::".join(stack), m.group(1))
                where = f"{rel(p)}:{n}"
                first = defined.setdefault(key, where)
                if first.split(":")[0] != rel(p):
                    bad.append(f"{where}: one definition of {key[0]}::{key[1]} (also defined at {first})")
    # artifacts: results, never code; tests read them only as declared
    bad += check_artifacts(root, rel)
    return bad


def _py_artifact_paths(text: str):
    """(line, artifacts/... path) for each path a Python file builds in code: a string, an f-string ({...} read as *),
    a `/` chain or an os.path.join(...) whose first string component is artifacts. Docstrings and assert messages
    are prose."""
    tree = ast.parse(text)
    prose: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            prose.update(id(n) for n in ast.walk(body[0]))
        if isinstance(node, ast.Assert) and node.msg is not None:
            prose.update(id(n) for n in ast.walk(node.msg))

    def text_of(n):
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            return n.value
        if isinstance(n, ast.JoinedStr):
            return "".join(v.value if isinstance(v, ast.Constant) else "*" for v in n.values)
        return None

    def chain(n):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div):
            return chain(n.left) + [n.right]
        return [n]
    inner = {id(n.left) for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div)}
    done: set[int] = set()
    for node in ast.walk(tree):
        parts = None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and id(node) not in inner:
            parts = chain(node)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join" and \
                isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "path":
            parts = node.args
        if not parts or id(node) in prose:
            continue
        texts = [text_of(p) for p in parts]
        for i, s in enumerate(texts):
            if s is not None and (s == "artifacts" or s.startswith("artifacts/")):
                if all(x is None for x in texts[:i]):  # rooted at a variable (the repository), not inside a string path
                    done.update(id(m) for p in parts for m in ast.walk(p))
                    yield node.lineno, "/".join(x if x is not None else "*" for x in texts[i:]).rstrip("/")
                break
    for node in ast.walk(tree):
        if id(node) in prose or id(node) in done:
            continue
        if isinstance(node, ast.JoinedStr):
            done.update(id(v) for v in ast.walk(node))
        s = text_of(node)
        if s is not None:
            for m in ART_PATH.finditer(s):
                yield node.lineno, m.group(0).rstrip("/")


def _other_artifact_paths(path: Path, text: str):
    """(line, path) for C/C++/CUDA (comments out, string literals in), shell and CMake files (# comments out)."""
    if path.suffix in {".cpp", ".cc", ".c", ".h", ".hpp", ".cu", ".cuh"}:
        text = re.sub(r'("(?:\\.|[^"\\\n])*")|//[^\n]*|/\*.*?\*/',
                      lambda m: m.group(1) or "\n" * m.group(0).count("\n"), text, flags=re.S)
    else:
        text = re.sub(r"(^|\s)#[^\n]*", r"\1", text)
    for m in ART_PATH.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, m.group(0).rstrip("/")


def declared_reads(root: Path):
    """[(line, test file, artifacts path or glob)] of ARTIFACT_READS's table under '## Reads a test names'."""
    f = root / ARTIFACT_READS
    rows, on = [], False
    for n, line in enumerate(f.read_text().splitlines() if f.is_file() else [], 1):
        if line.startswith("## "):
            on = line.startswith("## Reads a test names")
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if on and line.startswith("|") and len(cells) >= 3 and cells[0].startswith("tests/"):
            rows.append((n, cells[0], cells[1]))
    return rows


def covers(declared: str, named: str) -> bool:
    return named == declared or named.startswith(declared + "/") or fnmatch.fnmatchcase(named, declared) or \
        fnmatch.fnmatchcase(named, declared + "/*")


def check_artifacts(root: Path, rel) -> list[str]:
    bad: list[str] = []
    art = root / "artifacts"
    for p in sorted(art.rglob("*")) if art.is_dir() else []:
        if p.is_file() and p.suffix in ARTIFACT_SOURCE_EXT:
            bad.append(f"{rel(p)}:1: artifacts/ holds results, never code (found {rel(p)})")
    named: dict[str, list[tuple[int, str]]] = {}
    code = {".py", ".sh", ".cmake"} | {".cpp", ".cc", ".c", ".h", ".hpp", ".cu", ".cuh"}
    for p in sorted((root / "tests").rglob("*")):
        if not p.is_file() or not (p.suffix in code or p.name == "CMakeLists.txt") or "__pycache__" in p.parts:
            continue
        if rel(p) == "tests/layering/check_layering.py":  # this rule's own source names the folder to find it
            continue
        text = p.read_text(errors="replace")
        try:
            found = list(_py_artifact_paths(text) if p.suffix == ".py" else _other_artifact_paths(p, text))
        except SyntaxError as e:
            bad.append(f"{rel(p)}:{e.lineno}: cannot parse it to find the artifacts/ paths it names ({e.msg})")
            continue
        named[rel(p)] = found
    rows = declared_reads(root)
    for f, found in named.items():
        for n, path in sorted(set(found)):
            if not any(t == f and covers(d, path) for _, t, d in rows):
                bad.append(f"{f}:{n}: names {path}, which {ARTIFACT_READS} does not declare for it: test the analysis on a "
                           f"fixture under tests/fixtures/ (or regenerate what it checks), or declare the read and why")
    for n, t, d in rows:
        if not any(covers(d, path) for _, path in named.get(t, [])):
            bad.append(f"{ARTIFACT_READS}:{n}: declares a read of {d} that {t} does not make: drop the row")
    return bad


def main() -> int:
    root = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]
    bad = check(root)
    for b in bad:
        print(b)
    print(f"layering: {len(bad)} violation(s)" if bad else "layering: all rules hold")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
