#!/usr/bin/env bash
# Build the training corpus of issue 44 (a small Llama trained here) from Debian documentation packages.
#
#   scripts/make-corpus.sh [--out DIR] [--debs DIR] [--offline] [--packages "P1 P2 ..."]
#                          [--heldout-permille N] [--max-train-chars N] [--min-heldout-chars N] [--jobs N]
#                          [--verify]
#
# Run on Debian 12 as root (or with the .debs at hand and --offline). Steps:
#   1. `apt-get download` the packages (default: perl-doc python3.11-doc linux-doc-6.1 postgresql-doc-15
#      manpages manpages-dev) into --debs (default data/debs/); --offline uses the .debs already there instead
#      (exactly one per package).
#   2. unpack each with `dpkg-deb -x` into a temporary folder.
#   3. scripts/corpus_text.py build: picks the English text files of each package (Perl .pod and module man
#      pages, Python's reST doc sources, the kernel's Documentation/*.rst, PostgreSQL's HTML manual, man pages
#      rendered by groff -Tutf8 -mandoc | col -bx), strips markup, drops code-heavy paragraphs and documents,
#      splits by document (sha256 of the file's path inside its package, --heldout-permille 25: ~2.5 % held
#      out; fails when under --min-heldout-chars, 300000, are held out; --max-train-chars 100000000 caps
#      train.txt, deterministically) and writes
#      --out/train.txt, heldout.txt and MANIFEST.json (packages with version and .deb sha256, every file
#      considered with its sha256, split or why it was dropped, and character counts; the corpus files'
#      sha256; tool versions; the date and this command). `scripts/corpus_text.py --help` has the details.
#   4. --out/corpus.tar.xz: train.txt, heldout.txt and MANIFEST.json, to carry to the GPU machine.
#
# Reproducible: the same .debs (same versions: MANIFEST.json records them and their sha256) and the same groff
# and Python give byte-identical train.txt and heldout.txt; MANIFEST.json differs only in its date and command,
# corpus.tar.xz through it. --verify builds the text a second time from the same unpacked files into a
# temporary folder and fails unless train.txt and heldout.txt come out byte-identical.
# groff and col are required (no fallback: the text must not depend on which tools a machine happens to have).
#
# Exit status: 0 done, 2 bad arguments or a missing tool / package, 1 anything else that failed.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
OUT="$REPO/data/corpus"
DEBS="$REPO/data/debs"
PACKAGES="perl-doc python3.11-doc linux-doc-6.1 postgresql-doc-15 manpages manpages-dev"
OFFLINE=0
VERIFY=0
PERMILLE=25
MAXCHARS=100000000
MINHELD=300000
JOBS=""
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
ORIG_CMD="scripts/make-corpus.sh${*:+ $*}"

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; }
die() { echo "make-corpus.sh: $*" >&2; exit 2; }
need_value() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"; }
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }

while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --out) need_value "$@"; OUT=$2; shift 2 ;;
    --debs) need_value "$@"; DEBS=$2; shift 2 ;;
    --packages) need_value "$@"; PACKAGES=$2; shift 2 ;;
    --offline) OFFLINE=1; shift ;;
    --verify) VERIFY=1; shift ;;
    --heldout-permille) need_value "$@"; is_uint "$2" || die "--heldout-permille wants an integer, got '$2'"; PERMILLE=$2; shift 2 ;;
    --max-train-chars) need_value "$@"; is_uint "$2" || die "--max-train-chars wants an integer, got '$2'"; MAXCHARS=$2; shift 2 ;;
    --min-heldout-chars) need_value "$@"; is_uint "$2" || die "--min-heldout-chars wants an integer, got '$2'"; MINHELD=$2; shift 2 ;;
    --jobs) need_value "$@"; is_uint "$2" && [ "$2" -ge 1 ] || die "--jobs wants an integer >= 1, got '$2'"; JOBS=$2; shift 2 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

for tool in dpkg-deb groff col xz tar sha256sum "$PY"; do
  command -v "$tool" >/dev/null 2>&1 || die "'$tool' not found (Debian: apt-get install dpkg groff-base bsdextrautils xz-utils tar coreutils python3)"
done
[ "$OFFLINE" = 1 ] || command -v apt-get >/dev/null 2>&1 || die "apt-get not found: give --offline with the .debs in --debs"

mkdir -p "$OUT" "$DEBS"
OUT=$(cd "$OUT" && pwd)
DEBS=$(cd "$DEBS" && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/make-corpus.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# 1. the .debs
if [ "$OFFLINE" = 0 ]; then
  echo "make-corpus.sh: downloading $PACKAGES into $DEBS" >&2
  # a fresh folder per run, so that an older version left in --debs is never picked up
  mkdir -p "$TMP/dl"
  # shellcheck disable=SC2086  # the package list is split on purpose
  (cd "$TMP/dl" && apt-get download -q -o APT::Sandbox::User=root $PACKAGES) >&2 \
    || die "apt-get download $PACKAGES failed (network? package names? apt-get update?)"
  for p in $PACKAGES; do rm -f "$DEBS/${p}_"*.deb; done
  mv "$TMP/dl/"*.deb "$DEBS/"
fi
: > "$TMP/packages.tsv"
for p in $PACKAGES; do
  shopt -s nullglob
  debs=("$DEBS/${p}_"*.deb)
  shopt -u nullglob
  [ ${#debs[@]} -eq 1 ] || die "want exactly one ${p}_*.deb in $DEBS, found ${#debs[@]}$([ "$OFFLINE" = 1 ] && echo ' (--offline: put them there first)')"
  deb=${debs[0]}
  name=$(dpkg-deb -f "$deb" Package) || die "$deb: not a .deb"
  [ "$name" = "$p" ] || die "$deb holds package '$name', not '$p'"
  version=$(dpkg-deb -f "$deb" Version)
  sha=$(sha256sum "$deb" | cut -d' ' -f1)
  printf '%s\t%s\t%s\t%s\n' "$p" "$version" "$(basename "$deb")" "$sha" >> "$TMP/packages.tsv"
  # 2. unpack
  mkdir -p "$TMP/x/$p"
  dpkg-deb -x "$deb" "$TMP/x/$p" || die "dpkg-deb -x $deb failed"
  echo "make-corpus.sh: $p $version (${sha:0:12}...) unpacked" >&2
done

# 3. the text
build() {
  "$PY" "$HERE/corpus_text.py" build --root "$TMP/x" --packages "$TMP/packages.tsv" --out "$1" \
    --heldout-permille "$PERMILLE" --max-train-chars "$MAXCHARS" --min-heldout-chars "$MINHELD" ${JOBS:+--jobs "$JOBS"} --command "$ORIG_CMD"
}
build "$OUT"
if [ "$VERIFY" = 1 ]; then
  echo "make-corpus.sh: --verify: building the text a second time" >&2
  build "$TMP/again"
  for f in train.txt heldout.txt; do
    cmp -s "$OUT/$f" "$TMP/again/$f" || { echo "make-corpus.sh: --verify: $f differs between two builds" >&2; exit 1; }
  done
  echo "make-corpus.sh: --verify: train.txt and heldout.txt byte-identical over two builds" >&2
fi

# 4. the archive for the GPU machine
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$OUT" -cf - train.txt heldout.txt MANIFEST.json \
  | xz -9 -T1 > "$OUT/corpus.tar.xz.part"
mv "$OUT/corpus.tar.xz.part" "$OUT/corpus.tar.xz"
for f in train.txt heldout.txt MANIFEST.json corpus.tar.xz; do
  printf '%12d bytes  %s  %s\n' "$(stat -c %s "$OUT/$f")" "$(sha256sum "$OUT/$f" | cut -d' ' -f1)" "$OUT/$f"
done
