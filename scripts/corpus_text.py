#!/usr/bin/env python3
"""Plain English text from Debian documentation packages: the text half of scripts/make-corpus.sh (issue 44).

    corpus_text.py build --root EXTRACTED --packages PACKAGES.tsv --out DIR [--heldout-permille 25]
                         [--max-train-chars N] [--min-heldout-chars N] [--jobs N] [--command TEXT]
    corpus_text.py clean {rst,pod,man,html,text} FILE      (prints one file's cleaned text: a debugging aid)

build reads EXTRACTED/<package>/ (each .deb unpacked with dpkg-deb -x) for every package of PACKAGES.tsv (tab
separated: name, version, .deb file name, .deb sha256), picks the files of SOURCES below, turns each into plain
paragraphs, and writes DIR/train.txt, DIR/heldout.txt and DIR/MANIFEST.json.

Documents and what is kept:
  * perl-doc: the core .pod files (POD markup stripped; verbatim paragraphs, i.e. code, dropped) and the module
    man pages in man3 (rendered as the man pages below); perltoc / perluniprops (tables of contents and
    Unicode tables) and perlcn / perljp / perlko / perltw (not English) are left out, and man1 too (the same
    text as the .pod files).
  * python3.11-doc: the Sphinx sources of the HTML docs (html/_sources/**.rst.txt) but the changelog.
  * linux-doc-6.1: Documentation/**.rst (translations/ left out: not English).
  * postgresql-doc-15: the HTML manual (navigation, tables, program listings and synopses left out).
  * manpages, manpages-dev: every man page that is a file and not a `.so` redirect, rendered by
    `groff -k -t -Tutf8 -mandoc` (no hyphenation, one line per paragraph) and `col -bx`; SYNOPSIS, EXAMPLES,
    SEE ALSO, ATTRIBUTES, COLOPHON, AUTHORS and the like are left out (code or boilerplate).
  The markup is stripped by scripts/corpus_markup.py. rST: headings kept as paragraphs, roles and inline markup
  reduced to their text, comments, targets, substitutions, tables, doctests, literal blocks (after `::`) and
  code-like directives dropped, the body of prose directives (note, function, class, versionadded, ...) kept.
  Every paragraph is one line, whitespace collapsed, typographic hyphens and quotes made ASCII; a paragraph is
  dropped when less than 80 % of its characters are Latin letters or spaces (code, tables, paths, other
  scripts); a document is dropped when under 200 characters are left, when under 30 % of its text survived
  that filter (code-heavy), or when it repeats an earlier one.

File layout: documents in (package, path) order, each its paragraphs joined by a blank line; consecutive
documents are separated by a line holding one form feed (U+000C), i.e. file = "\\n\\f\\n".join(docs) + "\\n".
Read it back with read_documents().

Split, by document: a document is held out when int(sha256("<package>:<path in the package>")[:16], 16) % 1000
< --heldout-permille (the path as the .deb holds it, so the split does not move with the package version).
--max-train-chars caps train.txt: train documents are taken in the order of that same hash, and one that would
pass the cap is left out (split "dropped:cap"). The output is a pure function of the unpacked files (and, for
man pages, of groff's version, and of Python's Unicode tables: both recorded): the same .debs give
byte-identical train.txt and heldout.txt.
"""
from __future__ import annotations

import os
import sys

# scripts/ holds tokenize.py: keep this file's folder off sys.path, or the standard library's `tokenize` (imported by
# linecache, inspect, torch, transformers ...) would resolve to it.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse  # noqa: E402
import datetime  # noqa: E402
import gzip  # noqa: E402
import hashlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

DOC_SEP = "\n\f\n"


def _load_markup():
    """scripts/corpus_markup.py, by its path (this folder is off sys.path, above)."""
    spec = importlib.util.spec_from_file_location("corpus_markup", os.path.join(_HERE, "corpus_markup.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


markup = _load_markup()
CorpusError, extract = markup.CorpusError, markup.extract


# ------------------------------------------------------------------------------------------------------------
# sources, split, build

SOURCES = {
    "perl-doc": [(r"^usr/share/perl/[^/]+/pod/(?!perltoc\.pod$|perluniprops\.pod$|perl(cn|jp|ko|tw)\.pod$)"
                  r"[^/]+\.pod$", "pod"),
                 (r"^usr/share/man/man3/[^/]+\.3perl\.gz$", "man")],
    "python3.11-doc": [(r"^usr/share/doc/python3\.11/html/_sources/(?!whatsnew/changelog\.rst\.txt$).+\.rst\.txt$",
                        "rst")],
    "linux-doc-6.1": [(r"^usr/share/doc/linux-doc-6\.1/Documentation/(?!translations/).+\.rst\.gz$", "rst")],
    "postgresql-doc-15": [(r"^usr/share/doc/postgresql-doc-15/html/[^/]+\.html$", "html")],
    "manpages": [(r"^usr/share/man/man\d/[^/]+\.gz$", "man")],
    "manpages-dev": [(r"^usr/share/man/man\d/[^/]+\.gz$", "man")],
}


def doc_hash(package: str, path: str) -> int:
    return int(hashlib.sha256(f"{package}:{path}".encode()).hexdigest()[:16], 16)


def split_of(package: str, path: str, heldout_permille: int) -> str:
    return "heldout" if doc_hash(package, path) % 1000 < heldout_permille else "train"


def select_files(root: str, package: str, patterns) -> list[tuple[str, str]]:
    """[(path inside the package, kind)] of the regular files (not symlinks) matching a pattern, sorted."""
    base = os.path.join(root, package)
    if not os.path.isdir(base):
        raise CorpusError(f"{base}: not a folder (the unpacked {package} .deb)")
    out = []
    for d, dirs, files in os.walk(base):
        dirs.sort()
        for f in files:
            full = os.path.join(d, f)
            rel = os.path.relpath(full, base).replace(os.sep, "/")
            if os.path.islink(full):
                continue
            for pat, kind in patterns:
                if re.match(pat, rel):
                    out.append((rel, kind))
                    break
    return sorted(out)


def read_packages(path: str) -> list[dict]:
    pkgs = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            cols = line.rstrip("\n").split("\t")
            if len(cols) != 4:
                raise CorpusError(f"{path}:{n}: want 4 tab-separated columns (name, version, deb, sha256)")
            pkgs.append(dict(zip(("name", "version", "deb", "deb_sha256"), cols)))
    if not pkgs:
        raise CorpusError(f"{path}: no packages")
    return pkgs


def read_documents(path: str) -> list[str]:
    """The documents of a train.txt / heldout.txt."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    text = text[:-1] if text.endswith("\n") else text
    return [d for d in text.split(DOC_SEP) if d] if text else []


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build(root, packages_tsv, out, heldout_permille=25, max_train_chars=100_000_000, min_heldout_chars=300_000,
          jobs=None, command="", sources=None, log=print) -> dict:
    sources = SOURCES if sources is None else sources
    if not 0 < heldout_permille < 1000:
        raise CorpusError("--heldout-permille must be in 1..999")
    pkgs = read_packages(packages_tsv)
    work = []  # (package, path, kind, full path)
    for p in pkgs:
        if p["name"] not in sources:
            raise CorpusError(f"{packages_tsv}: no text source rules for package {p['name']!r} "
                              f"(known: {', '.join(sorted(sources))})")
        files = select_files(root, p["name"], sources[p["name"]])
        if not files:
            raise CorpusError(f"{root}/{p['name']}: no file matches the source rules of {p['name']}")
        p["files_matched"] = len(files)
        work += [(p["name"], rel, kind, os.path.join(root, p["name"], rel)) for rel, kind in files]

    def one(item):
        pkg, rel, kind, full = item
        with open(full, "rb") as f:
            raw = f.read()
        sha = hashlib.sha256(raw).hexdigest()
        if full.endswith(".gz"):
            raw = gzip.decompress(raw)
        text, why = extract(raw, kind)
        return sha, text, why

    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as ex:
        results = list(ex.map(one, work))  # map keeps the input order: the output does not depend on jobs

    files, seen = [], set()
    docs = {"train": [], "heldout": []}
    for (pkg, rel, kind, _), (sha, text, why) in zip(work, results):
        rec = {"package": pkg, "path": rel, "kind": kind, "sha256": sha, "chars": len(text)}
        if why is None:
            th = hashlib.sha256(text.encode()).digest()
            if th in seen:
                why = "dropped:duplicate"
            seen.add(th)
        rec["split"] = why or split_of(pkg, rel, heldout_permille)
        if why:
            rec["chars"] = 0
        else:
            docs[rec["split"]].append((rec, text))
        files.append(rec)

    total = 0
    for rec, text in sorted(docs["train"], key=lambda rt: (doc_hash(rt[0]["package"], rt[0]["path"]), rt[0]["path"])):
        if total + len(text) > max_train_chars:
            rec["split"], rec["chars"] = "dropped:cap", 0
        else:
            total += len(text)
    train = [t for r, t in docs["train"] if r["split"] == "train"]
    held = [t for r, t in docs["heldout"]]
    held_chars = sum(len(t) for t in held)
    if held_chars < min_heldout_chars:
        raise CorpusError(f"only {held_chars} held-out characters (< --min-heldout-chars {min_heldout_chars}): "
                          "raise --heldout-permille")
    os.makedirs(out, exist_ok=True)
    paths = {}
    for split, ds in (("train", train), ("heldout", held)):
        paths[split] = os.path.join(out, f"{split}.txt")
        with open(paths[split], "w", encoding="utf-8", newline="\n") as f:
            f.write(DOC_SEP.join(ds) + "\n")
    by_split = {}
    for r in files:
        by_split[r["split"]] = by_split.get(r["split"], 0) + 1
    for p in pkgs:
        mine = [r for r in files if r["package"] == p["name"]]
        p["documents"] = {s: sum(1 for r in mine if r["split"] == s) for s in ("train", "heldout")}
        p["chars"] = {s: sum(r["chars"] for r in mine if r["split"] == s) for s in ("train", "heldout")}
    manifest = {
        "what": "FastDecode issue 44 training corpus: plain English from Debian documentation packages",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command,
        "recipe": {"heldout_permille": heldout_permille, "max_train_chars": max_train_chars,
                   "split": "heldout iff int(sha256('<package>:<path>')[:16], 16) % 1000 < heldout_permille",
                   "document_separator": "\\n\\f\\n", "sources": {k: [p for p, _ in v] for k, v in sources.items()},
                   "min_doc_chars": markup.MIN_DOC_CHARS, "min_prose_share": markup.MIN_PROSE_SHARE,
                   "min_paragraph_letter_share": markup.MIN_PARA_LETTER_SHARE, "tools": tool_versions()},
        "packages": pkgs,
        "corpus": {split: {"file": f"{split}.txt", "sha256": sha256_file(paths[split]), "documents": len(ds),
                           "chars": len(DOC_SEP.join(ds)) + 1,
                           "bytes": os.path.getsize(paths[split])}
                   for split, ds in (("train", train), ("heldout", held))},
        "files_by_split": dict(sorted(by_split.items())),
        "files": files,
    }
    with open(os.path.join(out, "MANIFEST.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)
        f.write("\n")
    c = manifest["corpus"]
    log(f"corpus_text.py: train {c['train']['documents']} documents, {c['train']['chars']} chars; "
        f"held-out {c['heldout']['documents']} documents, {c['heldout']['chars']} chars; files by split: "
        + ", ".join(f"{k} {v}" for k, v in manifest["files_by_split"].items()))
    return manifest


def tool_versions() -> dict:
    out = {"python": sys.version.split()[0], "unicode": markup.unicodedata.unidata_version}
    for name, args in (("groff", ["groff", "--version"]), ("col", ["col", "--version"])):
        try:
            r = subprocess.run(args, capture_output=True, text=True, check=False)
            out[name] = (r.stdout or r.stderr).split("\n")[0].strip()
        except OSError:
            out[name] = None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="write train.txt, heldout.txt, MANIFEST.json")
    b.add_argument("--root", required=True, help="folder holding one unpacked .deb per package name")
    b.add_argument("--packages", required=True, help="TSV: name, version, .deb file name, .deb sha256")
    b.add_argument("--out", required=True)
    b.add_argument("--heldout-permille", type=int, default=25)
    b.add_argument("--max-train-chars", type=int, default=100_000_000)
    b.add_argument("--min-heldout-chars", type=int, default=300_000)
    b.add_argument("--jobs", type=int, default=None, help="threads rendering man pages (output does not depend on it)")
    b.add_argument("--command", default="", help="the command line to record in MANIFEST.json")
    c = sub.add_parser("clean", help="print one file's cleaned text")
    c.add_argument("kind", choices=["rst", "pod", "man", "html", "text"])
    c.add_argument("file")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "clean":
            with open(a.file, "rb") as f:
                raw = f.read()
            if a.file.endswith(".gz"):
                raw = gzip.decompress(raw)
            text, why = extract(raw, a.kind)
            print(text if why is None else f"[{why}]")
            return 0
        build(a.root, a.packages, a.out, a.heldout_permille, a.max_train_chars, a.min_heldout_chars, a.jobs,
              a.command, log=lambda m: print(m, file=sys.stderr))
        return 0
    except (CorpusError, OSError) as e:
        print(f"corpus_text.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
