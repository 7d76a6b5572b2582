"""What each stage instance depends on besides its input files: its resolved params and its code.

* **Params.** A stage instance (a stage at one value of each of its axes: dataset, variant, model,
  ckpt) reads the sections its registry entry declares, *as its dataset sees them*: the catalog
  entry's ``overrides`` merged in, the fidelity profile resolved, a baseline's ``per_model`` keys
  applied (:meth:`r2m.pipeline.spec.Stage.resolved`, the one definition). Snakemake uses that mapping as the rule's ``params`` (its params
  trigger); DVC cannot compute it, so ``r2m resolve-params`` (the ``resolve_params`` stage of
  ``dvc.yaml``) writes one canonical JSON file per instance under ``.params/`` — only when its content
  changes — and each DVC stage depends on its file. A change that means nothing (a comment, the order
  of keys, an override restating the default) leaves every file as it was; an override of section X
  for dataset D changes exactly the files of D's instances that read X.
* **Code.** A stage instance's code dependencies (the modules it can load) are computed by
  :mod:`r2m.pipeline.codedeps`; their digest is a Snakemake rule param and the ``code`` item of the
  instance's ``.params`` file, so DVC re-runs an instance exactly when its code changed.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from r2m import params as P
from r2m.pipeline.axes import ALL_DATASETS, AXIS_SOURCES, expand
from r2m.pipeline.spec import Gather, Stage
from r2m.pipeline.stages import STAGES

PARAMS_DIR = ".params"  # git-ignored, NOT dvc-ignored: DVC stages depend on the files in it


# --------------------------------------------------------------------------- params
def canonical(data: Mapping[str, Any]) -> str:
    """One text per meaning: sorted keys, fixed separators."""
    return json.dumps(data, sort_keys=True, indent=1) + "\n"


def params_file(stage: Stage, bound: Mapping[str, str] | None = None) -> str:
    """``.params/<stage>/<instance>.json`` (:meth:`Stage.key`); without ``bound``, the ``{axis}`` template."""
    return f"{PARAMS_DIR}/{stage.name}/{stage.key(bound)}.json"


@functools.cache
def _needed_by_other_datasets() -> frozenset[str]:
    return needed_by_other_datasets(STAGES)


def needed_by_other_datasets(stages: tuple[Stage, ...] | None = None) -> frozenset[str]:
    """Stages over the default dataset list whose outputs (transitively) feed a stage over another list
    (``prepare`` for the baselines' datasets): they run over ``all_datasets``. Without ``stages``: the
    registry's (computed once)."""
    if stages is None:
        return _needed_by_other_datasets()
    default = AXIS_SOURCES["dataset"]

    def produces(stage: Stage, path: str) -> bool:
        return any(out.path == path for out in stage.outs.values())

    needed: set[str] = set()
    frontier = [s for s in stages if "dataset" in s.axes and s.source("dataset") != default]
    while frontier:
        stage = frontier.pop()
        for dep in stage.deps.values():
            if isinstance(dep, Gather):
                continue
            for s in stages:
                if s.name not in needed and "dataset" in s.axes and s.source("dataset") == default \
                        and produces(s, dep):
                    needed.add(s.name)
                    frontier.append(s)
    return frozenset(needed)


def axis_source(stage: Stage, axis: str) -> str:
    """The value list ``axis`` of ``stage`` is expanded over."""
    if axis == "dataset" and stage.name in needed_by_other_datasets():
        return ALL_DATASETS
    return stage.source(axis)


def instances(params: P.Params, stages: tuple[Stage, ...] = STAGES) -> Iterator[tuple[Stage, dict[str, str]]]:
    """Every instance each stage can have under the params: each combination of its axes' value lists, a
    seeded one at each of its run's own seeds (:func:`r2m.pipeline.axes.expand`; a run its :attr:`Stage.fixed`
    values name). :func:`dag_instances` keeps those the reports need."""
    for stage in stages:
        for bound in expand(params, stage.axes, lambda a, s=stage: axis_source(s, a), dict(stage.fixed)):
            yield stage, {a: bound[a] for a in stage.axes}


# the stages whose outputs are the DAG's targets (Snakemake's ``rule all``; every DVC instance feeds one)
ALL_TARGETS = ("table1", "table2", "table3", "claims", "baselines", "retrieval", "report")


def needed_instances(params: P.Params, targets: tuple[str, ...]) -> list[tuple[Stage, dict[str, str]]]:
    """The stage instances the ``targets`` stages (axis-free: the reports) need, transitively, in the order
    of :func:`instances`."""
    every = list(instances(params))
    made = {o.path.format(**bound): (stage, bound) for stage, bound in every for o in stage.outs.values()}
    todo = [(s, b) for s, b in every if s.name in targets]
    seen: set[tuple[str, str]] = set()
    while todo:
        stage, bound = todo.pop()
        if (stage.name, stage.key(bound)) in seen:
            continue
        seen.add((stage.name, stage.key(bound)))
        todo += [made[p] for p in stage.inputs(params, bound) if p in made]
    return [(s, b) for s, b in every if (s.name, s.key(b)) in seen]


def dag_instances(params: P.Params) -> list[tuple[Stage, dict[str, str]]]:
    """The DAG both engines run: every instance the targets need (``snakemake all``; ``dvc.yaml``'s instance
    lists, written from the params by ``r2m dag --write``)."""
    return needed_instances(params, ALL_TARGETS)


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` unless the file already holds it (its mtime and hash then stay as they were)."""
    from r2m.utils.io import write_text

    if path.exists() and path.read_text() == text:
        return False
    write_text(path, text)
    return True


def all_instance_params(params: P.Params, root: Path | None = None) -> dict[str, str]:
    """``.params/...`` file -> its canonical text, for every instance the params ask for; with ``root`` (the
    project whose ``src`` is digested) its code digest too, under ``code`` (:func:`r2m.pipeline.codedeps.code_digest`)."""
    from r2m.pipeline.codedeps import code_digest

    views: dict = {}
    out = {}
    for stage, bound in dag_instances(params):
        data = stage.resolved(params, bound, views)
        if root is not None:
            data["code"] = code_digest(stage, bound, params, root, data=False)
        out[params_file(stage, bound)] = canonical(data)
    return out


def write_params_files(params: P.Params, root: Path = Path(".")) -> list[str]:
    """Every instance's resolved-params file (with its code digest); returns the ones whose content changed."""
    return [rel for rel, text in all_instance_params(params, root).items() if write_if_changed(root / rel, text)]
