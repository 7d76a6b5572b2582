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
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from r2m.utils.reads import FORMAT, Recorder, changes
from r2m.utils.resume import STATE_ROOT

RECORDS = STATE_ROOT / "records"
DIGEST_CACHE = STATE_ROOT / "digests" / "records.json"
CODE = Path(__file__).resolve().parents[3]  # the checkout whose src/ holds r2m


def record_path(root: Path, stage: Any, axes: Mapping[str, str]) -> Path:
    return Path(root) / RECORDS / stage.name / f"{stage.key(axes)}.json"


def start(ctx: Any, params_file: str | Path | None = None) -> Recorder:
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


def finish(rec: Recorder, ctx: Any) -> Path:
    """Stop recording and write the instance's record atomically."""
    from r2m.utils.io import write_json

    body = rec.finish(Path(ctx.root) / DIGEST_CACHE)
    record = {"format": FORMAT, "stage": ctx.stage.name, "axes": ctx.axes, **body}
    return write_json(record_path(ctx.root, ctx.stage, ctx.axes), record, indent=1)


def instance_params(stage: Any, params: Any, axes: Mapping[str, str]) -> Any:
    """The params the instance sees, built as the runner builds them (dataset view, profile, seed)."""
    from r2m import params as P
    from r2m.pipeline.context import StageContext

    if "dataset" in stage.axes:
        params = P.for_dataset(params, axes["dataset"])
    return StageContext(stage=stage, params=params, **dict(axes)).params


def stale(stage: Any, axes: Mapping[str, str], params: Any, root: Path = Path(".")) -> list[str]:
    """Why the instance of ``stage`` at ``axes`` is not current, one line each; empty when it is. No record:
    it never ran (or its last run failed)."""
    path = record_path(root, stage, axes)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return [f"no record ({path}): never ran, or its last run failed"]
    except (OSError, ValueError) as err:
        return [f"{path}: unreadable record ({err}); rerun the instance"]
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        return [f"{path}: a record of another format; rerun the instance"]
    return changes(record, Path(root), instance_params(stage, params, axes), Path(root) / DIGEST_CACHE)
