"""Content digests of files and folders, with a stat cache so that unchanged files are not re-read.

Used where a result must be tied to the bytes it was made from: the ``inputs`` stage (the files a
dataset entry names outside the DAG, :mod:`r2m.datasets.inputs`) and the resume fingerprint of the
training stages (:func:`r2m.training.loop.fingerprint`: the corpus, vocabulary, features… a
resumed run must have been trained on). A cache file maps each file's resolved path to its size,
mtime and SHA-256; a file whose size and mtime match is not read again.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from r2m.utils.guard import BadInput, not_a_file
from r2m.utils.io import file_digest, write_json


def expand(paths: Iterable[Path]) -> list[Path]:
    """Files of ``paths``, folders walked recursively (sorted; hidden entries skipped); paths that
    do not exist are kept (:func:`digest_files` records them as missing)."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                out += [Path(root) / f for f in sorted(files) if not f.startswith(".") and not _special(Path(root) / f)]
        else:
            out.append(p)
    return out


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


def digest_files(files: Iterable[Path], cache_path: Path | None = None) -> list[dict[str, Any]]:
    """``[{"path", "bytes", "sha256"}]`` per file (``{"path", "missing": true}`` for an absent one)."""
    cache = _read_cache(cache_path)
    fresh: dict[str, Any] = {}
    out = []
    for f in files:
        try:
            st = f.stat()
        except OSError:
            out.append({"path": str(f), "missing": True})
            continue
        if not stat.S_ISREG(st.st_mode):  # named on its own: refused (reading it would block or never end)
            raise BadInput(f"{f}: {not_a_file(f) or 'not a regular file'}; name a file")
        key = str(f.resolve())
        hit = cache.get(key)
        same = isinstance(hit, list) and len(hit) == 3 and hit[0] == st.st_size and hit[1] == st.st_mtime_ns
        digest = hit[2] if same else file_digest(f)
        fresh[key] = [st.st_size, st.st_mtime_ns, digest]
        out.append({"path": str(f), "bytes": st.st_size, "sha256": digest})
    if cache_path is not None:
        try:
            write_json(cache_path, {**cache, **fresh}, indent=None)
        except OSError:  # a read-only checkout: digests are still right, only slower next time
            pass
    return out


def tree_digest(path: Path, cache_path: Path | None = None) -> str:
    """One SHA-256 over a file or folder: every file's path relative to ``path``, size and content."""
    path = Path(path)
    h = hashlib.sha256()
    for rec in digest_files(expand([path]), cache_path):
        rel = Path(rec["path"]).relative_to(path).as_posix() if path.is_dir() else path.name
        h.update(json.dumps([rel, rec.get("bytes"), rec.get("sha256")]).encode())
    return h.hexdigest()
