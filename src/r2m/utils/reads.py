"""What a run read, recorded while it runs: project modules, files inside and outside the project,
resources handed to a subprocess, the installed distributions it imported, params per key and the runtime
settings it used.

A :class:`Recorder` is one listener on the process's audit hook (:mod:`r2m.utils.audit`) for the events
``open``, ``subprocess.Popen``, ``os.exec`` and ``os.posix_spawn``. Each path is named once (cached):

* inside the project (a ``project`` root: the workspace and the code's checkout): relative to the
  workspace (``src/r2m/text/vocab.py``, ``data/demo/corpus.txt``); the run's own outputs (``exclude``),
  ``.r2m/``, ``.git``/``.snakemake``/``.dvc``, ``logs/``, hidden files and ``__pycache__`` are ignored;
* inside the Python installation: a data file (a spaCy table, a scorer's jar, weights shipped in a wheel)
  as ``site:<path inside site-packages>`` or ``prefix:<path inside sys.prefix>`` — relocatable, a rebuilt
  virtual environment names it alike; code and package metadata there are covered by the distributions'
  versions instead (below), the interpreter's own library by its version;
* anywhere else (a folder dataset's images, an external word list or weights file, code imported from
  outside): its absolute path; the system's own files (:data:`SYSTEM`: ``/proc``, ``/etc``, programs and
  libraries under ``/usr`` …) are ignored.

A file opened for reading is a ``file`` entry, one opened for writing is never an input (even when read
back); an argument of a program started (a path, or a ``:``-separated class path) that names a file or folder
is an ``exec`` entry (the METEOR jar, its ``.java`` helper, a paraphrase table). Every module in
``sys.modules`` at the end whose file lies in the project (or outside the installation) is a ``module`` entry,
however it was imported (``import``, ``importlib``, a registry's load by name); every other one names its
installed distribution, a ``dist`` entry (``dist:torch``, its version), and the interpreter is one
``python`` entry. In a warm server's fork this includes what the server preloaded (an over-reach, never a
miss).

A structured file read through a *view* (:func:`read_view`: a function of the file naming only the fields the
reader uses, :data:`VIEWS`) is a ``view`` entry, ``view:<view>:<file name>`` with the digest of the view's data,
instead of a ``file`` entry: an edit of a field no view of it names (a photo's description) stales nothing.

Params: :meth:`Recorder.watch_params` maps a pydantic model tree to dotted prefixes, and while recording
each read of a leaf field (``params.caption.beam``, an extra item of a catalog entry, a whole
``options`` dict) is a ``params`` entry with its value; a ``model_dump`` of a watched model reads every
leaf below it. A key looked up and not found (an option a catalog entry does not set) is recorded as
``absent`` (or with the default the reader took, :func:`note_item`), so adding it stales exactly its
readers. :func:`unrecorded` pauses the params watch (the resolved params saved beside the outputs are
bookkeeping, not a read). :func:`note_runtime` records a runtime setting the run used (threads, device,
numeric switches: :class:`r2m.runtime.Runtime`).

Each event costs one dict lookup in the hook for events nobody listens to; the listener decides
"which name?" once per path string (cached). Digests are taken at the end
(:meth:`Recorder.finish`), through the stat cache (:class:`r2m.utils.digest.StatCache`, keyed on size,
modification and change times), a folder a file at a time.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from r2m.utils import audit
from r2m.utils.digest import data_digest

EVENTS = ("open", "subprocess.Popen", "os.exec", "os.posix_spawn")
# the system's own files outside the Python installation: kernel views, configuration, programs and libraries,
# time zones and fonts (what they hold changes with the machine, as the CPU does; docs/ARCHITECTURE.md)
SYSTEM = ("/proc/", "/dev/", "/sys/", "/run/", "/etc/", "/bin/", "/sbin/", "/lib/", "/lib32/", "/lib64/",
          "/usr/bin/", "/usr/sbin/", "/usr/lib/", "/usr/lib32/", "/usr/lib64/", "/usr/libexec/", "/usr/share/zoneinfo/",
          "/usr/share/locale/", "/usr/share/fonts/", "/var/cache/", "/var/lib/")
# code and package metadata inside the installation: covered by the distributions' versions
_CODE_SUFFIXES = (".py", ".pyc", ".pyo", ".pyi", ".so", ".pyd", ".pth", ".dylib")
_CODE_PARTS = (".dist-info/", ".egg-info/", "/__pycache__/")
# folders whose files are never a run's input: state, caches, engines' own, logs
IGNORED_TOP = frozenset({".r2m", ".git", ".snakemake", ".dvc", "logs", ".venv", ".stamps", ".pytest_cache"})
FORMAT = 2  # the record's format version (2: distributions, interpreter, outside files, runtime, outputs)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
ABSENT = "absent"  # the value field of a params key looked up and not found
# views of structured files (read_view): name -> "module:function", a function of the file's path returning the JSON
# data its readers use of it; kept beside the code that reads the file (a stage that reads through a view records
# that module, so an edit of the view reruns it)
VIEWS: dict[str, str] = {"demo_photos": "r2m.datasets.demo:photo_sources"}
VIEW = "view:"  # a view entry's name: view:<view>:<file name>


def _is_code(p: str) -> bool:
    """A module, compiled extension or package metadata file (``libfoo.so.1`` too)."""
    return p.endswith(_CODE_SUFFIXES) or ".so." in p.rsplit("/", 1)[-1] or any(part in p for part in _CODE_PARTS)


def site_dirs() -> tuple[str, ...]:
    """The installation's package folders (``site-packages``/``dist-packages`` on ``sys.path``), longest first."""
    import site

    found = [*getattr(site, "getsitepackages", list)(), getattr(site, "getusersitepackages", lambda: "")()]
    found += [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))]
    return tuple(sorted({os.path.realpath(p) for p in found if p and os.path.isdir(p)}, key=len, reverse=True))


def interpreter() -> str:
    """The interpreter a run used: implementation and version (its standard library goes with it)."""
    import platform

    return f"{platform.python_implementation()} {platform.python_version()}"


_VOLATILE: tuple[str, ...] | None = None


def _volatile() -> tuple[str, ...]:
    """Caches of compiled kernels that libraries write and read back across runs (what they hold follows from
    the code and the versions recorded): string prefixes. Computed when a recorder is made, never inside the hook
    (``tempfile.gettempdir`` holds a lock while it opens files: asked from the hook, it would wait on itself)."""
    global _VOLATILE
    if _VOLATILE is None:
        tmp = next((os.environ[v] for v in ("TMPDIR", "TEMP", "TMP") if os.environ.get(v)), "/tmp")
        home = os.path.expanduser("~")
        _VOLATILE = (os.path.join(os.path.realpath(tmp), "torchinductor_"),
                     os.path.join(home, ".triton") + os.sep, os.path.join(home, ".cache", "torch", "kernels") + os.sep)
    return _VOLATILE


def resolve_name(root: Path | str, name: str) -> str | None:
    """The file a recorded name stands for now (``site:``/``prefix:`` in this installation, an absolute path as
    it is, anything else inside the workspace ``root``); None for a name that is no path (``dist:``, ``python:``)."""
    if name.startswith("site:"):
        rel = name[5:]
        dirs = site_dirs()
        for d in dirs:
            if os.path.exists(os.path.join(d, rel)):
                return os.path.join(d, rel)
        return os.path.join(dirs[0], rel) if dirs else None
    if name.startswith("prefix:"):
        return os.path.join(sys.prefix, name[7:])
    if name.startswith(("dist:", "python:")):
        return None
    return name if os.path.isabs(name) else os.path.join(os.fspath(root), name)


class _Installed:
    """The distributions on ``sys.path``, read from their metadata folders' names (``<name>-<version>.dist-info``;
    the first on the path wins, as for ``importlib.metadata``) and their ``top_level.txt`` files: a directory
    listing per path entry, no package's file list unless a module's distribution is found no other way
    (``importlib.metadata.packages_distributions`` reads every file list: seconds per job)."""

    def __init__(self) -> None:
        self.versions: dict[str, str] = {}  # normalised name -> version
        self.tops: dict[str, str] = {}  # top-level module -> normalised name (the first that names it)
        self.claims: dict[str, list[tuple[str, str]]] = {}  # top-level module -> every (name, folder) naming it
        self.no_top: list[tuple[str, str]] = []  # (name, metadata folder) without a top_level.txt
        for entry in sys.path:
            try:
                names = sorted(os.listdir(entry or "."))
            except OSError:
                continue
            for folder in names:
                if not folder.endswith((".dist-info", ".egg-info")):
                    continue
                stem = folder.rsplit(".", 1)[0]
                name, _, version = stem.partition("-")
                name = normalise(name)
                if name in self.versions:
                    continue
                self.versions[name] = version.split("-")[0] or "?"
                path = os.path.join(entry, folder)
                try:
                    with open(os.path.join(path, "top_level.txt"), encoding="utf-8") as fh:
                        for line in fh:
                            if line.strip():
                                self.tops.setdefault(line.strip(), name)
                                self.claims.setdefault(line.strip(), []).append((name, path))
                except OSError:
                    self.no_top.append((name, path))
        self.found: dict[str, str | None] = {}
        self.listed: dict[str, frozenset[str]] = {}

    def owner_of(self, rel: str) -> str | None:
        """The distribution that installed the file ``rel`` (relative to its package folder): the one distribution
        naming its top folder, else the one whose file list names it (a namespace such as ``nvidia/``)."""
        top = rel.split("/", 1)[0]
        claims = self.claims.get(top, [])
        if len(claims) == 1:
            return claims[0][0]
        if rel not in self.found:
            hit = next((name for name, path in [*claims, *self.no_top] if rel in self._files(path)), None)
            self.found[rel] = hit or self.owner(top)
        return self.found[rel]

    def _files(self, folder: str) -> frozenset[str]:
        """The files a distribution's ``RECORD`` lists (read once)."""
        if folder not in self.listed:
            try:
                with open(os.path.join(folder, "RECORD"), encoding="utf-8") as fh:
                    self.listed[folder] = frozenset(line.split(",", 1)[0] for line in fh)
            except OSError:
                self.listed[folder] = frozenset()
        return self.listed[folder]

    def owner(self, top: str) -> str | None:
        """The distribution of the top-level module ``top``: its ``top_level.txt``, a distribution of its name, else
        the file list of a distribution that has no ``top_level.txt``."""
        if top in self.tops:
            return self.tops[top]
        if top not in self.found:
            hit = normalise(top) if normalise(top) in self.versions else None
            for name, path in self.no_top if hit is None else ():
                try:
                    with open(os.path.join(path, "RECORD"), encoding="utf-8") as fh:
                        if any(line.startswith((f"{top}/", f"{top}.")) for line in fh):
                            hit = name
                            break
                except OSError:
                    continue
            self.found[top] = hit
        return self.found[top]


def mapped_files(under: tuple[str, ...]) -> list[str]:
    """The files this process has mapped (its shared libraries) below the folders ``under``; none where
    ``/proc/self/maps`` does not exist."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:  # noqa: PTH123 - not recorded: stopped
            paths = {line.split(None, 5)[5].strip() for line in fh if line.count(" ") >= 5 and "/" in line}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith(under))


def too_broad(real: str, bases: Iterable[str]) -> bool:
    """A folder that holds one of ``bases`` (the workspace, the code's checkout), or a top folder (``/``, ``/tmp``,
    ``/home/me``): handed to a program as a working place, never as what it computes from (its digest would walk
    everything below)."""
    if real.count(os.sep) > 2 and not any(b == real or b.startswith(real + os.sep) for b in bases):
        return False
    return os.path.isdir(real)


KINDS = ("module", "file", "exec", "dep", "dist", "python", "view")  # the kinds of a record's reads


def view_entry(view: str, name: str) -> str:
    """The name of a ``view`` entry: the file ``name`` (as records name files) read through ``view``."""
    return f"{VIEW}{view}:{name}"


def viewed(name: str) -> tuple[str, str] | None:
    """``(view, file name)`` of a ``view`` entry's name; None for any other name."""
    if not name.startswith(VIEW):
        return None
    view, sep, file = name[len(VIEW):].partition(":")
    return (view, file) if sep and view and file else None


def view_data(view: str, path: Path | str) -> Any:
    """What ``view`` reads of the file at ``path`` (its function imported now; an unknown view: KeyError)."""
    from r2m.utils.registry import load_target

    if view not in VIEWS:
        raise KeyError(f"unknown file view {view!r}; known: {', '.join(sorted(VIEWS))}")
    return load_target(VIEWS[view])(Path(path))


def view_digest(data: Any) -> str:
    """SHA-256 of a view's data as compact JSON (key order kept: a view gives its fields in its own order)."""
    try:
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
    except (TypeError, ValueError, RecursionError):  # keys JSON cannot write (a malformed file): its repr
        text = repr(data)
    return hashlib.sha256(text.encode()).hexdigest()


def read_view(path: Path | str, view: str) -> Any:
    """``view``'s data of the file at ``path``; the running instance's record names the file through the view
    (a ``view`` entry with the digest of that data), and not the file itself for the opens the view makes."""
    before = getattr(_paused, "files", False)
    _paused.files = True
    try:
        data = view_data(view, path)
    finally:
        _paused.files = before
    rec = _active
    if rec is not None and os.getpid() == rec._pid:
        rec.note_view(path, view, view_digest(data))
    return data


def normalise(name: str) -> str:
    """A distribution's name as packaging compares names (PEP 503)."""
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


_INSTALLED: _Installed | None = None


def installed(fresh: bool = False) -> _Installed:
    """The distributions on ``sys.path`` (read once per process; ``fresh``: again)."""
    global _INSTALLED
    if _INSTALLED is None or fresh:
        _INSTALLED = _Installed()
    return _INSTALLED


def distribution_of(module: str) -> str | None:
    """The installed distribution a module belongs to (``PIL`` -> ``pillow``), or None."""
    return installed().owner(module.split(".", 1)[0])


def dist_version(name: str) -> str:
    """``version:<version>`` of an installed distribution, ``missing`` when it is not installed."""
    version = installed().versions.get(normalise(name))
    return f"version:{version}" if version else "missing"


def note_runtime(name: str, value: Any) -> None:
    """Record that the running instance used the runtime setting ``name`` (its value as asked for)."""
    rec = _active
    if rec is not None and os.getpid() == rec._pid:
        rec.runtime.setdefault(name, value)


def value_digest(value: Any) -> str:
    """SHA-256 of a params value as JSON (keys sorted; a pydantic model as its dump)."""
    return data_digest(jsonable(value))


def jsonable(value: Any) -> Any:
    """A params value as plain JSON data (a pydantic model as its dump; anything else JSON lacks as text)."""
    from pydantic_core import to_jsonable_python

    return json.loads(json.dumps(to_jsonable_python(value), sort_keys=True, default=str))


def _is_model(value: Any) -> bool:
    return hasattr(type(value), "model_fields") and hasattr(value, "__pydantic_fields_set__")


def _is_branch(value: Any) -> bool:
    """A params model, or a mapping holding one (a catalog, per-model sections): not a leaf."""
    return _is_model(value) or (isinstance(value, dict) and any(_is_model(v) for v in value.values()))


# ------------------------------------------------------------------------------------ params watch
_active: Recorder | None = None  # the recording Recorder of this process (one at a time)
_paused = threading.local()
_NONE = object()
_ABSENT = object()  # a params key looked up and not found
# the open/exec events of a stage's module being imported, before its record starts (a library reading its data
# as it is imported: matplotlib its matplotlibrc), kept for the next Recorder that starts (:func:`import_reads`)
_early: list[tuple[str, tuple[Any, ...]]] = []


@contextmanager
def import_reads() -> Iterator[None]:
    """Keep what the code run inside opens and starts (a stage's module, imported before its recording starts):
    the :class:`Recorder` started next in this process records it as read while recording."""
    with audit.listening(EVENTS, lambda event, args: _early.append((event, args))):
        yield


def note_item(model: Any, suffix: tuple[str, ...], value: Any, default: Any = _NONE) -> None:
    """Record one item below a watched params model as read (a mapping's entry: ``per_model.sat``) where the
    code reads that item only; ``default``: its value when the mapping has no such entry (then recorded as
    read with that value, and compared so)."""
    rec = _active
    if rec is None or getattr(_paused, "on", False):
        return
    hit = rec._models.get(id(model))
    if hit is None or hit[0] is not model:
        return
    key = (*hit[1], *suffix)
    rec._note(key, value)
    if default is not _NONE:
        rec.defaults[key] = default


@contextmanager
def unrecorded() -> Iterator[None]:
    """Params read inside are not recorded (the saved resolved params, a resume fingerprint)."""
    before = getattr(_paused, "on", False)
    _paused.on = True
    try:
        yield
    finally:
        _paused.on = before


class Recorder:
    """Records what the code run between :meth:`start` and :meth:`finish` reads (see the module doc).

    ``root``: the workspace (paths are recorded relative to it); ``code``: the checkout whose
    ``src`` holds the package (often the same); ``exclude``: the run's own outputs and files not to
    count as inputs (the params file: its keys are recorded one by one)."""

    def __init__(self, root: Path, code: Path | None = None, exclude: Iterable[Path] = (),
                 skip_modules: Iterable[str] = ()) -> None:
        self.root = Path(root).resolve()
        self.code = (code or self.root).resolve()
        self.exclude = tuple(Path(p).resolve() for p in exclude)
        # modules that run an instance without deciding what it computes (the stage runner's own): not inputs
        self.skip_modules = tuple(m.removesuffix(".*") for m in skip_modules)  # "pkg.*": a package and below
        self._skip_below = tuple(m.removesuffix("*") for m in skip_modules if m.endswith(".*"))
        self._exclude_s = tuple(str(e) for e in self.exclude)
        # (folder, token) of the installation, most specific first: site-packages, the environment, the interpreter
        install = [(s, "site:") for s in site_dirs()]
        install += [(os.path.realpath(sys.prefix), "prefix:")]
        install += [(os.path.realpath(p), None) for p in {sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}]
        self._install = tuple(sorted(dict.fromkeys(install), key=lambda x: len(x[0]), reverse=True))
        self._volatile = _volatile()  # here, not in the hook (see _volatile)
        self.runtime: dict[str, Any] = {}  # runtime settings used (note_runtime)
        # (folder, paths below it recorded relative?): resolved and as given (a checkout reached through a link)
        given = [(str(self.root), True), (os.path.abspath(root), True), (str(self.code), False),
                 (os.path.abspath(code or root), False)]
        self._bases_s = tuple(dict.fromkeys(given))
        self.files: dict[str, str] = {}  # path -> "file" | "exec" (in the order first read)
        # the declared inputs (files or folders): compiled readers (pyarrow, h5py) open files unseen
        self.deps: list[str] = []
        self.written: set[str] = set()
        self.views: dict[str, str] = {}  # view entry name -> digest of the data the run read through it
        self.errors: list[str] = []  # events the listener could not read (the record is then incomplete)
        self.params: dict[tuple[str, ...], Any] = {}
        self.defaults: dict[tuple[str, ...], Any] = {}  # keys read with a default (:func:`note_item`)
        self._where: dict[Any, str | None] = {}  # raw path -> project path or None (the decision cache)
        self._models: dict[int, tuple[Any, tuple[str, ...]]] = {}
        self._handle: Any = None
        self._patched: list[tuple[type, str, Any]] = []
        self._types: list[type] = []  # the classes of the watched models (patched while recording)
        self._pid = os.getpid()

    # -------------------------------------------------------------- paths
    def project_path(self, raw: Any, cwd: str | None = None) -> str | None:
        """The recorded name of ``raw`` (relative to the workspace, or absolute inside the code's
        checkout) when it lies in the project and is not ignored; else None. Cached per raw value."""
        key = (raw, cwd)
        hit = self._where.get(key, "?")
        if hit != "?":
            return hit  # type: ignore[return-value]
        out = None
        try:
            text = os.fsdecode(raw) if isinstance(raw, bytes | str | os.PathLike) else None
            if text:
                out = self._name(os.path.abspath(os.path.join(cwd or os.getcwd(), text)))
        except (TypeError, ValueError, OSError):
            out = None
        self._where[key] = out
        return out

    def _name(self, p: str) -> str | None:
        """String tests only (a ``Path``'s parents cost ~50 times more: this runs for every module)."""
        sep = os.sep
        if any(p == e or p.startswith(e + sep) for e in self._exclude_s) or f"{sep}__pycache__{sep}" in p:
            return None
        for base, relative in self._bases_s:
            if p.startswith(base + sep):
                rel = p[len(base) + 1:]
                parts = rel.split(sep)
                if parts[0] in IGNORED_TOP or any(part[:1] == "." for part in parts):
                    return None  # state and caches; hidden files (an output folder being written: .name.x.tmp)
                return rel.replace(sep, "/") if relative else p
        return self._outside(p)

    def _outside(self, p: str) -> str | None:
        """The name of a path outside the project: inside the installation a relocatable token (a data file) or
        None (code: its distribution's version covers it); the system's files None; anything else itself."""
        real = os.path.realpath(p)
        for base, token in self._install:
            if real.startswith(base + os.sep):
                if token is None or _is_code(real) or (token == "prefix:" and real[len(base):].startswith("/bin/")):
                    return None  # code (its distribution's version covers it), a program of the environment
                return token + real[len(base) + 1:]
        if real.startswith(SYSTEM) or real.startswith(self._volatile) or self._too_broad(real):
            return None
        return real

    def _too_broad(self, real: str) -> bool:
        return too_broad(real, [b for b, _ in self._bases_s])

    # -------------------------------------------------------------- events
    def _on_event(self, event: str, args: tuple[Any, ...]) -> None:
        if os.getpid() != self._pid:  # a forked worker: its reads are its parent's business
            return
        try:
            self._seen(event, args)
        except Exception as err:  # noqa: BLE001 - never fail the run's own open; the record says it is incomplete
            self.errors.append(f"{event}: {type(err).__name__}: {err}")

    def note_view(self, path: Path | str, view: str, digest: str) -> None:
        """The run read the file ``path`` through ``view`` (:func:`read_view`), getting data of this digest."""
        name = self.project_path(path)
        if name is not None:
            self.views.setdefault(view_entry(view, name), digest)

    def _seen(self, event: str, args: tuple[Any, ...]) -> None:
        if getattr(_paused, "files", False):
            return  # a view reading its file (read_view): the view is recorded instead
        if event == "open":
            path, mode, flags = args
            if isinstance(path, int) or (flags or 0) & _DIRECTORY or (mode is None and os.path.isdir(path)):
                return  # a folder opened to be listed or removed (shutil.rmtree): not a read of its content
            writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & _WRITE_FLAGS)
            name = self.project_path(path)
            if name is None:
                return
            if writes:
                self.written.add(name)
            elif name not in self.files:
                self.files[name] = "file"
            return
        # subprocess.Popen: (executable, args, cwd, env); os.exec: (path, args, env); os.posix_spawn: (path, argv, env)
        argv = args[1]
        cwd = args[2] if event == "subprocess.Popen" and isinstance(args[2], str | bytes | os.PathLike) else None
        items = [argv] if isinstance(argv, str | bytes | os.PathLike) else list(argv or ())
        for item in [args[0], *items]:
            if not isinstance(item, str | os.PathLike):
                continue
            for part in os.fspath(item).split(os.pathsep):
                name = self.project_path(part, os.fspath(cwd) if cwd is not None else None) if part else None
                if name is not None and name not in self.files and self._exists(name):
                    self.files[name] = "exec"

    def _exists(self, name: str) -> bool:
        full = resolve_name(self.root, name)
        return full is not None and os.path.exists(full)

    # -------------------------------------------------------------- params
    def watch_params(self, model: Any, prefix: tuple[str, ...] = ()) -> None:
        """Record the leaf reads of ``model`` (a pydantic model tree) under ``prefix``."""
        self._models[id(model)] = (model, prefix)
        if type(model) not in self._types:
            self._types.append(type(model))
            if self._handle is not None:  # a copy of a class not seen yet, while recording
                self._patch(type(model))
        for name in type(model).model_fields:
            value = model.__dict__.get(name)
            self._watch_value(value, (*prefix, name))

    def _watch_value(self, value: Any, key: tuple[str, ...]) -> None:
        if _is_model(value):
            self.watch_params(value, key)
        elif _is_branch(value):
            for k, v in value.items():
                self._watch_value(v, (*key, str(k)))

    def _note(self, key: tuple[str, ...], value: Any) -> None:
        """Record a leaf read (a model, or a mapping of models, is a branch: its own leaves are recorded)."""
        if key in self.params or getattr(_paused, "on", False) or _is_branch(value):
            return
        self.params[key] = value

    def _note_all(self, model: Any, prefix: tuple[str, ...]) -> None:
        """Every leaf below ``model`` (a dump of it)."""
        for name in type(model).model_fields:
            self._note_tree(model.__dict__.get(name), (*prefix, name))
        for name, value in (model.__pydantic_extra__ or {}).items():
            self._note_tree(value, (*prefix, name))

    def _note_tree(self, value: Any, key: tuple[str, ...]) -> None:
        if _is_model(value):
            self._note_all(value, key)
        elif _is_branch(value):
            for k, v in value.items():
                self._note_tree(v, (*key, str(k)))
        else:
            self._note(key, value)

    def _patch(self, cls: type) -> None:
        rec = self
        get0 = cls.__getattribute__
        dump0, json0, copy0 = cls.model_dump, cls.model_dump_json, cls.model_copy

        def getattribute(obj: Any, name: str) -> Any:
            try:
                value = get0(obj, name)
            except AttributeError:
                if name[:1] != "_":  # an extra item (pydantic's __getattr__ answers next)
                    hit = rec._models.get(id(obj))
                    extra = get0(obj, "__pydantic_extra__") if hit is not None and hit[0] is obj else None
                    if extra and name in extra:
                        rec._note((*hit[1], name), extra[name])  # type: ignore[index]
                    elif hit is not None and hit[0] is obj and not name.startswith("model_"):
                        rec._note((*hit[1], name), _ABSENT)  # looked up, not set: adding it is a change
                raise
            if name[:1] != "_":
                hit = rec._models.get(id(obj))
                if hit is not None and hit[0] is obj:
                    if name in type(obj).model_fields:
                        rec._note((*hit[1], name), value)
                    elif name == "model_extra" and value:
                        for k, v in value.items():
                            rec._note((*hit[1], k), v)
            return value

        def model_dump(obj: Any, *a: Any, **k: Any) -> Any:
            hit = rec._models.get(id(obj))
            if hit is not None and hit[0] is obj and not getattr(_paused, "on", False):
                rec._note_all(obj, hit[1])
            return dump0(obj, *a, **k)

        def model_dump_json(obj: Any, *a: Any, **k: Any) -> Any:
            hit = rec._models.get(id(obj))
            if hit is not None and hit[0] is obj and not getattr(_paused, "on", False):
                rec._note_all(obj, hit[1])
            return json0(obj, *a, **k)

        def model_copy(obj: Any, *a: Any, **k: Any) -> Any:
            new = copy0(obj, *a, **k)
            hit = rec._models.get(id(obj))
            if hit is not None and hit[0] is obj:
                rec.watch_params(new, hit[1])  # a copy reads as its original
            return new

        for name, fn in (("__getattribute__", getattribute), ("model_dump", model_dump),
                         ("model_dump_json", model_dump_json), ("model_copy", model_copy)):
            self._patched.append((cls, name, cls.__dict__.get(name)))
            setattr(cls, name, fn)

    def _unpatch(self) -> None:
        for cls, name, old in reversed(self._patched):
            if old is None:
                delattr(cls, name)
            else:
                setattr(cls, name, old)
        self._patched.clear()

    # -------------------------------------------------------------- run
    def start(self, params: Any = None) -> Recorder:
        """Start listening; with ``params`` (a pydantic model tree), record its leaf reads too."""
        global _active
        if _active is not None:
            raise RuntimeError("a recorder is already recording in this process")
        _active = self
        self._pid = os.getpid()
        if params is not None:
            self.watch_params(params)
            for cls in self._types:
                self._patch(cls)
        self._handle = audit.listen(EVENTS, self._on_event)
        early, _early[:] = list(_early), []
        for event, args in early:  # what importing the stage's module read (import_reads)
            self._on_event(event, args)
        return self

    def stop(self) -> None:
        global _active
        if self._handle is not None:
            audit.unlisten(self._handle)
            self._handle = None
        self._unpatch()
        if _active is self:
            _active = None

    def modules(self) -> dict[str, str]:
        """``{name: module}`` of the modules now imported whose file the run names (the project's; outside the
        installation)."""
        out: dict[str, str] = {}
        for mod_name, mod in list(sys.modules.items()):
            f = getattr(mod, "__file__", None)
            if not isinstance(f, str) or not os.path.isabs(f):  # torch's _ops/_classes namespaces: "_ops.py"
                continue
            if mod_name in self.skip_modules or mod_name.startswith(self._skip_below):
                continue
            name = self.project_path(f)
            if name is not None and name not in out and not name.startswith(("site:", "prefix:")):
                out[name] = mod_name
        return out

    def _skipped_files(self) -> set[str]:
        """The recorded names of the skipped modules' source files (opened by ``linecache`` for a warning or a
        stack walk as often as imported)."""
        out = set()
        for name, mod in list(sys.modules.items()):
            f = getattr(mod, "__file__", None)
            if isinstance(f, str) and (name in self.skip_modules or name.startswith(self._skip_below)):
                recorded = self.project_path(f)
                if recorded is not None:
                    out.add(recorded)
        return out

    def distributions(self) -> list[str]:
        """The installed distributions of the modules now imported from the installation's package folders, and of
        the shared libraries the process mapped from them (a wheel's native libraries, loaded by compiled code:
        ``/proc/self/maps``)."""
        sites = tuple(d + os.sep for d, token in self._install if token == "site:")
        tops: set[str] = set()
        for mod_name, mod in list(sys.modules.items()):
            f = getattr(mod, "__file__", None)
            if isinstance(f, str) and f.startswith(sites):
                tops.add(mod_name.split(".", 1)[0])
        found = {d for d in (distribution_of(m) for m in tops) if d is not None}
        for lib in mapped_files(sites):
            site = next(s for s in sites if lib.startswith(s))
            d = installed().owner_of(lib[len(site):])
            if d is not None:
                found.add(d)
        return sorted(found)

    def finish(self, cache: Path | None = None) -> dict[str, Any]:
        """Stop and return the record's ``reads`` and ``params`` (digests taken now)."""
        self.stop()
        mods = self.modules()
        entries: dict[str, dict[str, Any]] = {}
        for name, mod in mods.items():
            entries[name] = {"kind": "module", "module": mod}
        for name in self.deps:
            entries.setdefault(name, {"kind": "dep"})
        skipped = self._skipped_files()
        for name, kind in self.files.items():
            if name in self.written or name in entries or name in skipped:
                continue  # written by the run; named already; a skipped module's source (a traceback, inspect.stack)
            entries[name] = {"kind": kind}
        for dist in self.distributions():
            entries[f"dist:{dist}"] = {"kind": "dist"}
        entries["python:"] = {"kind": "python"}
        digests = path_digests(self.root, list(entries), cache)
        for name, digest in self.views.items():  # the digest of what the run read through the view
            entries[name] = {"kind": "view"}
            digests[name] = digest
        reads = [{"path": n, **e, "sha256": digests[n]} for n, e in sorted(entries.items())]
        params = [{"key": ".".join(k), "path": list(k), **_param_value(v, self.defaults.get(k, _NONE))}
                  for k, v in sorted(self.params.items())]
        runtime = [{"key": k, "value": jsonable(v)} for k, v in sorted(self.runtime.items())]
        return {"reads": reads, "params": params, "runtime": runtime,
                **({"incomplete": self.errors[:5]} if self.errors else {})}


def _param_value(value: Any, default: Any) -> dict[str, Any]:
    """A params entry's value fields: its digest and value (a key not found: ``absent``; read with a default:
    that default too)."""
    if value is _ABSENT:
        return {"sha256": data_digest(None), "value": None, "absent": True}
    return {"sha256": value_digest(value), "value": jsonable(value),
            **({"default": jsonable(default)} if default is not _NONE else {})}


def path_digests(root: Path, names: list[str], cache: Path | None = None) -> dict[str, str]:
    """``{name: digest}``: a file's SHA-256 (a JSON/YAML file's: of what it says), a folder's ``tree:`` digest (:func:`r2m.utils.digest.tree_digest`'s
    value), a ``view`` entry's digest of its view's data now (``"unreadable"`` when the view fails on the file),
    ``"missing"`` when gone. Every file named or inside a folder named goes through one
    :class:`r2m.utils.digest.StatCache` (the stat cache ``cache`` read and written once); a folder is
    walked and hashed a file at a time."""
    from r2m.utils.digest import StatCache, tree_line, walk

    out: dict[str, str] = {}
    stats = StatCache(cache, parsed=True)  # a JSON/YAML file by what it says (r2m.utils.digest.parsed_digest)
    for n in names:
        if n.startswith("dist:"):
            out[n] = dist_version(n[5:])
            continue
        if n == "python:":
            out[n] = f"version:{interpreter()}"
            continue
        seen = viewed(n)
        if seen is not None:
            out[n] = _view_now(root, *seen)
            continue
        where = resolve_name(root, n)
        if where is None:
            out[n] = "missing"
            continue
        full = os.path.normpath(where)
        try:
            mode = os.stat(full).st_mode
        except OSError:
            out[n] = "missing"
            continue
        if stat.S_ISDIR(mode):
            h = hashlib.sha256()
            folder = Path(full)
            for f in walk(folder):
                h.update(tree_line(folder, stats.record(f)))
            out[n] = "tree:" + h.hexdigest()
        elif stat.S_ISREG(mode):
            rec = stats.record(Path(full))
            out[n] = rec.get("sha256") or rec.get("parsed_sha256") or "missing"
        else:
            out[n] = "missing"
    stats.save()
    return out


def _view_now(root: Path, view: str, name: str) -> str:
    """The digest of ``view``'s data of the file ``name`` now: ``missing``, or ``unreadable`` when the view fails
    on it (the reader reports why; never the digest of data a run read)."""
    where = resolve_name(root, name)
    if where is None or not os.path.isfile(where):
        return "missing"
    try:
        return view_digest(view_data(view, where))
    except Exception:  # noqa: BLE001 - any failure of the view on this file: not what a run read
        return "unreadable"


class Digests:
    """:func:`path_digests` memoized for one process (a planner asks for the same files many times)."""

    def __init__(self, root: Path, cache: Path | None = None) -> None:
        self.root, self.cache = Path(root), cache
        self.known: dict[str, str] = {}

    def __call__(self, names: list[str]) -> dict[str, str]:
        todo = [n for n in dict.fromkeys(names) if n not in self.known]
        if todo:
            self.known.update(path_digests(self.root, todo, self.cache))
        return {n: self.known[n] for n in names}


def lookup(params: Any, path: list[str]) -> tuple[bool, Any]:
    """``(found, value)`` of the params key at ``path`` (a model's field or extra item, a mapping's key)."""
    cur = params
    for part in path:
        if _is_model(cur):
            if part in type(cur).model_fields:
                cur = cur.__dict__.get(part)
            elif part in (cur.__pydantic_extra__ or {}):
                cur = cur.__pydantic_extra__[part]
            else:
                return False, None
        elif isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return False, None
    return True, cur


class ParamValues:
    """The params keys of one params tree: ``(found, JSON value, digest)`` per key path, each computed once."""

    def __init__(self, params: Any) -> None:
        self.params = params
        self._known: dict[tuple[str, ...], tuple[bool, Any, str]] = {}

    def get(self, path: list[str], default: Any = _NONE) -> tuple[bool, Any, str]:
        """``(found, value, digest)``; a key not found, or null, with a ``default`` counts as found with that value
        (an optional key left null falls back on the default the reader recorded)."""
        if default is not _NONE:
            found, data, digest = self.get(path)
            return (True, data, digest) if found and data is not None else (True, default, data_digest(default))
        key = tuple(path)
        hit = self._known.get(key)
        if hit is None:
            found, value = lookup(self.params, path)
            data = jsonable(value) if found else None
            hit = self._known[key] = (found, data, data_digest(data))
        return hit


def changes(record: dict[str, Any], params: Any, digests: Digests,
            runtime: dict[str, Any] | None = None) -> list[str]:
    """What changed since ``record`` was written, one line each (empty: current): a read file changed or
    removed, an installed distribution's version or the interpreter changed, a params key whose value changed,
    that is gone or that was absent and is set now, a runtime setting used with another value now (``runtime``:
    the settings now, by name; None: not compared). ``params``: the instance's params now, or their
    :class:`ParamValues`."""
    values = params if isinstance(params, ParamValues) else ParamValues(params)
    out: list[str] = [f"the record is incomplete ({why})" for why in record.get("incomplete") or ()][:1]
    reads = record.get("reads") or []
    now = digests([r["path"] for r in reads])
    for r in reads:
        if now[r["path"]] == r["sha256"]:
            continue
        seen = viewed(r["path"]) if r["kind"] == "view" else None
        if seen is not None:  # the file, and the view it was read through
            state = {"missing": "removed", "unreadable": "unreadable"}.get(now[r["path"]], "changed")
            out.append(f"{seen[1]}: {state} (view {seen[0]})")
        elif r["kind"] in ("dist", "python"):
            old, new = r["sha256"].removeprefix("version:"), now[r["path"]].removeprefix("version:")
            out.append(f"{r['path']}: {old} -> {new} ({r['kind']})")
        elif r["sha256"] == "missing":
            out.append(f"{r['path']}: appeared ({r['kind']})")
        elif now[r["path"]] == "missing":
            out.append(f"{r['path']}: removed ({r['kind']})")
        else:
            out.append(f"{r['path']}: changed ({r['kind']})")
    for p in record.get("params") or []:
        if p.get("absent"):
            if values.get(p["path"])[0]:
                out.append(f"params {p['key']}: set (absent when it ran)")
            continue
        found, _, digest = values.get(p["path"], p.get("default", _NONE))
        if not found:
            out.append(f"params {p['key']}: removed")
        elif digest != p["sha256"]:
            out.append(f"params {p['key']}: changed")
    for r in record.get("runtime") or [] if runtime is not None else []:
        if r["key"] in runtime and jsonable(runtime[r["key"]]) != r["value"]:
            out.append(f"runtime {r['key']}: {r['value']!r} -> {jsonable(runtime[r['key']])!r}")
    return out
