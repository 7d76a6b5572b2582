"""Atomic output helpers: every stage writes through these so a crash never leaves a half
output that looks complete.

Ownership (one rule for every folder r2m replaces or empties): a folder r2m writes whole gets a
marker file :data:`OWNER_MARK` listing each file it wrote with its size and SHA-256
(:func:`mark_owned`). r2m deletes or replaces an existing folder only when it is empty, or holds
that marker and still holds exactly what the marker lists, unchanged (:func:`ownership_problem`);
anything else — a folder without the marker (the user's, or made by an older r2m), a file added
to it, a file edited in it — is refused with one line naming the folder (:class:`NotOwned`), and
nothing is deleted. :func:`replace_folder` empties a folder a stage then fills in place (its marker
says so until :func:`mark_owned` records the files).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from r2m.utils.guard import BadInput

OWNER_MARK = ".r2m-owned.json"
ENGINE_FILES = frozenset({".snakemake_timestamp"})  # what a workflow engine adds to a folder output


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it over ``path`` only on success.

    Works for files and for directories (write a whole directory under the yielded path).
    A folder written this way gets the ownership marker (:func:`mark_owned`); an existing folder at
    ``path`` is replaced only when r2m owns it (:func:`check_owned`, before the work and again before
    the rename; refused then, the new output is left in the temporary folder, named in the error).
    """
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        check_owned(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix or ".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    tmp_path.unlink()
    try:
        yield tmp_path
        if tmp_path.is_dir():
            mark_owned(tmp_path)
    except BaseException:
        _discard(tmp_path)
        raise
    if path.is_dir() and not path.is_symlink():
        check_owned(path, f"; this run's output is kept in {tmp_path}")
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


class NotOwned(BadInput):
    """A folder r2m would delete or replace but did not make (or that changed since): one line naming it."""


def _files(folder: Path) -> list[str]:
    """Every file (and link) below ``folder`` but the marker and the engine's timestamp, as sorted
    POSIX paths relative to it."""
    out = []
    for root, dirs, files in os.walk(folder):
        rel = Path(root).relative_to(folder)
        out += [(rel / f).as_posix() for f in files]
        out += [(rel / d).as_posix() for d in dirs if (Path(root) / d).is_symlink()]  # not walked into
    return sorted(f for f in out if f != OWNER_MARK and f not in ENGINE_FILES)


def _entry(path: Path) -> list[Any]:
    """What the marker records of one file: ``[size, sha256]`` (a link: ``["link", target]``)."""
    if path.is_symlink():
        return ["link", os.readlink(path)]
    return [path.stat().st_size, file_digest(path)]


def mark_owned(folder: str | Path, files: bool = True) -> Path:
    """Write the ownership marker into ``folder``: every file below it with its size and SHA-256
    (``files=False``: a folder a stage is still filling in place; it records no files)."""
    folder = Path(folder)
    record = {rel: _entry(folder / rel) for rel in _files(folder)} if files else None
    mark = folder / OWNER_MARK
    mark.write_text(json.dumps({"by": "r2m", "files": record}, indent=0, sort_keys=True) + "\n", encoding="utf-8")
    return mark


def _marker_record(folder: Path) -> dict[str, Any] | None:
    """The files ``folder``'s ownership marker lists (None: a folder filled in place); ValueError when the
    marker is missing, unreadable or not r2m's."""
    try:
        doc = json.loads((folder / OWNER_MARK).read_text(encoding="utf-8"))
        record = doc["files"]
        assert doc.get("by") == "r2m" and (record is None or isinstance(record, dict))
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as err:
        raise ValueError(f"{folder / OWNER_MARK}: not a readable ownership marker") from err
    return record


def marker_mismatch(folder: str | Path) -> str | None:
    """What differs from ``folder``'s ownership marker by a ``stat`` alone (a listed file missing or of
    another size), for a check on every use; the SHA-256s are :func:`ownership_problem`'s. None when the
    folder has no readable marker."""
    folder = Path(folder)
    try:
        record = _marker_record(folder) or {}
    except ValueError:
        return None
    for rel, entry in sorted(record.items()):
        path = folder / rel
        if not path.exists() and not path.is_symlink():
            return f"{path} is missing"
        if isinstance(entry, list) and entry and isinstance(entry[0], int) and path.is_file() \
                and path.stat().st_size != entry[0]:
            return f"{path} changed size since it was written"
    return None


def ownership_problem(folder: str | Path) -> str | None:
    """Why r2m may not delete or replace ``folder``, or None (absent, empty, or r2m's and unchanged)."""
    folder = Path(folder)
    if not folder.exists() and not folder.is_symlink():
        return None
    if folder.is_symlink() or not folder.is_dir():
        return f"{folder} exists and is not a folder r2m made (a {'link' if folder.is_symlink() else 'file'})"
    present = _files(folder)
    mark = folder / OWNER_MARK
    if not mark.is_file():
        if not present:
            return None
        return (f"{folder} exists and was not made by r2m (it has no {OWNER_MARK} marker), so r2m will not delete "
                "or replace it; move it away, or give another folder")
    try:
        record = _marker_record(folder)
    except ValueError:
        return f"{folder}: unreadable ownership marker {OWNER_MARK}; r2m will not delete or replace the folder"
    if record is None:  # a folder a stage fills in place (replace_folder)
        return None
    extra = [f for f in present if f not in record]
    if extra:
        return (f"{folder} holds files r2m did not write ({', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}), "
                "so r2m will not delete or replace it; move them away, or give another folder")
    for rel in present:
        if _entry(folder / rel) != record[rel]:
            return (f"{folder}: {rel} changed since r2m wrote it, so r2m will not delete or replace the folder; "
                    "move it away, or give another folder")
    return None


def check_owned(folder: str | Path, note: str = "") -> None:
    """:class:`NotOwned` (one line, ``note`` appended) unless r2m may delete or replace ``folder``."""
    problem = ownership_problem(folder)
    if problem:
        raise NotOwned(problem + note)


def adopt_stage_outputs(folders: Iterable[str | Path]) -> list[Path]:
    """Mark as r2m's (a marker without a file list) the folders among a stage's declared outputs that
    an r2m older than the marker wrote: no marker, and the ``params.yaml`` every stage writes into its
    output folders. Only declared outputs (paths the registry derives from checked names, never a
    user's choice) are adopted, so a workspace made before the marker keeps working under DVC (whose
    ``persist`` outputs r2m replaces itself). Returns the folders adopted."""
    adopted = []
    for folder in map(Path, folders):
        if (folder.is_dir() and not folder.is_symlink() and not (folder / OWNER_MARK).exists()
                and (folder / "params.yaml").is_file()):
            mark_owned(folder, files=False)
            adopted.append(folder)
    return adopted


def replace_folder(folder: str | Path, empty: bool = True) -> Path:
    """Empty ``folder`` (only when r2m owns it, :func:`check_owned`; ``empty=False``: keep what it
    holds) or create it, for a stage that fills it in place; its marker records no files until
    :func:`mark_owned` is called at the end (or the folder is replaced whole by :func:`atomic_path`)."""
    folder = Path(folder)
    check_owned(folder)
    if empty and folder.is_dir():
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    mark_owned(folder, files=False)
    return folder


def write_text(path: str | Path, text: str) -> Path:
    """``text`` into the file ``path`` atomically; a folder in the way is an error, never replaced
    (``r2m evaluate --out photos``, a folder named ``dvc.yaml``: its files were deleted)."""
    if Path(path).is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a folder, not replaced by a file", str(path))
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


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


def file_digest(path: str | Path, algo: str = "sha256", chunk: int = 1 << 20) -> str:
    """Hex digest of a file, read in chunks (weights, downloads, checkpoints)."""
    import hashlib

    h = hashlib.new(algo)
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


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
