"""Each stage instance's record of what it read, and ``r2m why``: is an instance current, and if not, what changed.

The stage runner (:func:`r2m.cli.run_stage`, also in a warm server's fork) records every instance it runs
successfully (:class:`r2m.utils.reads.Recorder`): the project modules imported, the project files opened
for reading, the project files and folders handed to a program it started, each with its SHA-256, and
each params key read with the SHA-256 of its value. The record is
``.r2m/records/<stage>/<instance key>.json`` (outside the outputs, so an engine deleting them before a
rerun leaves it; removed when a run starts, written when one succeeds)::

    {"format": 1, "stage": "build_vocab", "axes": {"dataset": "demo"},
     "reads": [{"path": "src/r2m/text/vocab.py", "kind": "module", "module": "r2m.text.vocab",
                "sha256": "..."},
               {"path": "data/demo/corpus/corpus.txt", "kind": "file", "sha256": "..."},
               {"path": "src/r2m/evaluation/java/R2mMeteorThreads.java", "kind": "exec", "sha256": "..."}],
     "params": [{"key": "build_vocab.min_count", "path": ["build_vocab", "min_count"], "sha256": "..."}]}

A folder's digest is ``tree:<sha256>`` (:func:`r2m.utils.digest.tree_digest`). Not inputs: the instance's
own outputs, anything it wrote, the params file itself (its keys count one by one), ``.r2m/``, ``logs/``
and the engines' folders. :func:`stale` answers "is this instance current?" for both engines.

**Stamps: how the engines use records.** Each instance has a stamp, ``.params/<stage>/<instance key>.json``,
an input of its Snakemake rule and a DVC params file of its ``dvc.yaml`` stage::

    {"state": "current", "params": {"build_vocab": {"min_count": 2}}}
    {"state": "stale", "params": {...}, "why": ["src/r2m/text/vocab.py: changed (module)"]}

``params``: the current values of the keys the instance's record says it read. Before an engine plans,
:func:`plan` writes every stamp whose text changed: a current one with modification time 0 (never newer
than an output), a stale one with the time of writing (newer than the outputs), so Snakemake's mtime
check reruns exactly the stale instances; DVC compares the stamp's values with those its lock kept. The
runner, after a successful run, writes the stamp current (:func:`mark_current`): the stamp a run leaves
is the one the next plan computes, so a rerun that read a new file is not planned again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from r2m.utils.reads import FORMAT, Digests, ParamValues, Recorder, changes
from r2m.utils.resume import STATE_ROOT

if TYPE_CHECKING:
    from r2m.stage.context import StageContext

RECORDS = STATE_ROOT / "records"
STAMPS = Path(".params")  # git-ignored, not dvc-ignored: the stamps are DVC params files
DIGEST_CACHE = STATE_ROOT / "digests" / "records.json"
CODE = Path(__file__).resolve().parents[3]  # the checkout whose src/ holds r2m


def record_path(root: Path, stage: Any, axes: Mapping[str, str]) -> Path:
    return Path(root) / RECORDS / stage.name / f"{stage.key(axes)}.json"


def start(ctx: StageContext, params_file: str | Path | None = None) -> Recorder:
    """Begin recording the instance ``ctx`` runs (its old record removed first: a failed run leaves none)."""
    path = record_path(ctx.root, ctx.stage, ctx.axes)
    path.unlink(missing_ok=True)
    exclude = [*ctx.outs.values(), *([params_file] if params_file else [])]
    rec = Recorder(ctx.root, CODE, exclude)
    inputs = [str(p) for p in ctx.deps.values()]
    for name, dep in ctx.stage.deps.items():
        if not isinstance(dep, str):
            inputs += [str(p) for _, p in ctx.gather(name)]
    rec.deps = [n for n in dict.fromkeys(rec.project_path(p) for p in inputs) if n is not None]
    return rec.start(ctx.params)


def finish(rec: Recorder, ctx: StageContext) -> Path:
    """Stop recording, write the instance's record atomically and mark its stamp current."""
    from r2m.utils.io import write_json

    body = rec.finish(Path(ctx.root) / DIGEST_CACHE)
    record = {"format": FORMAT, "stage": ctx.stage.name, "axes": ctx.axes, **body}
    path = write_json(record_path(ctx.root, ctx.stage, ctx.axes), record, indent=1)
    write_stamp(stamp_path(ctx.root, ctx.stage, ctx.axes), {tuple(p["path"]): p.get("value") for p in record["params"]},
                [])
    return path


# ------------------------------------------------------------------------------------------- stamps
def stamp_path(root: Path, stage: Any, axes: Mapping[str, str] | None = None) -> Path:
    """``root/.params/<stage>/<instance key>.json`` (without ``axes``: the ``{axis}`` template)."""
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
    from r2m.utils.io import write_text

    text = stamp_text(values, why)
    try:
        same = path.read_text() == text
    except OSError:
        same = False
    if not same:
        write_text(path, text)
    if not why and path.stat().st_mtime != 0:
        os.utime(path, (0, 0))
    return not same


def _record(stage: Any, axes: Mapping[str, str], root: Path,
            known: Mapping[str, Any] | None = None) -> tuple[dict[str, Any] | None, list[str]]:
    path = record_path(root, stage, axes)
    try:
        record = (known or {}).get(str(path)) or json.loads(path.read_text())
    except FileNotFoundError:
        return None, [f"no record ({path.relative_to(root)}): never ran, or its last run failed"]
    except (OSError, ValueError) as err:
        return None, [f"{path}: unreadable record ({err}); rerun the instance"]
    problem = shape_problem(record)
    if problem:
        return None, [f"{path}: {problem}; rerun the instance"]
    return record, []


def _in_a_checkout(name: str) -> bool:
    """An absolute path a record may name: no folder, below a folder holding ``src/r2m/__init__.py`` (the
    checkout whose code a job ran, which the recorder names by its absolute paths)."""
    path = Path(os.path.normpath(name))
    return path == Path(name) and not path.is_dir() and any(
        (folder / "src" / "r2m" / "__init__.py").is_file() for folder in path.parents)


def shape_problem(record: Any) -> str | None:
    """Why ``record`` (parsed JSON) is not a record the runner writes, or None: ``reads`` a list of ``{path,
    kind, sha256}`` whose paths stay in the workspace (relative, no ``..``) or name a file of an r2m checkout
    (absolute: the code a job ran, :func:`_in_a_checkout`), ``params`` a list of ``{key, path: [str], sha256}``.
    Checked where a record is read, before any path in it is hashed."""
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        return "a record of another format"
    reads, params = record.get("reads"), record.get("params")
    if not isinstance(reads, list) or not isinstance(params, list):
        return "not a record ('reads' and 'params' are not lists)"
    for i, r in enumerate(reads):
        if not (isinstance(r, dict) and all(isinstance(r.get(k), str) for k in ("path", "kind", "sha256"))):
            return f"reads[{i}] is not {{path, kind, sha256}}"
        name = r["path"]
        inside = (_in_a_checkout(name) if os.path.isabs(name)
                  else os.path.normpath(name) == name and not name.startswith(".."))
        if not inside or "\x00" in name:
            return f"reads[{i}] names {name!r}, outside the workspace"
    for i, q in enumerate(params):
        if not (isinstance(q, dict) and isinstance(q.get("key"), str) and isinstance(q.get("sha256"), str)
                and isinstance(q.get("path"), list) and all(isinstance(x, str) for x in q["path"])):
            return f"params[{i}] is not {{key, path, sha256}}"
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
        self._records: dict[str, Any] = {}  # record path -> its parsed content (read once, by _prefetch)

    def _prefetch(self) -> None:
        """Digest what every record in the workspace names in one pass (one read of the stat cache)."""
        self._fetched = True
        names: list[str] = []
        for path in sorted((self.root / RECORDS).glob("*/*.json")):
            try:
                record = self._records[str(path)] = json.loads(path.read_text())
                if shape_problem(record) is None:  # a malformed one's own check says what is wrong
                    names += [r["path"] for r in record["reads"]]
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
        return record, changes(record, self.view(stage, axes), self.digests)

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
