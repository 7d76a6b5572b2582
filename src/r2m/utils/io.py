"""Atomic output helpers: every stage writes through these so a crash never leaves a half
output that looks complete.

Ownership (one rule for every folder r2m replaces or empties): a folder r2m writes whole gets a
marker file :data:`OWNER_MARK` naming its KIND — what made it: ``stage:<name>`` (a stage's declared
output, written under :func:`owned_as` by the stage runner), ``gallery`` (``r2m caption --html``),
:data:`ANY_KIND` (r2m code run outside a command, e.g. a test) — and listing each file it wrote with
its size and SHA-256 (:func:`mark_owned`). r2m deletes or replaces an existing folder only when it
holds no file, or its marker names the same kind as the command about to replace it, lists every
file the folder holds, and each is unchanged (:func:`ownership_problem`). Anything else is refused
with one line naming the folder (:class:`NotOwned`) and nothing is deleted: a folder without the
marker (the user's), a marker of another kind (a gallery never replaces a model folder), a marker
naming no kind (an older r2m's: which command made it is unknown), a marker without a file list
(``"files": null``), a file added to the folder or edited in it. The one exception is
:func:`adopt_stage_outputs`: a stage's own declared output folder that an older r2m wrote (its
``params.yaml`` present, and every file listed and unchanged when it has a marker) becomes that
stage's. :func:`replace_folder` empties a folder a stage then fills in place (its marker lists what
it kept until :func:`mark_owned` records the files). :func:`output_path_problem`: an output path
whose parent is a file, refused before any work.
"""

from __future__ import annotations

import contextlib
import contextvars
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
ANY_KIND = "r2m"  # the kind of a folder r2m code writes outside a command that names one (a test, a benchmark)
_KIND: contextvars.ContextVar[str] = contextvars.ContextVar("r2m_owner_kind", default=ANY_KIND)


def stage_kind(stage: str) -> str:
    """The ownership kind of a stage's outputs: ``stage:<name>``."""
    return f"stage:{stage}"


@contextlib.contextmanager
def owned_as(kind: str) -> Iterator[None]:
    """Folders written (and replaced) inside this block are of ``kind`` (the stage runner: ``stage:<name>``)."""
    token = _KIND.set(kind)
    try:
        yield
    finally:
        _KIND.reset(token)


def current_kind() -> str:
    return _KIND.get()


def describe_kind(kind: str) -> str:
    """``stage:train_i`` -> "the output of stage train_i" (for the refusals)."""
    if kind.startswith("stage:"):
        return f"the output of stage {kind.removeprefix('stage:')}"
    if kind == "gallery":
        return "a gallery of r2m caption --html"
    if kind == ANY_KIND:
        return "a folder r2m code wrote outside any command"
    return f"an r2m folder of kind {kind!r}"


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str | None = None, kind: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it over ``path`` only on success.

    Works for files and for directories (write a whole directory under the yielded path).
    A folder written this way gets the ownership marker (:func:`mark_owned`); an existing folder at
    ``path`` is replaced only when r2m owns it (:func:`check_owned`, before the work and again before
    the rename; refused then, the new output is left in the temporary folder, named in the error).
    ``kind``: the folder's ownership kind (default: :func:`current_kind`).
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


def mark_owned(folder: str | Path, kind: str | None = None, keep_record: bool = False,
               filling: bool = False) -> Path:
    """Write the ownership marker into ``folder``: its ``kind`` (default: :func:`current_kind`) and every
    file below it with its size and SHA-256 (``keep_record``: the file list of the marker already there).
    ``filling``: the folder is being filled in place by a command of ``kind`` (:func:`replace_folder`),
    which may take it up again after a crash or preemption (resumable work keeps its parts there)."""
    folder = Path(folder)
    mark = folder / OWNER_MARK
    if keep_record:
        record = _marker_doc(folder)["files"]
    else:
        record = {rel: _entry(folder / rel) for rel in _files(folder)}
    doc: dict[str, Any] = {"by": "r2m", "kind": kind or current_kind(), "files": record}
    if filling:
        doc["filling"] = True
    mark.write_text(json.dumps(doc, indent=0, sort_keys=True) + "\n", encoding="utf-8")
    return mark


def _marker_doc(folder: Path) -> dict[str, Any]:
    """``folder``'s ownership marker; ValueError when it is missing, unreadable or not r2m's."""
    try:
        doc = json.loads((folder / OWNER_MARK).read_text(encoding="utf-8"))
        assert isinstance(doc, dict) and doc.get("by") == "r2m"
        assert isinstance(doc.get("kind", ""), str)
    except (OSError, ValueError, AssertionError) as err:
        raise ValueError(f"{folder / OWNER_MARK}: not a readable ownership marker") from err
    return doc


def _marker_record(folder: Path) -> dict[str, Any] | None:
    """The files ``folder``'s ownership marker lists (None: it lists none, ``"files"`` missing or not a
    mapping); ValueError when the marker is missing, unreadable or not r2m's."""
    record = _marker_doc(folder).get("files")
    return record if isinstance(record, dict) else None


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


def _listing_problem(folder: Path, record: dict[str, Any] | None, present: list[str]) -> str | None:
    """Why the marker's file list does not cover ``folder``'s files unchanged, or None."""
    if record is None:
        return (f"{folder}: its ownership marker {OWNER_MARK} lists no files, so everything in the folder is "
                "protected and r2m will not delete or replace it; move it away, or give another folder")
    extra = [f for f in present if f not in record]
    if extra:
        return (f"{folder} holds files its ownership marker does not list ({', '.join(extra[:3])}"
                f"{', ...' if len(extra) > 3 else ''}), so r2m will not delete or replace it; move them away, "
                "or give another folder")
    for rel in present:
        if _entry(folder / rel) != record[rel]:
            return (f"{folder}: {rel} changed since r2m wrote it, so r2m will not delete or replace the folder; "
                    "move it away, or give another folder")
    return None


def ownership_problem(folder: str | Path, kind: str | None = None) -> str | None:
    """Why a command of ``kind`` (default: :func:`current_kind`) may not delete or replace ``folder``, or
    None: absent, holding no file, or marked as of ``kind`` with every file listed and unchanged."""
    folder = Path(folder)
    kind = kind or current_kind()
    if not folder.exists() and not folder.is_symlink():
        return None
    if folder.is_symlink() or not folder.is_dir():
        return f"{folder} exists and is not a folder r2m made (a {'link' if folder.is_symlink() else 'file'})"
    present = _files(folder)
    if not present:  # nothing in it to lose (an empty folder, a marker alone)
        return None
    if not (folder / OWNER_MARK).is_file():
        return (f"{folder} exists and was not made by r2m (it has no {OWNER_MARK} marker), so r2m will not delete "
                "or replace it; move it away, or give another folder")
    try:
        doc = _marker_doc(folder)
    except ValueError:
        return f"{folder}: unreadable ownership marker {OWNER_MARK}; r2m will not delete or replace the folder"
    made = doc.get("kind")
    if not made:
        return (f"{folder}: its ownership marker names no kind (an older r2m wrote it), so which command made the "
                f"folder is unknown and r2m will not delete or replace it as {describe_kind(kind)}; move it "
                "away, or give another folder")
    if made != kind:
        return (f"{folder} is {describe_kind(made)}, not {describe_kind(kind)}: r2m replaces a folder only by "
                "the command that made it; give another folder")
    if doc.get("filling") is True:  # the same command stopped while filling it: it takes up its own parts
        return None
    return _listing_problem(folder, _marker_record(folder), present)


def check_owned(folder: str | Path, note: str = "", kind: str | None = None) -> None:
    """:class:`NotOwned` (one line, ``note`` appended) unless a command of ``kind`` may delete or replace
    ``folder`` (:func:`ownership_problem`)."""
    problem = ownership_problem(folder, kind)
    if problem:
        raise NotOwned(problem + note)


def adoptable(folder: str | Path, signature: Iterable[str] = ("params.yaml",)) -> bool:
    """Whether ``folder``, a stage's declared output, is one an r2m older than the ownership kinds wrote: it
    holds a ``signature`` file (the ``params.yaml`` most stages write into their output folders:
    :attr:`r2m.stage.spec.Out.adopt`), and it has no marker (an r2m older than the marker) or a marker
    naming no kind that lists every file (a signature file among them), each unchanged."""
    folder = Path(folder)
    signature = tuple(signature)
    if not folder.is_dir() or folder.is_symlink() or not any((folder / f).is_file() for f in signature):
        return False
    if not (folder / OWNER_MARK).exists():
        return True
    try:
        doc = _marker_doc(folder)
    except ValueError:
        return False
    record = _marker_record(folder)
    return (not doc.get("kind") and record is not None and any(f in record for f in signature)
            and _listing_problem(folder, record, _files(folder)) is None)


def stage_output_problem(folder: str | Path, stage: str, signature: Iterable[str] = ("params.yaml",)) -> str | None:
    """Why stage ``stage`` may not replace its declared output folder ``folder`` (None: it may, possibly
    after :func:`adopt_stage_outputs`)."""
    return None if adoptable(folder, signature) else ownership_problem(folder, stage_kind(stage))


def adopt_stage_outputs(folders: Iterable[str | Path | tuple[str | Path, Iterable[str]]],
                        kind: str | None = None) -> list[Path]:
    """Mark as of ``kind`` (default: :func:`current_kind`; the runner's is ``stage:<name>``) the folders among
    a stage's declared outputs that an older r2m wrote (:func:`adoptable`; a folder may come with its
    signature files, ``(folder, signature)``): without a marker, every file is listed now; with a marker
    naming no kind, its list is kept. Only declared outputs (paths the registry derives from checked names,
    never a user's choice) are adopted, so a workspace made by an older r2m keeps working under both engines.
    Returns the folders adopted."""
    adopted = []
    for item in folders:
        folder, signature = (Path(item[0]), item[1]) if isinstance(item, tuple) else (Path(item), ("params.yaml",))
        if adoptable(folder, signature):
            mark_owned(folder, kind, keep_record=(folder / OWNER_MARK).exists())
            adopted.append(folder)
    return adopted


def replace_folder(folder: str | Path, empty: bool = True, kind: str | None = None) -> Path:
    """Empty ``folder`` (only when a command of ``kind`` may, :func:`check_owned`; ``empty=False``: keep what
    it holds) or create it, for a stage that fills it in place. Its marker says ``filling`` until
    :func:`mark_owned` is called at the end (or the folder is replaced whole by :func:`atomic_path`): a run
    stopped halfway leaves a folder that the same command (the same kind) takes up again — resumable work
    keeps its parts there — and that every other command refuses."""
    folder = Path(folder)
    check_owned(folder, kind=kind)
    if empty and folder.is_dir():
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    mark_owned(folder, kind, filling=True)
    return folder


def output_path_problem(path: str | Path) -> str | None:
    """Why nothing can be written at ``path``: it is empty, or a parent of it is a file (or a link to
    one), not a folder; None otherwise. Checked before any work."""
    text = str(path)
    if not text.strip():
        return "an empty path; give a file or folder name"
    for parent in Path(path).parents:
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                what = "a link to no folder" if parent.is_symlink() else "a file"
                return f"its parent {parent} is {what}, not a folder"
            return None
    return None


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
