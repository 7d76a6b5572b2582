"""Each stage instance's record of what it read and wrote, and ``r2m why``: is an instance current, and if not,
what changed.

The stage runner (:func:`r2m.cli.run_stage`, also in a warm server's fork) records every instance it runs
successfully (:class:`r2m.utils.reads.Recorder`): the project modules imported, the files opened for reading
and handed to a program (inside the workspace, inside the installation as ``site:``/``prefix:``, elsewhere by
absolute path), the installed distributions and the interpreter by version, each params key read with the
SHA-256 of its value (``absent`` when looked up and not set), the runtime settings used, and the digests of the
outputs it wrote. The record is ``.r2m/records/<stage>/<instance key>.json`` (outside the outputs; removed when
a run starts, written when one succeeds)::

    {"format": 2, "stage": "build_vocab", "axes": {"dataset": "demo"},
     "reads": [{"path": "src/r2m/text/vocab.py", "kind": "module", "module": "r2m.text.vocab", "sha256": "..."},
               {"path": "data/demo/corpus/corpus.parquet", "kind": "file", "sha256": "..."},
               {"path": "site:spacy_lookups_data/data/en_lemma_lookup.json", "kind": "file", "sha256": "..."},
               {"path": "dist:pyarrow", "kind": "dist", "sha256": "version:23.0.1"},
               {"path": "python:", "kind": "python", "sha256": "version:CPython 3.11.7"}],
     "params": [{"key": "build_vocab.min_count", "path": ["build_vocab", "min_count"], "sha256": "...",
                 "value": 2}],
     "runtime": [{"key": "threads", "value": 1}],
     "outputs": [{"path": "data/demo/vocab", "sha256": "tree:..."}]}

A folder's digest is ``tree:<sha256>`` (:func:`r2m.utils.digest.tree_digest`). A structured file read through a
view (:func:`r2m.utils.reads.read_view`: ``prepare`` reads each demo photo's id, package, resource and sha256 of
``photos.yaml``) is ``{"path": "view:demo_photos:data/demo/photos.yaml", "kind": "view", "sha256": ...}``, the
digest of the view's data: an edit of a field the view leaves out stales nothing. Not inputs: the instance's own
outputs, anything it wrote, the params file itself (its keys count one by one), ``.r2m/``, ``logs/``, the
engines' folders, the system's files, and the runner's own modules (:data:`RUNNER`). :func:`stale` answers "is
this instance current?" for both engines, :func:`up_to_date` for the runner itself before any work (early cutoff).

**Stamps and done files: how the engines use records.** Each instance has a stamp,
``.stamps/<stage>/<instance key>.json``, an input of its Snakemake rule and a DVC params file of its ``dvc.yaml``
stage::

    {"state": "current", "params": {"build_vocab": {"min_count": 2}}}
    {"state": "stale", "params": {...}, "why": ["src/r2m/text/vocab.py: changed (module)"]}

``params``: the current values of the keys the instance's record says it read. Before an engine plans,
:meth:`Planner.plan` writes every stamp whose text changed: a current one with modification time 0 (never newer
than an output), a stale one with the time of writing, so Snakemake's mtime check reruns exactly the stale
instances; DVC compares the stamp's values with those its lock kept. Snakemake knows an instance by its done file,
``.r2m/done/<stage>/<instance key>`` (:func:`done_path`: the digest of its record), its rule's output and its
readers' input. After a successful run (or a cut-off one) the runner writes the stamp current
(:func:`mark_current`) and the done file when its record changed: the stamp a run leaves is the one the next plan
computes, so a rerun that read a new file is not planned again.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from r2m.utils.digest import data_digest
from r2m.utils.reads import (
    FORMAT,
    KINDS,
    SYSTEM,
    VIEWS,
    Digests,
    ParamValues,
    Recorder,
    changes,
    too_broad,
    viewed,
)
from r2m.utils.resume import STATE_ROOT

if TYPE_CHECKING:
    from r2m.stage.context import StageContext

RECORDS = STATE_ROOT / "records"
DONE = STATE_ROOT / "done"  # one file per finished instance: what Snakemake's rules produce and consume
# git-ignored; outside .r2m/, which .dvcignore hides: the stamps are DVC params files (and the stamps stage's output)
STAMPS = Path(".stamps")
OLD_STAMPS = Path(".params")  # where they were kept before: removed while it holds only stamps
DIGEST_CACHE = STATE_ROOT / "digests" / "records.json"
CODE = Path(__file__).resolve().parents[3]  # the checkout whose src/ holds r2m
# The stage runner's own modules: they parse the command, check params and inputs, take the lock, guard the
# network, record, and call the stage function; what an instance computes is decided elsewhere (the stage's
# modules, params.py, stage/context.py, runtime.py: all recorded), and the settings they pass on are recorded as
# values (params keys, runtime settings). So a runner edit reruns nothing (r2m --force, or snakemake --forcerun,
# recomputes when one does change results). ``pkg.*``: a package and every module below it.
RUNNER = ("r2m.cli", "r2m.warm.*", "r2m.stage.record", "r2m.utils.reads", "r2m.utils.audit", "r2m.utils.netguard",
          "r2m.utils.cliargs", "r2m.pipeline", "r2m.pipeline.network", "r2m.pipeline.validate")


def record_path(root: Path, stage: Any, axes: Mapping[str, str]) -> Path:
    return Path(root) / RECORDS / stage.name / f"{stage.key(axes)}.json"


def start(ctx: StageContext, params_file: str | Path | None = None) -> Recorder:
    """Begin recording the instance ``ctx`` runs (its old record removed first: a failed run leaves none)."""
    path = record_path(ctx.root, ctx.stage, ctx.axes)
    path.unlink(missing_ok=True)
    exclude = [*ctx.outs.values(), *([params_file] if params_file else [])]
    rec = Recorder(ctx.root, CODE, exclude, skip_modules=RUNNER)
    inputs = [str(p) for p in ctx.deps.values()]
    for name, dep in ctx.stage.deps.items():
        if not isinstance(dep, str):
            inputs += [str(p) for _, p in ctx.gather(name)]
    rec.deps = [n for n in dict.fromkeys(rec.project_path(p) for p in inputs) if n is not None]
    return rec.start(ctx.params)


def output_names(ctx: StageContext) -> list[str]:
    """The instance's declared outputs, named as records name paths (relative to the workspace)."""
    root = Path(ctx.root).resolve()
    return [os.path.relpath(Path(p).resolve(), root).replace(os.sep, "/") for p in ctx.outs.values()]


def finish(rec: Recorder, ctx: StageContext) -> Path:
    """Stop recording, write the instance's record atomically (with the digests of the outputs it wrote), mark its
    stamp current and write its done file."""
    from r2m.utils.io import write_json

    body = rec.finish(Path(ctx.root) / DIGEST_CACHE)
    names = output_names(ctx)
    now = Digests(Path(ctx.root), Path(ctx.root) / DIGEST_CACHE)(names)
    record = {"format": FORMAT, "stage": ctx.stage.name, "axes": ctx.axes, **body,
              "outputs": [{"path": n, "sha256": now[n]} for n in names]}
    path = write_json(record_path(ctx.root, ctx.stage, ctx.axes), record, indent=1)
    mark_current(ctx, record)
    return path


def mark_current(ctx: StageContext, record: Mapping[str, Any]) -> None:
    """The instance is current: its stamp says so (the text the next plan computes) and its done file holds the
    digest of its record. The done file is rewritten only when that digest changed: a rerun that read and wrote
    the same bytes (under DVC, or cut off) leaves its modification time, so Snakemake plans none of its readers."""
    from r2m.utils.io import write_text_if_changed

    write_stamp(stamp_path(ctx.root, ctx.stage, ctx.axes),
                {tuple(p["path"]): p.get("value") for p in record.get("params") or []}, [])
    write_text_if_changed(done_path(ctx.root, ctx.stage, ctx.axes), data_digest(record, spaced=True) + "\n")


def done_path(root: Path, stage: Any, axes: Mapping[str, str] | None = None) -> Path:
    """``root/.r2m/done/<stage>/<instance key>`` (without ``axes``: the ``{axis}`` template): written when the
    instance finishes or finds itself current; the Snakemake rule's output."""
    return Path(root) / DONE / stage.name / stage.key(axes)


def current_runtime() -> dict[str, Any]:
    """The runtime settings a stage run would use now (the environment's; :data:`r2m.runtime.STAGE_THREADS`)."""
    from r2m.runtime import STAGE_THREADS, Runtime

    return Runtime.from_env(default_threads=STAGE_THREADS).settings()


def _output_changes(record: Mapping[str, Any], digests: Digests) -> list[str]:
    """One line per output the instance wrote that is gone or differs now (it rebuilds them)."""
    outs = record.get("outputs") or []
    now = digests([o["path"] for o in outs])
    return [f"output {o['path']}: {'removed' if now[o['path']] == 'missing' else 'changed'} since it was written"
            for o in outs if now[o["path"]] != o["sha256"]]


def why_not_current(record: Mapping[str, Any], params: Any, digests: Digests,
                    runtime: Mapping[str, Any] | None) -> list[str]:
    """Why an instance with this ``record`` is not current (empty: it is): what it read, and what it wrote."""
    return changes(dict(record), params, digests, dict(runtime) if runtime is not None else None) \
        + _output_changes(record, digests)


def up_to_date(ctx: StageContext) -> tuple[dict[str, Any] | None, list[str]]:
    """The runner's own check before any work (early cutoff): ``(record, why)`` with the params and runtime this
    run has; ``why`` empty when nothing the last run read or wrote has changed."""
    record, why = _record(ctx.stage, ctx.axes, Path(ctx.root))
    if record is None:
        return None, why
    digests = Digests(Path(ctx.root), Path(ctx.root) / DIGEST_CACHE)
    return record, why_not_current(record, ParamValues(ctx.params), digests, ctx.runtime.settings())


# ------------------------------------------------------------------------------------------- stamps
def stamp_path(root: Path, stage: Any, axes: Mapping[str, str] | None = None) -> Path:
    """``root/.stamps/<stage>/<instance key>.json`` (without ``axes``: the ``{axis}`` template)."""
    return Path(root) / STAMPS / stage.name / f"{stage.key(axes)}.json"


def stamp_text(values: Mapping[tuple[str, ...], Any], why: list[str]) -> str:
    """The stamp's canonical text: ``state``, the params values read (nested by key), ``why`` when stale."""
    nested: dict[str, Any] = {}
    for path, value in sorted(values.items()):
        cur, leaf = nested, path[-1]
        for part in path[:-1]:
            nxt = cur.setdefault(part, {})
            if not isinstance(nxt, dict):  # a leaf above this one (cannot happen): keep the dotted key
                cur, leaf = nested, ".".join(path)
                break
            cur = nxt
        cur[leaf] = value
    body = {"state": "stale" if why else "current", "params": nested, **({"why": why[:20]} if why else {})}
    return json.dumps(body, sort_keys=True) + "\n"  # one line: the C encoder (indent= takes the slow one)


def write_stamp(path: Path, values: Mapping[tuple[str, ...], Any], why: list[str]) -> bool:
    """Write the stamp unless it holds this text already; a current stamp gets modification time 0 (a stale
    one keeps the time it was written). True: written."""
    from r2m.utils.io import write_text_if_changed

    written = write_text_if_changed(path, stamp_text(values, why))
    if not why and path.stat().st_mtime != 0:
        os.utime(path, (0, 0))
    return written


def remove_old_stamps(root: Path) -> bool:
    """Remove ``root/.params/``, where the stamps were kept before :data:`STAMPS`, when it holds nothing but stamps
    (``<stage>/<key>.json`` files, each a stamp's JSON); anything else there (a user's file) leaves it all in
    place. True: removed. Both engines' planning calls it (``r2m stamps``, the Snakefile)."""
    import shutil

    old = Path(root) / OLD_STAMPS
    if old.is_symlink() or not old.is_dir():
        return False
    try:
        for folder in old.iterdir():
            if folder.is_symlink() or not folder.is_dir():
                return False
            for path in folder.iterdir():
                if path.suffix != ".json" or path.is_symlink() or not path.is_file():
                    return False
                doc = json.loads(path.read_text())
                if not isinstance(doc, dict) or doc.get("state") not in ("current", "stale") \
                        or not isinstance(doc.get("params"), dict):
                    return False
    except (OSError, ValueError):  # unreadable, or removed meanwhile by the other engine's planning
        return False
    shutil.rmtree(old, ignore_errors=True)
    return True


def _record(stage: Any, axes: Mapping[str, str], root: Path,
            known: Mapping[str, Any] | None = None) -> tuple[dict[str, Any] | None, list[str]]:
    path = record_path(root, stage, axes)
    if known and str(path) in known:
        return known[str(path)], []  # read and checked by Planner._prefetch
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None, [f"no record ({path.relative_to(root)}): never ran, or its last run failed"]
    except (OSError, ValueError) as err:
        return None, [f"{path}: unreadable record ({err}); rerun the instance"]
    problem = shape_problem(record, root)
    if problem:
        return None, [f"{path}: {problem}; rerun the instance"]
    return record, []


@functools.lru_cache(maxsize=1 << 15)  # a plan of the demo checks 25,631 names, 1,707 distinct
def _name_problem(name: str, kind: str, root: Path) -> str | None:
    """Why a record may not name ``name`` as a read of ``kind`` (None: it may), checked before anything is hashed: a
    path inside the workspace (relative, no ``..``), inside the installation (``site:``/``prefix:`` and a relative
    path), a distribution or the interpreter by name, or a file or folder elsewhere — never the system's own files
    or a folder that holds the workspace or sits at the top of the tree (a digest would walk all of it)."""
    if "\x00" in name:
        return "holds a NUL"
    seen = viewed(name)  # a file read through a view: the view known, the file a file's name
    if kind == "view":
        if seen is None:
            return "is not a view entry"
        return f"names no known view ({seen[0]})" if seen[0] not in VIEWS else _name_problem(seen[1], "file", root)
    if seen is not None:
        return "is a view entry's name"
    if kind in ("dist", "python"):
        return None if name.startswith(f"{kind}:") else f"is not a {kind} name"
    rel = name.split(":", 1)[1] if name.startswith(("site:", "prefix:")) else name
    if not os.path.isabs(rel):
        return None if os.path.normpath(rel) == rel and not rel.startswith("..") else "leaves its folder (..)"
    real = os.path.realpath(name)
    if real.startswith(SYSTEM) or too_broad(real, [str(Path(root).resolve()), str(CODE)]):
        return "is the system's or a folder above the workspace"
    return None


def shape_problem(record: Any, root: Path = Path(".")) -> str | None:
    """Why ``record`` (parsed JSON) is not a record the runner writes, or None: ``reads`` a list of ``{path,
    kind, sha256}`` each naming what a record may name (:func:`_name_problem`), ``params`` a list of ``{key,
    path: [str], sha256}``, ``runtime`` a list of ``{key, value}``, ``outputs`` a list of ``{path, sha256}`` inside
    the workspace. Checked where a record is read, before any path in it is hashed."""
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        return "a record of another format"
    reads, params = record.get("reads"), record.get("params")
    runtime, outputs = record.get("runtime", []), record.get("outputs", [])
    if not all(isinstance(x, list) for x in (reads, params, runtime, outputs)):
        return "not a record ('reads', 'params', 'runtime' and 'outputs' are not lists)"
    for i, r in enumerate(reads):
        if not (isinstance(r, dict) and isinstance(r.get("path"), str) and isinstance(r.get("kind"), str)
                and isinstance(r.get("sha256"), str) and r["kind"] in KINDS):
            return f"reads[{i}] is not {{path, kind, sha256}}"
        problem = _name_problem(r["path"], r["kind"], root)
        if problem:
            return f"reads[{i}] names {r['path']!r}, which {problem}"
    for i, q in enumerate(params):
        if not (isinstance(q, dict) and isinstance(q.get("key"), str) and isinstance(q.get("sha256"), str)
                and isinstance(q.get("path"), list) and all(isinstance(x, str) for x in q["path"])):
            return f"params[{i}] is not {{key, path, sha256}}"
    for i, q in enumerate(runtime):
        if not (isinstance(q, dict) and isinstance(q.get("key"), str) and "value" in q):
            return f"runtime[{i}] is not {{key, value}}"
    for i, o in enumerate(outputs):
        if not (isinstance(o, dict) and isinstance(o.get("path"), str) and isinstance(o.get("sha256"), str)
                and not os.path.isabs(o["path"]) and _name_problem(o["path"], "file", root) is None):
            return f"outputs[{i}] is not {{path, sha256}} inside the workspace"
    return None


def stale(stage: Any, axes: Mapping[str, str], params: Any, root: Path = Path(".")) -> list[str]:
    """Why the instance of ``stage`` at ``axes`` is not current, one line each; empty when it is. No record:
    it never ran (or its last run failed)."""
    return Planner(params, root, prefetch=False).check(stage, axes)[1]  # one instance: only its own files


class Planner:
    """Checks instances against their records and writes their stamps, for one ``params`` (the instances'
    params views and the digests of the files records name are computed once per planner)."""

    def __init__(self, params: Any, root: Path = Path("."), prefetch: bool = True) -> None:
        from r2m import params as P

        self.params, self.root = params, Path(root)
        self.views = P.Views(params)  # the instances' params as the runner builds them (dataset, seed)
        self._values: dict[tuple[str | None, str | None], ParamValues] = {}
        self.digests = Digests(self.root, self.root / DIGEST_CACHE)
        self._fetched = not prefetch  # prefetch: digest every record's files in one pass at the first check
        self._records: dict[str, Any] = {}  # record path -> its content, read and checked once by _prefetch
        self.runtime = current_runtime()  # the settings the engine's jobs will run with

    def _prefetch(self) -> None:
        """Digest what every record in the workspace names in one pass (one read of the stat cache)."""
        self._fetched = True
        names: list[str] = []
        for path in sorted((self.root / RECORDS).glob("*/*.json")):
            try:
                record = json.loads(path.read_text())
                if shape_problem(record, self.root) is None:  # a malformed one's own check says what is wrong
                    self._records[str(path)] = record
                    names += [r["path"] for r in [*record["reads"], *(record.get("outputs") or [])]]
            except (OSError, ValueError, TypeError, KeyError, AttributeError):
                continue  # that instance's own check says what is wrong
        self.digests(names)

    def view(self, stage: Any, axes: Mapping[str, str]) -> ParamValues:
        """The params the instance sees, as the runner builds them (dataset view, profile, seed)."""
        key = (axes.get("dataset") if "dataset" in stage.axes else None, axes.get("seed"))
        if key not in self._values:
            self._values[key] = ParamValues(self.views.view(*key))
        return self._values[key]

    def check(self, stage: Any, axes: Mapping[str, str]) -> tuple[dict[str, Any] | None, list[str]]:
        """``(record, why)``: the instance's record and why it is not current (empty: it is)."""
        if not self._fetched:
            self._prefetch()
        record, why = _record(stage, axes, self.root, self._records)
        if record is None:
            return None, why
        return record, why_not_current(record, self.view(stage, axes), self.digests, self.runtime)

    def plan(self, stage: Any, axes: Mapping[str, str]) -> tuple[Path, list[str]]:
        """Write the instance's stamp (:func:`write_stamp`); returns its path and why it is stale."""
        record, why = self.check(stage, axes)
        values: dict[tuple[str, ...], Any] = {}
        view = self.view(stage, axes)
        for p in (record or {}).get("params") or []:
            values[tuple(p["path"])] = (view.get(p["path"], p["default"]) if "default" in p else view.get(p["path"]))[1]
        path = stamp_path(self.root, stage, axes)
        write_stamp(path, values, why)
        return path, why
