"""Issue 44, part 1: the corpus recipe (scripts/corpus_text.py, scripts/make-corpus.sh) on small fixtures, no
network, and scripts/train-small-model.py: its argument checks everywhere, its torch-only parts where torch is
importable, and a --smoke run end to end where torch, transformers and tokenizers are (the GPU machine)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = REPO_ROOT / "scripts"
MAKE_CORPUS = SCRIPTS / "make-corpus.sh"
TRAIN = SCRIPTS / "train-small-model.py"


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


ct = load("corpus_text", SCRIPTS / "corpus_text.py")
cm = ct.markup  # scripts/corpus_markup.py, as corpus_text.py loaded it
tsm = load("train_small_model", TRAIN)

PROSE = ("The kernel keeps a reference count for every object that is shared between threads. When the count "
         "drops to zero the object is released and its memory is returned to the allocator. ")

RST = """.. SPDX-License-Identifier: GPL-2.0

==================
Reference counters
==================

:Author: Someone <someone@example.org>

{prose}Use the :c:func:`kref_get` helper, see `the paper <https://example.org>`_ and **always** take the
*lock* first [#]_.

To use a kref, add one to your structure like::

    struct my_data {{
        struct kref refcount;
    }};

.. code-block:: c

   kref_init(&data->refcount);

.. note:: Drop the reference
   only when you are done.

.. function:: release(obj)

   Called when the last reference goes away, with the object locked.

+-------+-------+
| a     | b     |
+-------+-------+

>>> print(1)
1

- first item of a list
- second item of a list
""".format(prose=PROSE * 2)

POD = """=head1 NAME

perlthing - a thing

=head1 Using the thing
X<thing>

{prose}Call C<< $obj->run >> or B<run> with I<care>; see L<perlfunc/open> and L<the manual|perlop>.
Write E<lt>tagE<gt> for a tag.

    my $x = code_here();

=begin html

<p>html only</p>

=end html

=over 4

=item * an item that explains something

=back

=cut

sub not_pod {{ 1 }}

=pod

Back in POD again.
""".format(prose=PROSE * 2)


# ------------------------------------------------------------------------------------------------------------
# text cleaning


def test_normalise_and_prose_filter():
    assert cm.normalise("a\u2010b \u2018q\u2019  \u201cw\u201d\n\tx\u00a0y\u200b") == "a-b 'q' \"w\" x y"
    assert cm.prose_ok("This is a plain English sentence.")
    assert not cm.prose_ok("int fd = open(path, O_RDONLY); if (fd < 0) { return -1; }")
    assert not cm.prose_ok("0x10 0x20 0x30 == 42;")
    assert not cm.prose_ok("")
    assert not cm.prose_ok("\u3053\u308c\u306f\u65e5\u672c\u8a9e\u306e\u6587\u3067\u3059 and a few words")


def test_rst_markup_stripped_code_dropped():
    pars = cm.clean_rst(RST)
    text = "\n".join(pars)
    assert pars[0] == "Reference counters"
    assert "Use the kref_get helper, see the paper and always take the lock first." in text
    assert "To use a kref, add one to your structure like:" in pars
    assert "Drop the reference only when you are done." in pars
    assert "Called when the last reference goes away, with the object locked." in pars
    assert "first item of a list" in pars and "second item of a list" in pars
    for junk in ("struct my_data", "kref_init", "SPDX", "Someone", "release(obj)", "| a", ">>>", "====", "::"):
        assert junk not in text, junk


def test_pod_markup_stripped_code_dropped():
    pars = [cm.normalise(p) for p in cm.clean_pod(POD)]
    text = "\n".join(pars)
    assert "NAME" not in pars and "Using the thing" in pars
    assert "Call $obj->run or run with care; see \"open\" in perlfunc and the manual. Write <tag> for a tag." in text
    assert "an item that explains something" in pars
    assert "Back in POD again." in pars
    for junk in ("code_here", "html only", "not_pod", "X<", "thing>"):
        assert junk not in text, junk


def test_html_text():
    html = ("<html><head><title>t</title></head><body><div class='navheader'>Prev Next</div>"
            "<h2>Intro</h2><p>One <em>two</em>\n three <a href='#x'>\u00a7</a></p><pre>code();</pre>"
            "<table><tr><td>cell</td></tr></table><ul><li><p>item</p></li></ul></body></html>")
    assert [cm.normalise(p) for p in cm.clean_html(html) if cm.normalise(p)] == ["Intro", "One two three", "item"]


def test_man_paragraphs_drop_sections_and_nofill():
    rendered = "\n".join([
        "READ(2)            Linux Programmer's Manual           READ(2)", "", "NAME",
        "       read - read from a file descriptor", "", "SYNOPSIS", "       #include <unistd.h>", "",
        "DESCRIPTION", "       read() attempts to read up to count bytes.", "",
        "       EAGAIN", "              The file is nonblocking.", "",
        "           int x = 1;", "           int y = 2;", "", "SEE ALSO", "       write(2)", "",
        "Linux 6.03                       2023-02-05                       READ(2)"])
    assert cm.man_paragraphs(rendered) == ["read - read from a file descriptor", "read() attempts to read up to count bytes.",
                                           "EAGAIN The file is nonblocking."]
    assert cm.is_man_redirect(b'.\\" comment\n.so man3/other.3\n')
    assert not cm.is_man_redirect(b".TH X 1\n.SH NAME\nx \\- y\n")


@pytest.mark.skipif(not (shutil.which("groff") and shutil.which("col")), reason="groff / col not installed (groff-base, bsdextrautils)")
def test_render_man_with_groff():
    roff = (".TH DEMO 7 2024-01-01 demo\n.SH NAME\ndemo \\- a page\n.SH DESCRIPTION\n" + PROSE * 3 +
            "\n.PP\nA second paragraph\nover two source lines.\n.SH EXAMPLES\n.EX\nint main(void);\n.EE\n").encode()
    text, why = cm.extract(roff, "man")
    assert why is None
    pars = text.split("\n\n")
    assert pars[0] == "demo - a page" and pars[1] == (PROSE * 3).strip() and pars[2] == "A second paragraph over two source lines."
    assert "int main" not in text and "DEMO" not in text


def test_documents_too_short_or_code_heavy_are_dropped():
    assert cm.finish(["Short text."]) == ("", "dropped:short")
    code = ["x = f(y); z[i] = {a: b};" * 40]
    assert cm.finish(code + [PROSE]) == ("", "dropped:short")
    assert cm.finish(code * 3 + [PROSE * 2]) == ("", "dropped:code")
    text, why = cm.finish([PROSE * 2, "  spaced   out  "])
    assert why is None and text == cm.normalise(PROSE * 2) + "\n\nspaced out"


# ------------------------------------------------------------------------------------------------------------
# split and build


def test_split_is_sha256_of_package_and_path():
    for pkg, path in (("perl-doc", "usr/share/perl/5.36.0/pod/perlsyn.pod"), ("manpages", "usr/share/man/man2/read.2.gz")):
        h = int(hashlib.sha256(f"{pkg}:{path}".encode()).hexdigest()[:16], 16)
        assert ct.split_of(pkg, path, 25) == ("heldout" if h % 1000 < 25 else "train")
    paths = [f"usr/share/doc/x/file{i}.rst" for i in range(20000)]
    held = [p for p in paths if ct.split_of("pkg", p, 25) == "heldout"]
    assert 0.02 < len(held) / len(paths) < 0.03
    # the same set computed here from sha256 alone: the split does not depend on the process (no salted hash())
    assert held == [p for p in paths if int(hashlib.sha256(f"pkg:{p}".encode()).hexdigest()[:16], 16) % 1000 < 25]
    assert all(ct.split_of("pkg", p, 999) == "heldout" or ct.doc_hash("pkg", p) % 1000 == 999 for p in paths[:50])


def make_tree(root: Path, n_docs=24):
    """Two fake packages: 'rstdocs' (reST, some gzipped) and 'poddocs' (POD), plus a duplicate and a short file."""
    rng = random.Random(7)
    words = PROSE.replace(".", "").lower().split()
    rows = []
    for pkg, kind, ext in (("rstdocs", "rst", ".rst"), ("poddocs", "pod", ".pod")):
        base = root / pkg / "usr" / "share" / "doc" / pkg
        base.mkdir(parents=True)
        for i in range(n_docs):
            body = "\n\n".join(" ".join(rng.choice(words) for _ in range(40)).capitalize() + "." for _ in range(6))
            if kind == "rst":
                text = f"Title {i}\n=======\n\n{body}\n\nExample::\n\n    code({i});\n"
            else:
                text = f"=head1 Part {i}\n\n{body}\n\n    verbatim({i});\n"
            data = text.encode()
            if kind == "rst" and i % 2:
                import gzip
                (base / f"doc{i:02d}{ext}.gz").write_bytes(gzip.compress(data, mtime=0))
            else:
                (base / f"doc{i:02d}{ext}").write_bytes(data)
        (base / f"zz-short{ext}").write_text("Tiny.\n")
        rows.append(f"{pkg}\t1.0-{len(pkg)}\t{pkg}_1.0_all.deb\t{'ab' * 32}\n")
    shutil.copy(root / "poddocs/usr/share/doc/poddocs/doc00.pod", root / "poddocs/usr/share/doc/poddocs/doc99.pod")
    (root / "packages.tsv").write_text("".join(rows))
    sources = {"rstdocs": [(r"^usr/share/doc/rstdocs/.+\.rst(\.gz)?$", "rst")],
               "poddocs": [(r"^usr/share/doc/poddocs/.+\.pod$", "pod")]}
    return sources


def test_build_is_deterministic_and_splits_by_document(tmp_path):
    sources = make_tree(tmp_path / "x")
    kw = dict(heldout_permille=200, max_train_chars=10**9, min_heldout_chars=1, sources=sources, log=lambda m: None)
    m1 = ct.build(str(tmp_path / "x"), str(tmp_path / "x/packages.tsv"), str(tmp_path / "a"), jobs=1, **kw)
    m2 = ct.build(str(tmp_path / "x"), str(tmp_path / "x/packages.tsv"), str(tmp_path / "b"), jobs=4, **kw)
    for f in ("train.txt", "heldout.txt"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    assert m1["corpus"] == m2["corpus"]
    man = json.loads((tmp_path / "a/MANIFEST.json").read_text())
    assert man["corpus"]["train"]["sha256"] == hashlib.sha256((tmp_path / "a/train.txt").read_bytes()).hexdigest()
    assert {p["name"] for p in man["packages"]} == {"rstdocs", "poddocs"}
    assert all(p["deb_sha256"] == "ab" * 32 and p["version"] for p in man["packages"])
    files = {(f["package"], f["path"]): f for f in man["files"]}
    assert files[("poddocs", "usr/share/doc/poddocs/doc99.pod")]["split"] == "dropped:duplicate"
    assert files[("rstdocs", "usr/share/doc/rstdocs/zz-short.rst")]["split"] == "dropped:short"
    for f in man["files"]:
        raw = (tmp_path / "x" / f["package"] / f["path"]).read_bytes()
        assert f["sha256"] == hashlib.sha256(raw).hexdigest()
        if not f["split"].startswith("dropped"):
            assert f["split"] == ct.split_of(f["package"], f["path"], 200) and f["chars"] > 0
    train, held = ct.read_documents(str(tmp_path / "a/train.txt")), ct.read_documents(str(tmp_path / "a/heldout.txt"))
    assert len(train) == man["corpus"]["train"]["documents"] and len(held) == man["corpus"]["heldout"]["documents"] >= 1
    assert not set(train) & set(held)
    assert sum(f["split"] == "heldout" for f in man["files"]) == len(held)
    assert "code(" not in "".join(train + held) and "verbatim(" not in "".join(train + held)
    assert len((tmp_path / "a/train.txt").read_text()) == man["corpus"]["train"]["chars"]


def test_build_cap_and_heldout_minimum(tmp_path):
    sources = make_tree(tmp_path / "x")
    args = (str(tmp_path / "x"), str(tmp_path / "x/packages.tsv"))
    full = ct.build(*args, str(tmp_path / "a"), 200, 10**9, 1, sources=sources, log=lambda m: None)
    cap = full["corpus"]["train"]["chars"] // 2
    m1 = ct.build(*args, str(tmp_path / "b"), 200, cap, 1, sources=sources, log=lambda m: None)
    m2 = ct.build(*args, str(tmp_path / "c"), 200, cap, 1, sources=sources, log=lambda m: None)
    assert m1["corpus"]["train"]["chars"] <= cap < full["corpus"]["train"]["chars"]
    assert (tmp_path / "b/train.txt").read_bytes() == (tmp_path / "c/train.txt").read_bytes()
    assert m1["corpus"] == m2["corpus"]
    assert (tmp_path / "b/heldout.txt").read_bytes() == (tmp_path / "a/heldout.txt").read_bytes()
    assert any(f["split"] == "dropped:cap" for f in m1["files"])
    with pytest.raises(ct.CorpusError, match="held-out characters"):
        ct.build(*args, str(tmp_path / "d"), 200, 10**9, 10**9, sources=sources, log=lambda m: None)
    with pytest.raises(ct.CorpusError, match="no text source rules"):
        ct.build(*args, str(tmp_path / "e"), 200, 10**9, 1, sources={"rstdocs": sources["rstdocs"]}, log=lambda m: None)


def test_make_corpus_script_offline_end_to_end(tmp_path):
    for tool in ("dpkg-deb", "groff", "col", "xz"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} not installed")
    # two tiny .debs under real package names, whose files match corpus_text.py's rules
    rng = random.Random(3)
    words = PROSE.replace(".", "").lower().split()
    debs = tmp_path / "debs"
    debs.mkdir()
    layout = {"perl-doc": ("usr/share/perl/5.36.0/pod/perl{i}.pod", "=head1 Section {i}\n\n{body}\n"),
              "python3.11-doc": ("usr/share/doc/python3.11/html/_sources/library/m{i}.rst.txt", "Module {i}\n========\n\n{body}\n")}
    for pkg, (path, tmpl) in layout.items():
        d = tmp_path / "pkg" / pkg
        (d / "DEBIAN").mkdir(parents=True)
        (d / "DEBIAN/control").write_text(f"Package: {pkg}\nVersion: 0.1-test\nArchitecture: all\nMaintainer: t <t@t>\n"
                                          "Description: test fixture\n")
        for i in range(30):
            body = "\n\n".join(" ".join(rng.choice(words) for _ in range(30)).capitalize() + "." for _ in range(4))
            f = d / path.format(i=i)
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(tmpl.format(i=i, body=body))
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(d), str(debs / f"{pkg}_0.1-test_all.deb")],
                       check=True, capture_output=True)
    base = [str(MAKE_CORPUS), "--offline", "--debs", str(debs), "--packages", "perl-doc python3.11-doc",
            "--heldout-permille", "100", "--min-heldout-chars", "100"]
    r1 = subprocess.run(base + ["--out", str(tmp_path / "o1"), "--verify"], capture_output=True, text=True, timeout=300)
    assert r1.returncode == 0, r1.stderr
    assert "byte-identical" in r1.stderr
    r2 = subprocess.run(base + ["--out", str(tmp_path / "o2"), "--jobs", "1"], capture_output=True, text=True, timeout=300)
    assert r2.returncode == 0, r2.stderr
    for f in ("train.txt", "heldout.txt"):
        assert (tmp_path / "o1" / f).read_bytes() == (tmp_path / "o2" / f).read_bytes()
    man = json.loads((tmp_path / "o1/MANIFEST.json").read_text())
    assert [p["name"] for p in man["packages"]] == ["perl-doc", "python3.11-doc"]
    assert man["packages"][0]["deb_sha256"] == hashlib.sha256((debs / "perl-doc_0.1-test_all.deb").read_bytes()).hexdigest()
    assert man["command"].startswith("scripts/make-corpus.sh --offline")
    with tarfile.open(tmp_path / "o1/corpus.tar.xz") as t:
        assert sorted(t.getnames()) == ["MANIFEST.json", "heldout.txt", "train.txt"]
        assert t.extractfile("train.txt").read() == (tmp_path / "o1/train.txt").read_bytes()
    # clear errors
    bad = subprocess.run([str(MAKE_CORPUS), "--offline", "--debs", str(debs), "--packages", "manpages",
                          "--out", str(tmp_path / "o3")], capture_output=True, text=True)
    assert bad.returncode == 2 and "want exactly one manpages_*.deb" in bad.stderr


def test_make_corpus_help_and_bad_arguments():
    h = subprocess.run([str(MAKE_CORPUS), "--help"], capture_output=True, text=True)
    assert h.returncode == 0 and "--heldout-permille" in h.stdout and "byte-identical" in h.stdout
    for args, msg in ((["--bogus"], "unknown argument"), (["--jobs", "x"], "--jobs wants"), (["--out"], "needs a value")):
        r = subprocess.run([str(MAKE_CORPUS), *args], capture_output=True, text=True)
        assert r.returncode == 2 and msg in r.stderr, (args, r.stderr)


# ------------------------------------------------------------------------------------------------------------
# train-small-model.py


def test_train_help_and_argument_checks_without_torch(tmp_path):
    h = subprocess.run([sys.executable, str(TRAIN), "--help"], capture_output=True, text=True)
    assert h.returncode == 0 and "--variant" in h.stdout and "heldout_score.jsonl" in h.stdout
    (tmp_path / "c").mkdir()
    for extra, msg in ((["--variant", "gqa", "--kv-heads", "6"], "fewer --kv-heads"),
                       (["--variant", "mha", "--kv-heads", "2"], "equal to --heads"),
                       (["--variant", "mha", "--hidden", "100"], "not a multiple"),
                       (["--variant", "mha", "--seq-len", "2048"], "--seq-len must be")):
        r = subprocess.run([sys.executable, str(TRAIN), "--corpus", str(tmp_path / "c"), "--out", str(tmp_path / "o"), *extra],
                           capture_output=True, text=True)
        assert r.returncode == 2 and msg in r.stderr, (extra, r.stderr)


def test_resolve_defaults_are_the_issue_model():
    a = tsm.resolve(tsm.parse(["--corpus", "c", "--out", "o", "--variant", "gqa"]))
    assert (a.hidden, a.layers, a.heads, a.kv_heads, a.intermediate, a.vocab, a.max_pos) == (384, 6, 6, 2, 1024, 4096, 1024)
    assert (a.seq_len, a.batch_size, a.lr, a.weight_decay, a.grad_clip, a.seed) == (512, 64, 1e-3, 0.1, 1.0, 0)
    assert tsm.resolve(tsm.parse(["--corpus", "c", "--out", "o", "--variant", "mha"])).kv_heads == 6
    s = tsm.resolve(tsm.parse(["--corpus", "c", "--out", "o", "--variant", "mha", "--smoke", "--steps", "5"]))
    assert s.hidden == 64 and s.steps == 5 and s.seq_len == 64
    lrs = [tsm.lr_at(i, a) for i in range(a.steps)]
    assert lrs[a.warmup - 1] == pytest.approx(a.lr) and max(lrs) == pytest.approx(a.lr)
    assert lrs[-1] == pytest.approx(0.1 * a.lr, rel=1e-3) and all(x > 0 for x in lrs)


class FakeTok:
    def encode_batch(self, docs, add_special_tokens=False):
        class E:
            def __init__(self, ids):
                self.ids = ids
        return [E([3 + (ord(c) % 50) for c in d]) for d in docs]


def test_stream_windows_layout():
    pytest.importorskip("numpy")
    w, n = tsm.stream_windows(FakeTok(), ["abc", "de", "fghij"], 4)
    # stream: a b c EOS d e EOS f g h i j EOS (13 tokens) -> 4 windows of 3, each after a BOS
    assert n == 13 and w.shape == (4, 4)
    assert (w[:, 0] == tsm.BOS).all()
    flat = w[:, 1:].reshape(-1).tolist()
    assert flat[3] == tsm.EOS and flat[6] == tsm.EOS and len(flat) == 12


def test_outlier_probe_rope_and_window_nll():
    torch = pytest.importorskip("torch", reason="torch not installed: the probe's RoPE is checked where torch is")
    torch.manual_seed(0)
    hd, kvh, hidden, vocab = 8, 2, 16, 11

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.k_proj, self.v_proj = torch.nn.Linear(hidden, kvh * hd, bias=False), torch.nn.Linear(hidden, kvh * hd, bias=False)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = Attn()

    class Fake(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = torch.nn.Module()
            self.model.layers = torch.nn.ModuleList([Layer()])
            self.emb, self.head = torch.nn.Embedding(vocab, hidden), torch.nn.Linear(hidden, vocab)

        def forward(self, input_ids):
            h = self.emb(input_ids)
            a = self.model.layers[0].self_attn
            a.k_proj(h), a.v_proj(h)
            return type("O", (), {"logits": self.head(h)})()

    m = Fake()
    probe = tsm.OutlierProbe(m, hd, 10000.0)
    x = torch.randint(0, vocab, (3, 7))
    with torch.no_grad():
        logits = m(x).logits
        k = m.model.layers[0].self_attn.k_proj(m.emb(x)).view(3, 7, kvh, hd)
    probe.close()
    # RoPE as a complex rotation of the pairs (j, j + hd/2), positions 0..6: independent of the probe's rotate-half
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
    ang = torch.arange(7).float()[:, None] * inv[None]
    z = torch.complex(k[..., :hd // 2], k[..., hd // 2:]) * torch.polar(torch.ones_like(ang), ang)[None, :, None, :]
    rot = torch.cat([z.real, z.imag], -1)
    assert torch.allclose(probe.kr[0], rot.abs().amax(dim=(0, 1)).reshape(-1), atol=1e-5)
    assert torch.allclose(probe.k[0], k.abs().amax(dim=(0, 1)).reshape(-1))
    t = probe.table()[0]
    assert t["k_pre_rope"]["channels"] == kvh * hd and t["v"]["ratio_max_over_median"] >= 1.0
    lp = torch.log_softmax(logits[:, :-1].double(), -1).gather(-1, x[:, 1:, None]).squeeze(-1)
    nll = tsm.window_nll(m, x.numpy(), torch.device("cpu"), 2)
    assert nll == pytest.approx((-lp.sum(1)).tolist(), rel=1e-5)
    r = tsm.ppl(nll, x.numpy())
    assert r["tokens_scored"] == 18 and r["perplexity"] == pytest.approx(math.exp(-lp.sum().item() / 18), rel=1e-5)


def tiny_corpus(d: Path):
    rng = random.Random(11)
    words = (PROSE + "Perl Python kernel file descriptor socket buffer string value function module table").split()
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(60, 160))) for _ in range(160)]
    d.mkdir(parents=True)
    (d / "train.txt").write_text(ct.DOC_SEP.join(docs[:140]) + "\n")
    (d / "heldout.txt").write_text(ct.DOC_SEP.join(docs[140:]) + "\n")
    (d / "MANIFEST.json").write_text(json.dumps({"what": "test fixture"}))
    return d


REPORT_KEYS = {"args", "seed", "versions", "corpus", "tokenizer", "data", "model", "training", "heldout_eval",
               "outliers", "score_workload", "files", "total_wall_time_s"}


def test_smoke_training_writes_a_loadable_checkpoint(tmp_path, record_measurement):
    for mod in ("torch", "transformers", "tokenizers", "safetensors"):
        pytest.importorskip(mod, reason=f"{mod} not installed: train-small-model.py --smoke runs where it is (the GPU machine)")
    import torch
    corpus = tiny_corpus(tmp_path / "corpus")
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    dev = "cuda" if torch.cuda.is_available() else "cpu"

    def train(out, *extra):
        r = subprocess.run([sys.executable, str(TRAIN), "--corpus", str(corpus), "--out", str(out), "--smoke",
                            "--device", dev, *extra], capture_output=True, text=True, timeout=900, env=env)
        assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
        return json.loads((out / "train_report.json").read_text())

    mha = train(tmp_path / "mha", "--variant", "mha")
    gqa = train(tmp_path / "gqa", "--variant", "gqa", "--tokenizer", str(tmp_path / "mha"))
    again = train(tmp_path / "mha2", "--variant", "mha")
    for out, rep, kvh in ((tmp_path / "mha", mha, 4), (tmp_path / "gqa", gqa, 1)):
        for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json", "heldout_score.jsonl"):
            assert (out / f).is_file(), f
        assert REPORT_KEYS <= set(rep)
        cfg = json.loads((out / "config.json").read_text())
        assert cfg["num_key_value_heads"] == kvh and cfg["hidden_size"] == 64 and cfg["tie_word_embeddings"] is False
        assert "float16" in (str(cfg.get("dtype")), str(cfg.get("torch_dtype")))
        t = rep["training"]
        assert t["steps"] == 3 and t["tokens_seen"] == 3 * 4 * 64 and len(t["loss_curve"]) == 3
        assert math.isfinite(t["final_train_loss"]) and t["wall_time_s"] > 0 and t["tokens_per_s"] > 0
        for k in ("master_fp32", "checkpoint_fp32", "checkpoint_fp16"):
            ev = rep["heldout_eval"][k]
            if k == "checkpoint_fp16" and dev == "cpu" and "error" in ev:
                continue  # a CPU build without fp16 GEMMs: the error is recorded instead
            assert ev["tokens_scored"] == 4 * 63 and ev["perplexity"] > 1, (k, ev)
        assert rep["data"]["heldout_windows_scored"] == 4 <= rep["data"]["heldout_windows"]
        layers = rep["outliers"]["layers"]
        assert len(layers) == 2 and all(L["k_pre_rope"]["channels"] == kvh * 16 for L in layers)
        assert all({"ratio_max_over_median", "channels_over_4x_median"} <= set(L["v"]) for L in layers)
        sha = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
        assert rep["files"]["model.safetensors"]["sha256"] == sha
        assert rep["corpus"]["manifest_sha256"] == hashlib.sha256((corpus / "MANIFEST.json").read_bytes()).hexdigest()
        assert {"torch", "transformers", "tokenizers", "cuda", "gpu"} <= set(rep["versions"])
        lines = [json.loads(x) for x in (out / "heldout_score.jsonl").read_text().splitlines()]
        assert len(lines) == 2 and all(x["prompt"] == [1] and len(x["continuation"]) == 63 for x in lines)
        assert rep["score_workload"]["tokens"] == 126 and rep["score_workload"]["fp32"]["perplexity"] > 1
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "gqa"))
    ids = tok.encode("The kernel keeps a count.")
    assert ids[0] == 1 and ids[-1] != 2 and tok.eos_token_id == 2 and tok.unk_token_id == 0
    assert (tmp_path / "gqa/tokenizer.json").read_bytes() == (tmp_path / "mha/tokenizer.json").read_bytes()
    # the tokenizer is a function of train.txt: trained twice, the same file
    assert again["tokenizer"]["tokenizer_json_sha256"] == mha["tokenizer"]["tokenizer_json_sha256"]
    same = again["files"]["model.safetensors"]["sha256"] == mha["files"]["model.safetensors"]["sha256"]
    record_measurement(f"smoke mha trained twice on {dev}, seed 0: model.safetensors {'identical' if same else 'DIFFERENT'}; "
                       f"held-out ppl {mha['heldout_eval']['checkpoint_fp32']['perplexity']:.2f}")
    r = subprocess.run([sys.executable, str(TRAIN), "--corpus", str(corpus), "--out", str(tmp_path / "mha"), "--smoke",
                        "--variant", "mha", "--device", dev], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 2 and "--force" in r.stderr
