"""Atomic output helpers: every stage writes through these so a crash never leaves a half
output that looks complete (a temporary file or folder beside the target, renamed over it on success);
JSON, text, Parquet and HDF5 helpers with one-line errors naming the file.

Whether a folder may be replaced, and the marker a folder gets, are the ownership policy's
(:mod:`r2m.utils.owner`): :func:`atomic_path` asks it before the work and again before the rename.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from r2m.utils.owner import check_owned, current_kind, file_digest, mark_owned

__all__ = ["atomic_path", "file_digest", "json_depth", "not_utf8", "open_h5", "read_json", "write_json",
           "write_parquet", "write_text"]


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str | None = None, kind: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it over ``path`` only on success.

    Works for files and for directories (write a whole directory under the yielded path).
    A folder written this way gets the ownership marker (:func:`r2m.utils.owner.mark_owned`); an existing
    folder at ``path`` is replaced only when r2m owns it (:func:`r2m.utils.owner.check_owned`, before the work
    and again before the rename; refused then, the new output is left in the temporary folder, named in the
    error). ``kind``: the folder's ownership kind (default: :func:`r2m.utils.owner.current_kind`).
    """
    path = Path(path)
    kind = kind or current_kind()
    if path.is_dir() and not path.is_symlink():
        check_owned(path, kind=kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix or ".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    tmp_path.unlink()
    try:
        yield tmp_path
        if tmp_path.is_dir():
            mark_owned(tmp_path, kind=kind)
    except BaseException:
        _discard(tmp_path)
        raise
    if path.is_dir() and not path.is_symlink():
        check_owned(path, f"; this run's output is kept in {tmp_path}", kind=kind)
        shutil.rmtree(path)
    try:
        os.replace(tmp_path, path)
    except BaseException:
        _discard(tmp_path)
        raise


def _discard(tmp_path: Path) -> None:
    if tmp_path.is_dir():
        shutil.rmtree(tmp_path, ignore_errors=True)
    elif tmp_path.exists() or tmp_path.is_symlink():
        tmp_path.unlink()


def write_text(path: str | Path, text: str) -> Path:
    """``text`` into the file ``path`` atomically; a folder in the way is an error, never replaced
    (``r2m evaluate --out photos``, a folder named ``dvc.yaml``: its files were deleted)."""
    if Path(path).is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a folder, not replaced by a file", str(path))
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_text_if_changed(path: str | Path, text: str) -> bool:
    """:func:`write_text` unless ``path`` holds ``text`` already (its modification time then stays); True: written."""
    try:
        if Path(path).read_text() == text:
            return False
    except OSError:
        pass
    write_text(path, text)
    return True


def write_json(path: str | Path, obj: Any, indent: int | None = 2) -> Path:
    return write_text(path, json.dumps(obj, indent=indent, sort_keys=False) + "\n")


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json`` keeps the last of a key given twice; we refuse it (which one was meant is unknown)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"key {key!r} given twice in one object")
        out[key] = value
    return out


# lists and objects inside each other: the project's JSON inputs nest 3 to 5 deep; Python's own parser stops
# at about 1,000 with a RecursionError naming no file, and readers walking a deep document fail later still
MAX_JSON_DEPTH = 100
_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKETS)
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1
_JSON_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def json_depth(raw: bytes) -> int:
    """How deep the lists and objects of the JSON text ``raw`` nest (brackets inside strings not counted)."""
    from itertools import accumulate

    brackets = raw.translate(None, _NOT_BRACKETS)
    if brackets.count(b"[") + brackets.count(b"{") <= MAX_JSON_DEPTH:
        return 1 if brackets else 0  # a bound, enough to say "not too deep"
    depth = max(accumulate(map(_STEP.__getitem__, brackets)), default=0)
    if depth <= MAX_JSON_DEPTH:
        return depth
    # brackets inside strings may have counted: the exact depth, strings skipped (only for suspicious files)
    tokens = (m[0] for m in _JSON_TOKEN.finditer(raw) if m[0][:1] != b'"')
    return max(accumulate(_STEP[t[0]] for t in tokens), default=0)


def read_json(path: str | Path) -> Any:
    """The JSON document at ``path``; every error is one line naming the file (a key given twice in
    one object, too large an integer, nesting deeper than :data:`MAX_JSON_DEPTH`, not UTF-8 and
    invalid JSON included)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        depth = json_depth(raw)
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"{path}: lists and objects nested {depth} deep (at most {MAX_JSON_DEPTH}); "
                             "not an input of this project")
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except FileNotFoundError:
        raise FileNotFoundError(f"missing input file: {path}") from None
    except UnicodeDecodeError as err:
        raise ValueError(not_utf8(path, err)) from None
    except RecursionError:  # unreachable after the depth check; kept so no reader ever sees it
        raise ValueError(f"{path}: nested too deep to read") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: line {err.lineno}: not valid JSON ({err.msg})") from None
    except ValueError as err:  # a duplicate key, an integer of > 4300 digits, not UTF-8
        if str(err).startswith(f"{path}: "):
            raise
        raise ValueError(f"{path}: not usable JSON ({' '.join(str(err).split())})") from None


def not_utf8(path: str | Path, err: UnicodeDecodeError) -> str:
    """One line naming a file that is not UTF-8, the first bad byte and its offset."""
    bad = err.object[err.start:err.start + 1].hex()
    return f"{path} is not UTF-8 (byte 0x{bad} at offset {err.start}); save it as UTF-8"


def open_h5(path: str | Path) -> Any:
    """``h5py.File(path, "r")``; a truncated or corrupt file is a one-line ValueError naming it."""
    import h5py

    try:
        return h5py.File(path, "r")
    except FileNotFoundError:
        raise FileNotFoundError(f"missing input file: {path}") from None
    except OSError as err:
        why = " ".join(str(err).split())[:160]
        raise ValueError(f"{path}: unreadable HDF5 file (truncated or corrupt: {why}); rerun the stage "
                         "that writes it") from None


def write_parquet(path: str | Path, table: Any) -> Path:
    """Write a pandas DataFrame or pyarrow Table atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not isinstance(table, pa.Table):
        table = pa.Table.from_pandas(table, preserve_index=False)
    with atomic_path(path, suffix=".parquet") as tmp:
        pq.write_table(table, tmp)
    return Path(path)
