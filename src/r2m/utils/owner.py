"""Who may write where: the one check every command that writes a file or folder goes through, before any work.

**Kinds.** Each writer has a kind: ``stage:<name>`` (a stage's declared outputs, written under :func:`owned_as`
by the stage runner), ``gallery`` (``r2m caption --html``), ``bench:<name>`` (``r2m bench <name> --out``),
``evaluate`` (``r2m evaluate --out``), ``dag`` (``r2m dag --write``), :data:`ANY_KIND` (r2m code run outside a
command, e.g. a test).

**Markers.** A folder r2m writes whole holds :data:`OWNER_MARK`: its kind and the size and SHA-256 of each file
(:func:`mark_owned`). A single file a command other than a stage writes (``evaluate --out``) has the same
record beside it, ``.<name>.r2m-owned.json`` (:func:`mark_file`). A marker vouches only for the files it
lists with the content it lists: a file it does not list, or one whose bytes differ, makes the folder the
user's. Nothing else in a marker counts (an older r2m's ``filling`` flag included).

**The check** (:func:`write_problem`, :func:`claim`), by kind, for a folder or a file at ``path``:

- the path is not empty and no parent of it is a file;
- no folder above it holds a marker of another kind (a gallery is never put inside a model folder);
- outside its declared outputs a command never writes into a workspace's own files (``params.yaml``,
  ``dvc.yaml``, ``Snakefile``, ``.r2m/``...) nor onto a path a stage declares (:func:`reserve`: the
  registry's output templates), below any folder holding a ``params.yaml``;
- a folder that exists is replaced only when it holds no file, or its marker names the same kind and lists
  every file it holds, unchanged (:func:`ownership_problem`); a stage adopts its own declared folder that an
  older r2m wrote (:func:`adoptable`);
- a file that exists is replaced only by the command that wrote it (its marker beside it, unchanged), or by
  the stage that declares it; a folder is never replaced by a file.

Anything else is refused with one line (:class:`NotOwned`) and nothing is touched. A scratch workspace a
command makes for its own runs (``r2m bench scale``) holds :data:`WORKSPACE_MARK` with the digest of the
``params.yaml`` it wrote (:func:`mark_workspace`, :func:`workspace_problem`): a command works only in a
workspace it made, unchanged.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from r2m.utils.guard import BadInput

OWNER_MARK = ".r2m-owned.json"
WORKSPACE_MARK = ".r2m-workspace.json"
ENGINE_FILES = frozenset({".snakemake_timestamp"})  # what a workflow engine adds to a folder output
ANY_KIND = "r2m"  # the kind of a folder r2m code writes outside a command that names one (a test, a library call)
_KIND: contextvars.ContextVar[str] = contextvars.ContextVar("r2m_owner_kind", default=ANY_KIND)
# a workspace's own files and folders (relative to a folder holding params.yaml): never a command's output
WORKSPACE_FILES = ("params.yaml", "dvc.yaml", "dvc.lock", "Snakefile", ".gitignore", ".dvcignore")
WORKSPACE_DIRS = (".r2m", ".stamps", ".snakemake", ".dvc", ".git", "src", "workflow", "logs")
_RESERVED: list[tuple[re.Pattern[str], ...]] = []  # the stages' declared output paths (:func:`reserve`)


def file_digest(path: str | Path, algo: str = "sha256", chunk: int = 1 << 20) -> str:
    """Hex digest of a file, read in chunks (markers, weights, downloads, checkpoints)."""
    h = hashlib.new(algo)
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


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
    if kind.startswith("bench:"):
        return f"the output of r2m bench {kind.removeprefix('bench:')}"
    if kind == "gallery":
        return "a gallery of r2m caption --html"
    if kind == "dag":
        return "the dvc.yaml r2m dag --write generates"
    if kind == "evaluate":
        return "the metrics of r2m evaluate --out"
    if kind == "screenshot":
        return "a screenshot of python -m r2m.reports.browser"
    if kind == ANY_KIND:
        return "a folder r2m code wrote outside any command"
    return f"an r2m output of kind {kind!r}"


class NotOwned(BadInput):
    """A path r2m would write, delete or replace but did not make (or that changed since): one line naming it."""


# --------------------------------------------------------------------------- markers
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
    """What a marker records of one file: ``[size, sha256]`` (a link: ``["link", target]``)."""
    if path.is_symlink():
        return ["link", os.readlink(path)]
    return [path.stat().st_size, file_digest(path)]


def _write_marker(mark: Path, doc: dict[str, Any]) -> Path:
    tmp = mark.with_name(f"{mark.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=0, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, mark)
    return mark


def mark_owned(folder: str | Path, kind: str | None = None, keep_record: bool = False) -> Path:
    """Write the ownership marker into ``folder``: its ``kind`` (default: :func:`current_kind`) and every
    file below it with its size and SHA-256 (``keep_record``: the file list of the marker already there)."""
    folder = Path(folder)
    record = _marker_doc(folder)["files"] if keep_record else {rel: _entry(folder / rel) for rel in _files(folder)}
    return _write_marker(folder / OWNER_MARK, {"by": "r2m", "kind": kind or current_kind(), "files": record})


def file_mark(path: str | Path) -> Path:
    """Where the marker of the single file ``path`` lives: ``.<name>.r2m-owned.json`` beside it."""
    path = Path(path)
    return path.with_name(f".{path.name}{OWNER_MARK}")


def mark_file(path: str | Path, kind: str) -> Path:
    """Record the file ``path`` (size, SHA-256) as written by a command of ``kind`` (:func:`file_mark`)."""
    path = Path(path)
    return _write_marker(file_mark(path), {"by": "r2m", "kind": kind, "files": {path.name: _entry(path)}})


def _marker_doc(folder: Path, mark: Path | None = None) -> dict[str, Any]:
    """``folder``'s ownership marker (or the marker file ``mark``); ValueError when it is missing, unreadable
    or not r2m's."""
    mark = folder / OWNER_MARK if mark is None else mark
    try:
        doc = json.loads(mark.read_text(encoding="utf-8"))
        assert isinstance(doc, dict) and doc.get("by") == "r2m"
        assert isinstance(doc.get("kind", ""), str)
    except (OSError, ValueError, AssertionError) as err:
        raise ValueError(f"{mark}: not a readable ownership marker") from err
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


# --------------------------------------------------------------------------- the writer check
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


def reserve(templates: Iterable[str]) -> None:
    """Declare the stages' output paths (an ``{axis}`` placeholder matches within one path part): inside a
    workspace, no command but the stage writes onto one, below one, or (a folder) above one (the registry
    calls this with every stage's outputs)."""
    for t in templates:
        parts = tuple(re.compile("[^/]+".join(re.escape(x) for x in re.split(r"\{[^}/]+\}", part)))
                      for part in t.split("/"))
        if parts not in _RESERVED:
            _RESERVED.append(parts)


def _clashes(rel: str, folder: bool) -> bool:
    """``rel`` (a POSIX path inside a workspace) is a stage's declared output or below one, or (``folder``)
    a folder above one."""
    parts = rel.split("/")
    for template in _RESERVED:
        if (folder or len(parts) >= len(template)) and all(
                t.fullmatch(p) for t, p in zip(template, parts, strict=False)):
            return True
    return False


def _workspaces(path: Path) -> Iterator[Path]:
    """The folders above ``path`` (absolute) that are workspaces: they hold a ``params.yaml``."""
    for folder in path.parents:
        if (folder / "params.yaml").is_file():
            yield folder


def _foreign_above(path: Path, kind: str) -> str | None:
    """Why ``path`` lies inside a folder another kind owns (its marker names another kind), or None."""
    for folder in path.parents:
        if not (folder / OWNER_MARK).exists():
            continue
        try:
            made = _marker_doc(folder).get("kind")
        except ValueError:
            return f"it is inside {folder}, whose ownership marker is unreadable; give a path outside it"
        if made != kind:
            return f"it is inside {folder}, {describe_kind(made) if made else 'an r2m output'}; give a path outside it"
    return None


def _workspace_problem(path: Path, folder: bool) -> str | None:
    """Why ``path`` is a workspace's own file or a stage's declared output in a workspace above it, or None."""
    for ws in _workspaces(path):
        rel = path.relative_to(ws).as_posix()
        top = rel.split("/")[0]
        if rel in WORKSPACE_FILES or top in WORKSPACE_DIRS:
            return f"it is {'' if rel == top else 'inside '}{ws / top}, a workspace's own; give a path outside it"
        if _clashes(rel, folder):
            return (f"it is, holds or is inside a stage's output in the workspace {ws} (r2m --help lists what each "
                    "stage writes); give a path outside them")
    return None


def _file_owned(path: Path, kind: str) -> str | None:
    """Why the existing file ``path`` may not be replaced by a command of ``kind`` (None: its marker says
    that command wrote it, and its content is unchanged)."""
    mark = file_mark(path)
    if not mark.is_file():
        return (f"exists and was not written by {describe_kind(kind)} (no {mark.name} beside it), so r2m will not "
                "replace it; give a new file name")
    try:
        doc = _marker_doc(path.parent, mark)
    except ValueError:
        return f"its ownership marker {mark.name} is unreadable; r2m will not replace it"
    if doc.get("kind") != kind:
        return f"is {describe_kind(str(doc.get('kind')))}, not {describe_kind(kind)}; give a new file name"
    if (doc.get("files") or {}).get(path.name) != _entry(path):
        return "changed since r2m wrote it, so r2m will not replace it; move it away, or give a new file name"
    return None


def write_problem(path: str | Path, kind: str, *, folder: bool, declared: bool = False,
                  adopt: Iterable[str] = ("params.yaml",), ours: Any = None) -> str | None:
    """Why a command of ``kind`` may not write ``path`` — a folder it writes whole (``folder``) or a file —
    or None (the rules: the module's docstring). ``declared``: the path is a stage's own declared output
    (the registry's); ``adopt``: its signature files (:func:`adoptable`); ``ours(path)``: whether an existing
    file is one the command wrote although it has no marker beside it (``dvc.yaml``'s header)."""
    problem = output_path_problem(path)
    if problem:
        return problem
    path = Path(path)
    full = Path(os.path.abspath(path))
    problem = _foreign_above(full, kind)
    if problem is None and not declared:
        problem = _workspace_problem(full, folder)
    if problem:
        return problem
    if path.is_symlink() and not declared:  # a stage's file output may be DVC's link into its cache
        return "is a link; r2m writes no output through a link: give another path"
    if folder:
        if declared and path.is_dir() and adoptable(path, adopt):
            return None
        problem = ownership_problem(path, kind)
        return problem and problem.removeprefix(str(path)).strip(" :")
    if path.is_dir():
        return "is a folder, where a file is written; r2m does not replace it: move it away, or give a file name"
    if path.exists() and not path.is_file() and not path.is_symlink():
        return "exists and is not a regular file (a FIFO, socket or device); give another path"
    if path.exists() and not (ours(path) if ours is not None else declared):
        return _file_owned(path, kind)
    return None


def claim(path: str | Path, kind: str, what: str, *, folder: bool, declared: bool = False, ours: Any = None) -> Path:
    """:func:`write_problem` for a command's output named by the option ``what`` (``--out``): NotOwned, one
    line naming the option and the path, before any work; else the path."""
    problem = write_problem(path, kind, folder=folder, declared=declared, ours=ours)
    if problem:
        raise NotOwned(f"{what} {path}: {problem}")
    return Path(path)


# --------------------------------------------------------------------------- scratch workspaces
def mark_workspace(ws: str | Path, kind: str) -> Path:
    """Mark ``ws`` as a workspace a command of ``kind`` made, with the digest of its ``params.yaml`` now."""
    ws = Path(ws)
    doc = {"by": "r2m", "kind": kind, "params_sha256": file_digest(ws / "params.yaml")}
    return _write_marker(ws / WORKSPACE_MARK, doc)


def workspace_problem(ws: str | Path, kind: str) -> str | None:
    """Why a command of ``kind`` may not work in the existing workspace ``ws`` (None: it made it, and its
    ``params.yaml`` is the one it wrote)."""
    ws = Path(ws)
    if not ws.is_dir():
        return "no such folder"
    mark = ws / WORKSPACE_MARK
    try:
        doc = _marker_doc(ws, mark)
    except ValueError:
        return (f"not a workspace {describe_kind(kind).removeprefix('the output of ')} made (no readable "
                f"{WORKSPACE_MARK}); r2m works only in a workspace it made")
    if doc.get("kind") != kind:
        return f"a workspace of {doc.get('kind')!r}, not of {kind!r}"
    params = ws / "params.yaml"
    if not params.is_file() or file_digest(params) != doc.get("params_sha256"):
        return "its params.yaml is not the one r2m wrote there (changed or gone); r2m works only in a workspace it made"
    return None
