"""Markup to plain paragraphs for scripts/corpus_text.py (issue 44's corpus): reST, POD, rendered man pages, HTML.

Each clean_* / man_paragraphs function returns a document's raw paragraphs; finish() normalises them (NFC,
typographic hyphens / quotes / spaces to ASCII, control characters out, whitespace collapsed: one line a
paragraph), drops the paragraphs that are not prose (under 80 % letters or spaces) and says whether the document
is kept; extract() does both for one file's bytes. Pure functions of their input, but render_man (groff, col).
Not a program: scripts/corpus_text.py loads it.
"""
from __future__ import annotations

import html.entities
import os
import re
import subprocess
import unicodedata
from html.parser import HTMLParser

MIN_DOC_CHARS = 200
MIN_PROSE_SHARE = 0.30
MIN_PARA_LETTER_SHARE = 0.80


class CorpusError(Exception):
    """Bad input or a missing tool (exit 2)."""


# ------------------------------------------------------------------------------------------------------------
# common normalisation

_CHARMAP = {0x2010: "-", 0x2011: "-", 0x2012: "-", 0x2212: "-", 0x00AD: "", 0x2018: "'", 0x2019: "'",
            0x201C: '"', 0x201D: '"', 0x00A0: " ", 0x2002: " ", 0x2003: " ", 0x2009: " ", 0x200B: "",
            0xFEFF: "", 0x2060: "", 0x200C: "", 0x200D: "", 0x0009: " "}


def normalise(text: str) -> str:
    """NFC, typographic hyphens / quotes / spaces to ASCII, control characters out, whitespace collapsed."""
    text = unicodedata.normalize("NFC", text).translate(_CHARMAP)
    text = "".join(c for c in text if c == "\n" or unicodedata.category(c)[0] != "C")
    return re.sub(r"[ \n]+", " ", text).strip()


def prose_ok(par: str) -> bool:
    """A paragraph worth keeping: Latin letters and spaces make up at least 80 % of it (not code, tables, paths,
    nor another script: the corpus is English)."""
    if not par:
        return False
    good = sum(1 for c in par if c == " " or (c.isalpha() and ord(c) < 0x250))
    return good >= MIN_PARA_LETTER_SHARE * len(par) and any(c.isalpha() for c in par)


def finish(paragraphs) -> tuple[str, str | None]:
    """(document text, None) or ("", why dropped) from raw paragraph strings."""
    pars = [normalise(p) for p in paragraphs]
    pars = [p for p in pars if p]
    total = sum(len(p) for p in pars)
    kept = [p for p in pars if prose_ok(p)]
    n = sum(len(p) for p in kept)
    if n < MIN_DOC_CHARS:
        return "", "dropped:short"
    if n < MIN_PROSE_SHARE * total:
        return "", "dropped:code"
    return "\n\n".join(kept), None


# ------------------------------------------------------------------------------------------------------------
# reStructuredText (Sphinx, kernel-doc)

# directives whose body is prose (kept); every other directive is dropped with its body
RST_KEEP = {"note", "warning", "important", "tip", "hint", "caution", "attention", "danger", "error", "seealso",
            "admonition", "versionadded", "versionchanged", "deprecated", "deprecated-removed", "impl-detail",
            "function", "class", "method", "attribute", "data", "exception", "module", "decorator",
            "classmethod", "staticmethod", "abstractmethod", "coroutinefunction", "coroutinemethod",
            "awaitablefunction", "decoratormethod", "envvar", "option", "describe", "object", "cmdoption",
            "opcode", "c:function", "c:macro", "c:member", "c:type", "c:var", "c:struct", "c:enum",
            "cpp:function", "rst:directive", "topic", "sidebar", "rubric", "glossary", "container",
            "availability", "pdbcommand", "2to3fixer", "monitoring-event", "index-only", "centered",
            "epigraph", "highlights", "pull-quote", "compound", "hlist"}
# of those, the ones whose header argument is prose too (".. note:: text")
RST_HEADER_PROSE = {"note", "warning", "important", "tip", "hint", "caution", "attention", "danger", "error",
                    "seealso", "admonition", "impl-detail", "topic", "sidebar", "rubric", "centered"}
_BIBLIO = {"author", "authors", "copyright", "date", "version", "license", "contact", "organization",
           "address", "revision", "status", "maintainer", "maintainers", "updated", "last updated"}

_ADORN = re.compile(r"^\s*([=\-~^\"'`#*+<>_:.])\1{2,}\s*$")
_SIMPLE_TABLE = re.compile(r"^\s*[=\-]{2,}(\s+[=\-]{2,})+\s*$")
_EXPLICIT = re.compile(r"^(\s*)\.\.(\s|$)")
_DIRECTIVE = re.compile(r"^\s*\.\.\s+([\w:.+-]+)::(.*)$")
_BULLET = re.compile(r"^\s*([-*+\u2022]|#\.|\d+[.)]|\(?[a-zA-Z0-9]\))\s+\S")
_FIELD = re.compile(r"^\s*:([A-Za-z][\w .-]*):(\s+(.*))?$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _block_end(lines, i, indent):
    """First index after i whose line is not blank and is indented <= indent."""
    j = i + 1
    while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > indent):
        j += 1
    return j


def rst_inline(text: str) -> str:
    def role(m):
        inner = m.group(1)
        t = re.match(r"^(.*?)\s*<[^<>]*>$", inner, re.S)
        if t and t.group(1):
            return t.group(1)
        inner = inner.lstrip("!")
        if inner.startswith("~"):
            inner = inner[1:].split(".")[-1]
        return inner
    text = re.sub(r":(?:[\w.+-]+:)+`(.+?)`", role, text, flags=re.S)
    text = re.sub(r"``(.+?)``", r"\1", text, flags=re.S)
    text = re.sub(r"`([^`<]+?)\s*<[^`>]*>`__?", r"\1", text)
    text = re.sub(r"`([^`]+?)`(__?|:[\w.+-]+:)?", r"\1", text)
    text = re.sub(r"\s*\[(#[\w-]*|\d+|\*)\]_", "", text)
    text = re.sub(r"\|([^|\s][^|]*?)\|_{0,2}", r"\1", text)
    text = re.sub(r"\*\*(\S(?:.*?\S)?)\*\*", r"\1", text, flags=re.S)
    text = re.sub(r"(?<![\w*\\])\*(\S(?:[^*]*?\S)?)\*(?![\w*])", r"\1", text)
    text = text.replace("\\ ", "")
    return re.sub(r"(?<=\w)\\(?=\w)", "", text)  # copy\ing: an escaped character joined to a word


def rst_paragraphs(lines) -> list[str]:
    pars, cur = [], []
    lit_indent = None  # paragraph ended with '::': the indented block that follows is code

    def flush():
        if cur:
            pars.append(rst_inline(" ".join(cur)))
            cur.clear()

    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        s = line.strip()
        if not s:
            flush()
            i += 1
            continue
        ind = _indent(line)
        if lit_indent is not None:
            if ind > lit_indent:
                i = _block_end(lines, i, lit_indent)
                lit_indent = None
                continue
            lit_indent = None
        if _EXPLICIT.match(line):
            flush()
            j = _block_end(lines, i, ind)
            d = _DIRECTIVE.match(line)
            name = d.group(1).lower() if d else None
            if name in RST_KEEP:
                k = i + 1
                while k < j and lines[k].strip():
                    k += 1  # header continuation lines and :options:
                if name in RST_HEADER_PROSE:
                    head = [d.group(2).strip()] + [x.strip() for x in lines[i + 1:k] if not _FIELD.match(x)]
                    pars.append(rst_inline(" ".join(h for h in head if h)))
                pars.extend(rst_paragraphs(lines[k:j]))
            i = j
            continue
        if _ADORN.match(line) or _SIMPLE_TABLE.match(line):
            flush()
            i += 1
            continue
        if s.startswith(("+-", "+=", "|")) or s.startswith(">>>"):
            flush()
            while i < n and lines[i].strip():
                i += 1
            continue
        f = _FIELD.match(line)
        if f:
            flush()
            if f.group(1).strip().lower() not in _BIBLIO and f.group(3):
                cur.append(f.group(3))
            i += 1
            continue
        if _BULLET.match(line):
            flush()
            s = re.sub(r"^[-*+\u2022]\s+", "", s)
        if s.endswith("::"):
            s = s[:-2].rstrip()
            if s and not line.rstrip()[:-2].endswith((" ", "\t")):
                s += ":"
            if s:
                cur.append(s)
            flush()
            lit_indent = ind
            i += 1
            continue
        cur.append(s)
        i += 1
    flush()
    return pars


def clean_rst(text: str) -> list[str]:
    return rst_paragraphs(text.expandtabs(8).split("\n"))


# ------------------------------------------------------------------------------------------------------------
# POD (perlpod)

_POD_BOILER = re.compile(r"^[A-Z][A-Z0-9 ,&/()-]*$")  # NAME, SYNOPSIS, AUTHOR, SEE ALSO, ...


def _pod_escape(name: str) -> str:
    if re.fullmatch(r"0[xX][0-9a-fA-F]+", name):
        return chr(int(name, 16))
    if re.fullmatch(r"0[0-7]*", name):
        return chr(int(name, 8)) if name != "0" else ""
    if name.isdigit():
        return chr(int(name))
    special = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/"}
    if name in special:
        return special[name]
    code = html.entities.name2codepoint.get(name)
    return chr(code) if code else ""


_POD_CODE = re.compile(r"([A-Z])(<+)")


def pod_inline(text: str) -> str:
    """Formatting codes (B<>, C<< >>, L<text|target>, E<gt>, X<> ...) reduced to their text."""
    out, i, n = [], 0, len(text)
    while i < n:
        m = _POD_CODE.match(text, i)
        if not m:
            out.append(text[i])
            i += 1
            continue
        code, opens = m.group(1), len(m.group(2))
        start = m.end()
        if opens > 1 and start < n and text[start] in " \t\n":
            end = text.find(" " + ">" * opens, start)
            if end < 0:
                end = n
            inner, nxt = text[start:end].strip(), min(n, end + 1 + opens)
        else:
            depth, j = 1, start
            while j < n:
                if text[j] == "<" and j > 0 and text[j - 1].isupper():
                    depth += 1
                elif text[j] == ">":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            inner, nxt = text[start:j], j + 1
        if code in "XZ":
            pass
        elif code == "E":
            out.append(_pod_escape(inner.strip()))
        elif code == "L":
            inner = pod_inline(inner)
            if "|" in inner:
                out.append(inner.split("|", 1)[0])
            elif re.match(r"^\w+://", inner):
                out.append(inner)
            else:
                page, _, sec = inner.partition("/")
                sec = sec.strip('"')
                out.append(f'"{sec}" in {page}' if page and sec else (sec or page).strip('"'))
        else:
            out.append(pod_inline(inner))
        i = nxt
    return "".join(out)


def clean_pod(text: str) -> list[str]:
    pars, in_pod, skip_until = [], True, None
    for block in re.split(r"\n[ \t]*\n", text.replace("\r\n", "\n")):
        if not block.strip():
            continue
        b = block.strip("\n")
        cmd = re.match(r"^=([a-zA-Z]\w*)\s*(.*)$", b, re.S)
        if skip_until:
            if cmd and cmd.group(1) == "end" and cmd.group(2).split()[:1] == [skip_until]:
                skip_until = None
            continue
        if cmd:
            name, arg = cmd.group(1), cmd.group(2).strip()
            if name == "cut":
                in_pod = False
                continue
            in_pod = True
            if name == "begin":
                skip_until = (arg.split() or [""])[0]
            elif name in ("head1", "head2", "head3", "head4", "head5", "head6", "item"):
                arg = pod_inline(arg).strip()
                if name == "item":
                    arg = re.sub(r"^(\*|\d+\.?)\s*", "", arg)
                if arg and not (name.startswith("head") and _POD_BOILER.match(arg)):
                    pars.append(arg)
            continue  # =pod =over =back =for =encoding ...
        if not in_pod or b[:1] in (" ", "\t"):
            continue  # code outside POD, or a verbatim paragraph
        pars.append(pod_inline(b))
    return pars


# ------------------------------------------------------------------------------------------------------------
# man pages (rendered text)

MAN_DROP = {"SYNOPSIS", "EXAMPLE", "EXAMPLES", "SEE ALSO", "COLOPHON", "AUTHOR", "AUTHORS", "ATTRIBUTES", "COPYRIGHT",
            "COPYRIGHT AND LICENSE", "LICENSE", "LICENCE", "REPORTING BUGS", "LIBRARY", "FILES"}


def man_paragraphs(rendered: str) -> list[str]:
    """Paragraphs from `groff -Tutf8 -mandoc | col -bx` output: the page header and footer lines, the sections
    of MAN_DROP and no-fill blocks left out, section headings themselves dropped."""
    lines = rendered.split("\n")
    nonblank = [i for i, x in enumerate(lines) if x.strip()]
    if len(nonblank) < 3:
        return []
    lines = lines[nonblank[0] + 1:nonblank[-1]]
    pars, cur, indents, drop = [], [], set(), False

    def flush():
        # the line length is huge, so filled text never wraps: lines of one indent together are no-fill
        # text (code, tables), left out
        if cur and not drop and not (len(cur) > 1 and len(indents) == 1):
            pars.append(" ".join(cur))
        cur.clear()
        indents.clear()

    for line in lines:
        if not line.strip():
            flush()
        elif not line[0].isspace():
            flush()
            drop = line.strip().upper() in MAN_DROP
        else:
            cur.append(line.strip())
            indents.add(_indent(line))
    flush()
    return pars


def render_man(raw: bytes) -> str:
    env = dict(os.environ, LC_ALL="C.UTF-8", GROFF_NO_SGR="1")
    groff = subprocess.run(["groff", "-k", "-Kutf-8", "-t", "-Tutf8", "-mandoc", "-rLL=1000n", "-rHY=0",
                            "-dAD=l", "-P-cbou"], input=raw, capture_output=True, env=env, check=False)
    if groff.returncode != 0:
        raise CorpusError("groff failed: " + groff.stderr.decode("utf-8", "replace")[:300])
    col = subprocess.run(["col", "-bx"], input=groff.stdout, capture_output=True, env=env, check=False)
    if col.returncode != 0:
        raise CorpusError("col -bx failed: " + col.stderr.decode("utf-8", "replace")[:300])
    return col.stdout.decode("utf-8", "replace")


def is_man_redirect(raw: bytes) -> bool:
    body = [x for x in raw.decode("utf-8", "replace").split("\n") if x.strip() and not x.startswith(('.\\"', "'\\\""))]
    return len(body) <= 2 and any(x.startswith(".so ") for x in body)


# ------------------------------------------------------------------------------------------------------------
# HTML (DocBook output)

HTML_SKIP_TAGS = {"head", "script", "style", "pre", "table", "svg", "math", "nav"}
HTML_SKIP_CLASSES = {"navheader", "navfooter", "toc", "refsynopsisdiv", "synopsis", "programlisting", "screen",
                     "literallayout", "footnotes", "index", "navigation", "sphinxsidebar", "related", "footer"}
HTML_BLOCK = {"p", "div", "li", "dd", "dt", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "br", "section",
              "ul", "ol", "dl", "tr", "td", "th", "hr", "body", "title", "caption", "figcaption"}
HTML_VOID = {"br", "hr", "img", "meta", "link", "input", "area", "base", "col", "wbr", "source", "embed"}


class _HTMLText(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.skip, self.pars, self.cur = [], 0, [], []

    def _flush(self):
        if self.cur:
            self.pars.append("".join(self.cur))
            self.cur = []

    def handle_starttag(self, tag, attrs):
        if tag in HTML_BLOCK:
            self._flush()
        if tag in HTML_VOID:
            return
        classes = set((dict(attrs).get("class") or "").split())
        skip = tag in HTML_SKIP_TAGS or bool(classes & HTML_SKIP_CLASSES)
        self.stack.append((tag, skip))
        self.skip += skip

    def handle_endtag(self, tag):
        if tag in HTML_BLOCK:
            self._flush()
        if tag in HTML_VOID or not any(t == tag for t, _ in self.stack):
            return
        while self.stack:  # close unclosed children too
            t, skip = self.stack.pop()
            self.skip -= skip
            if t == tag:
                break

    def handle_data(self, data):
        if not self.skip:
            self.cur.append(data)


def clean_html(text: str) -> list[str]:
    p = _HTMLText()
    p.feed(text)
    p.close()
    p._flush()
    return [re.sub(r"\s*\u00a7(?=\s|$)", "", x) for x in p.pars]  # PostgreSQL's release notes: commit links "§"


# ------------------------------------------------------------------------------------------------------------


def extract(raw: bytes, kind: str) -> tuple[str, str | None]:
    """(document text, None) or ("", reason) for one file's bytes (decompressed)."""
    if kind == "man":
        if is_man_redirect(raw):
            return "", "dropped:so-redirect"
        return finish(man_paragraphs(render_man(raw)))
    text = raw.decode("utf-8", "replace")
    if kind == "rst":
        return finish(clean_rst(text))
    if kind == "pod":
        return finish(clean_pod(text))
    if kind == "html":
        return finish(clean_html(text))
    if kind == "text":
        return finish(re.split(r"\n\s*\n", text))
    raise CorpusError(f"unknown kind {kind!r}")
