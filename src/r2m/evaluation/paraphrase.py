"""METEOR's English paraphrase table cut down to the entries a set of segments can use.

METEOR 1.5 spends ~7 CPU-seconds of every start reading ``paraphrase-en.gz`` (5.3 million entries,
272 MB of text) into its ``ParaphraseTransducer``: a trie over each entry's first phrase whose
leaves point at the second phrase, both as word ids. The paraphrase module matches an entry only
where its first phrase is a run of words of one sentence and its second phrase a run of words of
the other, compared as word ids (``ParaphraseMatcher``; a sentence word absent from the table gets
id -1 and never matches). So an entry with a word that no segment contains can never match, and
the table restricted to the other entries, **in their original order**, yields the same matches in
the same order: byte for byte the same statistics and scores (``tests/test_meteor_paraphrase.py``
checks that against the full table).

Which words METEOR sees is decided by its own normaliser (``-norm``), so the filter keeps every
entry whose words all lie in a superset of them: every substring of every whitespace token of the
segments (the normaliser only splits tokens there), in the given case and lower-cased, plus the
punctuation tokens the normaliser can write itself. That superset argument holds for ASCII letters,
digits, spaces and ``' - . , /``; a segment with any other character (quotes, ``&``, non-ASCII…)
makes :func:`words_superset` answer ``None`` and METEOR loads the full table as before.

The filter reads an index of the table built once per machine (~13 CPU-seconds, 1.5 GB at peak,
134 MB on disk) under the r2m cache (``$R2M_CACHE`` or ``~/.cache/r2m``,
``meteor-paraphrase/v<version>-<size>-<mtime>/``; a file lock makes concurrent jobs wait for one
build): the table's words, and each entry's word ids as flat arrays, so that a job only marks its
words and keeps the entries with no unmarked word (~0.3 CPU-seconds). Where no index can be had
(cache unwritable, a damaged index) METEOR loads the full table, with one warning.
"""

from __future__ import annotations

import gc
import gzip
import logging
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

log = logging.getLogger("r2m")

SAFE = re.compile(r"[A-Za-z0-9 '\-.,/]*")
# tokens METEOR's normaliser may write that are not substrings of its input (quote and dash
# normalisation, multi-dot placeholders restored as dots)
NORMALISER_TOKENS = ('"', "'", "''", "`", "``", "-", "--", ".", "..", "...", ",")
INDEX_VERSION = "1"


def table_path() -> Path:
    """pycocoevalcap's ``meteor/data/paraphrase-en.gz`` (the jar's default English table)."""
    from pycocoevalcap.meteor import meteor as m

    return Path(m.__file__).resolve().parent / "data" / "paraphrase-en.gz"


def words_superset(segments: Iterable[str]) -> set[bytes] | None:
    """Every word METEOR's normaliser can make of ``segments`` (UTF-8 bytes), or ``None`` when a
    segment holds a character outside :data:`SAFE` (then no superset is claimed)."""
    out: set[bytes] = {t.encode() for t in NORMALISER_TOKENS}
    tokens: set[str] = set()
    for text in segments:
        if not SAFE.fullmatch(text):
            return None
        tokens.update(text.split())
    tokens |= {t.lower() for t in tokens}  # each distinct token once (its substrings are many)
    for token in tokens:
        n = len(token)
        out.update(token[a:b].encode() for a in range(n) for b in range(a + 1, n + 1))
    return out


# --------------------------------------------------------------------------- the index
def _index_dir(table: Path) -> Path:
    from r2m.vision.downloads import cache_root

    st = table.stat()
    return cache_root() / "meteor-paraphrase" / f"v{INDEX_VERSION}-{st.st_size}-{st.st_mtime_ns}"


def _build(table: Path, folder: Path) -> None:
    """Parse the table once into ``words.txt`` (id order), ``tokens.npy`` (each entry's first then
    second phrase, word ids), ``starts.npy`` (entry k's tokens are ``starts[k]:starts[k+1]``),
    ``first.npy`` (the first phrase's length) and ``probs.npy`` (each entry's first line, a
    probability METEOR reads past)."""
    from array import array

    data = gzip.decompress(table.read_bytes())
    if b"\r" in data or b"\x0b" in data:  # Java's readLine splits at \r; StringTokenizer keeps \v in a word
        raise ValueError(f"{table}: line breaks this index does not model")
    lines = data.split(b"\n")
    del data
    if lines and lines[-1] == b"":
        lines.pop()
    if len(lines) % 3:
        raise ValueError(f"{table}: {len(lines)} lines, not entries of three")
    ids: dict[bytes, int] = {}
    tokens, starts, first = array("i"), array("q", [0]), array("H")
    gc.disable()  # millions of short-lived lists: the cyclic collector would rescan them all (~2x slower)
    try:
        for k in range(0, len(lines), 3):
            one, two = lines[k + 1].split(), lines[k + 2].split()  # bytes.split: no \r, \v here (above)
            tokens.extend([ids.setdefault(w, len(ids)) for w in one + two])
            starts.append(len(tokens))
            first.append(len(one))
    finally:
        gc.enable()
    probs = np.array([float(p) for p in lines[0::3]], dtype=np.float64)
    del lines
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "words.txt").write_bytes(b"\n".join(ids))
    np.save(folder / "probs.npy", probs)
    np.save(folder / "tokens.npy", np.frombuffer(tokens, dtype=np.int32).astype(
        np.uint16 if len(ids) <= 1 << 16 else np.int32))
    np.save(folder / "starts.npy", np.frombuffer(starts, dtype=np.int64).astype(np.uint32))
    np.save(folder / "first.npy", np.frombuffer(first, dtype=np.uint16))


def index(table: Path | None = None) -> Path:
    """The index folder of ``table`` (default :func:`table_path`), built on first use."""
    import fcntl
    import shutil
    import tempfile

    table = table or table_path()
    folder = _index_dir(table)
    if (folder / "first.npy").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build; the others wait for it
        if not (folder / "first.npy").exists():
            log.info("METEOR: indexing its paraphrase table once (~13 CPU-seconds) into %s", folder)
            tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=folder.parent))
            try:
                _build(table, tmp)
                os.replace(tmp, folder)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return folder


def write_filtered(words: set[bytes], out: Path, table: Path | None = None) -> int:
    """Write to ``out`` (gzip, METEOR's three-line format, original order) the entries of the
    table whose words are all in ``words``; returns how many."""
    folder = index(table)
    vocab = (folder / "words.txt").read_bytes().split(b"\n")
    known = np.zeros(len(vocab), dtype=bool)
    position = dict(zip(vocab, range(len(vocab)), strict=True))
    marked = [position[w] for w in words if w in position]
    known[marked] = True
    tokens = np.load(folder / "tokens.npy", mmap_mode="r")
    starts = np.load(folder / "starts.npy").astype(np.int64)
    unknown = np.append(~known[tokens], False)  # a sentinel: reduceat needs a valid index per entry
    bad = np.logical_or.reduceat(unknown, starts[:-1]) & (starts[1:] > starts[:-1])  # empty: no word
    keep = np.flatnonzero(~bad)
    first = np.load(folder / "first.npy", mmap_mode="r")
    probs = np.load(folder / "probs.npy", mmap_mode="r")
    parts = []
    for k in keep.tolist():
        row = [vocab[t] for t in tokens[starts[k]:starts[k + 1]].tolist()]
        cut = int(first[k])
        parts.append(b"%r\n%s\n%s\n" % (float(probs[k]), b" ".join(row[:cut]), b" ".join(row[cut:])))
    with gzip.open(out, "wb", compresslevel=1) as fh:
        fh.write(b"".join(parts))
    return len(keep)


def filtered_table(hypotheses: Sequence[str], references: Sequence[Sequence[str]], out: Path) -> Path | None:
    """A table at ``out`` for these segments, or ``None`` (the full table must be used)."""
    words = words_superset([*hypotheses, *(r for refs in references for r in refs)])
    if words is None:
        return None
    try:
        write_filtered(words, out)
    except (OSError, ValueError) as err:  # no index here (cache unwritable, disk full…): the full table
        log.warning("METEOR: scoring with the full paraphrase table (%s)", err)
        return None
    return out
