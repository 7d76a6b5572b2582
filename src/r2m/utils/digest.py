"""Content digests of files and folders, with a stat cache so that unchanged files are not re-read.

Used where a result must be tied to the bytes it was made from: the ``inputs`` stage (the files a
dataset entry names outside the DAG, :mod:`r2m.datasets.inputs`) and the resume fingerprint of the
training stages (:func:`r2m.training.loop.fingerprint`: the corpus, vocabulary, features… a
resumed run must have been trained on). A cache file maps each file's resolved path to its size,
modification and change times and SHA-256; a file whose size and both times match is not read again (a
``touch -r`` can put an mtime back, never a ctime).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from r2m.utils.guard import BadInput, not_a_file
from r2m.utils.io import file_digest, write_json


def expand(paths: Iterable[Path]) -> list[Path]:
    """Files of ``paths``, folders walked recursively (sorted; hidden entries skipped); paths that
    do not exist are kept (:func:`digest_files` records them as missing)."""
    return [f for p in paths for f in walk(p)]


def walk(path: Path) -> Iterator[Path]:
    """:func:`expand` of one path, a file at a time (a folder of 123,287 images is never a list)."""
    if path.is_dir():
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for f in sorted(files):
                if not f.startswith(".") and not _special(Path(root) / f):
                    yield Path(root) / f
    else:
        yield path


def _special(path: Path) -> bool:
    """A FIFO, socket or device (or a link to one) in a walked folder: no dataset reads it (the
    folder recipe lists regular files only) and reading it would block (a FIFO) or never end (a
    link to /dev/zero)."""
    try:
        return not stat.S_ISREG(path.stat().st_mode)
    except OSError:  # a broken link: kept, recorded as missing
        return False


def _read_cache(path: Path | None) -> dict[str, Any]:
    if path is None or not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def data_digest(data: Any, *, spaced: bool = False, default: Callable[[Any], Any] | None = None) -> str:
    """SHA-256 of plain JSON data, keys sorted: the one digest of a JSON value. Compact (no spaces) unless
    ``spaced``: ``json.dumps``'s default separators (``", "``, ``": "``), the form done files, resume
    fingerprints and the ``inputs`` stage's digests were first stored in, kept so that no stored digest
    changes. ``default``: ``json.dumps``'s, for values JSON has no form for (``str``)."""
    separators = (", ", ": ") if spaced else (",", ":")
    text = json.dumps(data, sort_keys=True, separators=separators, default=default)
    return hashlib.sha256(text.encode()).hexdigest()


PARSED = (".json", ".yaml", ".yml")  # data files digested by what they say (see :func:`parsed_digest`)


def parsed_digest(path: Path, view: Callable[[Any], Any] | None = None) -> str | None:
    """SHA-256 of a JSON/YAML file's parsed content (re-serialised, key order kept): a comment, spacing
    or quoting style changes nothing, a changed value or order does. ``view``: of what it returns of the
    parsed content instead (the part a reader reads). None when it does not parse (the bytes then count;
    the reader reports the error)."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
        if view is not None:
            data = view(data)
        canon = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
    except (OSError, ValueError, RecursionError, yaml.YAMLError):
        return None
    return hashlib.sha256(canon.encode()).hexdigest()


class StatCache:
    """The stat cache of :func:`digest_files`, read once; :meth:`record` digests one file (read again only
    when its size or mtime changed), :meth:`save` writes the cache back when an entry changed. Only the
    changed entries are held apart from the cache read, so one record at a time costs no memory per file."""

    def __init__(self, path: Path | None, parsed: bool = False,
                 view: tuple[str, Callable[[Any], Any]] | None = None) -> None:
        self.path, self.parsed, self.view = path, parsed or view is not None, view
        self.cache = _read_cache(path)
        self.fresh: dict[str, Any] = {}

    def record(self, f: Path) -> dict[str, Any]:
        """``{"path", "bytes", "sha256"}`` (or ``{"path", "<how>_sha256"}``, ``{"path", "missing": true}``)."""
        view = self.view
        try:
            st = f.stat()
        except OSError:
            return {"path": str(f), "missing": True}
        if not stat.S_ISREG(st.st_mode):  # named on its own: refused (reading it would block or never end)
            raise BadInput(f"{f}: {not_a_file(f) or 'not a regular file'}; name a file")
        how = (view[0] if view else "parsed") if self.parsed and f.suffix.lower() in PARSED else "bytes"
        key = os.path.realpath(f)
        hit = self.fresh.get(key) or self.cache.get(key)
        # size, modification and change time: `touch -r` restores an mtime, never a ctime
        if isinstance(hit, list) and len(hit) == 5 and hit[:2] == [st.st_size, st.st_mtime_ns] \
                and hit[3] == how and hit[4] == st.st_ctime_ns:
            digest = hit[2]
        else:
            digest = parsed_digest(f, view[1] if view else None) if how != "bytes" else None
            if digest is None:  # bytes asked for, or a file that does not parse: its bytes count
                how, digest = "bytes", file_digest(f)
        entry = [st.st_size, st.st_mtime_ns, digest, how, st.st_ctime_ns]
        if self.cache.get(key) != entry:
            self.fresh[key] = entry
        return ({"path": str(f), f"{how}_sha256": digest} if how != "bytes"
                else {"path": str(f), "bytes": st.st_size, "sha256": digest})

    def save(self) -> None:
        if self.path is not None and self.fresh:
            self.cache.update(self.fresh)  # the order of {**cache, **fresh}
            self.fresh = {}
            try:
                write_json(self.path, self.cache, indent=None)
            except OSError:  # a read-only checkout: digests are still right, only slower next time
                pass


def digest_files(files: Iterable[Path], cache_path: Path | None = None, parsed: bool = False,
                 view: tuple[str, Callable[[Any], Any]] | None = None) -> list[dict[str, Any]]:
    """``[{"path", "bytes", "sha256"}]`` per file (``{"path", "missing": true}`` for an absent one).
    ``parsed``: a JSON/YAML file that parses is ``{"path", "parsed_sha256"}`` (:func:`parsed_digest`)
    instead, so an edit that changes nothing it says changes nothing recorded. ``view`` ``(name, fn)``
    (implies ``parsed``): ``{"path", "<name>_sha256"}``, the digest of ``fn`` of the parsed content."""
    cache = StatCache(cache_path, parsed, view)
    out = [cache.record(f) for f in files]
    cache.save()
    return out


def tree_digest(path: Path, cache_path: Path | None = None) -> str:
    """One SHA-256 over a file or folder: every file's path relative to ``path``, size and content."""
    path = Path(path)
    h = hashlib.sha256()
    for rec in digest_files(expand([path]), cache_path):
        h.update(tree_line(path, rec))
    return h.hexdigest()


def tree_line(path: Path, rec: dict[str, Any]) -> bytes:
    """What one file (its :func:`digest_files` record) adds to :func:`tree_digest` of ``path``."""
    rel = Path(rec["path"]).relative_to(path).as_posix() if path.is_dir() else path.name
    return json.dumps([rel, rec.get("bytes"), rec.get("sha256") or rec.get("parsed_sha256")]).encode()
