"""A run record's folder digest (``r2m.utils.reads.path_digests``) walks the folder a file at a time: what it
holds beyond the stat cache does not grow with the number of files (a prepared folder of 123,287 images)."""

from __future__ import annotations

import hashlib
import json
import tracemalloc
from pathlib import Path

from r2m.utils.digest import tree_digest
from r2m.utils.reads import path_digests


def _folder(root: Path, n: int) -> Path:
    f = root / "data" / "imgs"
    (f / "sub").mkdir(parents=True)
    for i in range(n):
        (f / f"im{i:05d}.png").write_bytes(b"png %d" % i)
    (f / "sub" / "b.txt").write_bytes(b"bee")
    (f / ".hidden").write_bytes(b"skipped")
    return f


def test_folder_digest_is_the_hand_computed_tree_digest(tmp_path):
    f = _folder(tmp_path, 3)
    # worked out here: sha256 over one JSON line [relative path, bytes, sha256] per file, sorted, hidden skipped
    h = hashlib.sha256()
    for rel, data in (("im00000.png", b"png 0"), ("im00001.png", b"png 1"), ("im00002.png", b"png 2"),
                      ("sub/b.txt", b"bee")):
        h.update(json.dumps([rel, len(data), hashlib.sha256(data).hexdigest()]).encode())
    cache = tmp_path / "cache.json"
    got = path_digests(tmp_path, ["data/imgs", "data/imgs/sub/b.txt", "data/gone"], cache)
    assert got == {"data/imgs": "tree:" + h.hexdigest(), "data/imgs/sub/b.txt": hashlib.sha256(b"bee").hexdigest(),
                   "data/gone": "missing"}
    assert got["data/imgs"] == "tree:" + tree_digest(f)
    # the stat cache holds one entry per file (b.txt once, though named twice); a second pass rewrites nothing
    entries = json.loads(cache.read_text())
    assert len(entries) == 4
    before = cache.stat().st_mtime_ns
    assert path_digests(tmp_path, ["data/imgs"], cache) == {"data/imgs": got["data/imgs"]}
    assert cache.stat().st_mtime_ns == before
    # a changed file is read again and its entry rewritten
    (f / "im00001.png").write_bytes(b"changed")
    assert path_digests(tmp_path, ["data/imgs"], cache)["data/imgs"] != got["data/imgs"]
    assert json.loads(cache.read_text())[str((f / "im00001.png").resolve())][2] == hashlib.sha256(b"changed").hexdigest()


def test_folder_digest_holds_no_more_than_the_stat_cache(tmp_path):
    _folder(tmp_path, 3000)
    cache = tmp_path / "cache.json"
    path_digests(tmp_path, ["data/imgs"], cache)  # fills the cache
    tracemalloc.start()
    json.loads(cache.read_text())  # what reading the cache alone costs at its peak
    cache_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    tracemalloc.start()
    path_digests(tmp_path, ["data/imgs"], cache)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # a list of the 3,001 paths and their records would add about as much again as the cache
    assert peak < 1.1 * cache_peak + 64 * 1024, (peak, cache_peak)


def test_data_digest_is_sha256_of_the_sorted_json_text_written_by_hand():
    """The one digest of a JSON value: keys sorted, compact, or ``spaced`` as the digests stored before it
    (done files, resume fingerprints, the ``inputs`` stage's) were written — the texts here typed by hand,
    so a change of serialisation, which would change every stored digest, fails."""
    from r2m.utils.digest import data_digest

    value = {"b": [1, "é"], "a": None}
    assert data_digest(value) == hashlib.sha256(b'{"a":null,"b":[1,"\\u00e9"]}').hexdigest()
    assert data_digest(value, spaced=True) == hashlib.sha256(b'{"a": null, "b": [1, "\\u00e9"]}').hexdigest()
    assert data_digest({"p": Path("x/y")}, default=str) == hashlib.sha256(b'{"p":"x/y"}').hexdigest()
