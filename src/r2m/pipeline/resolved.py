"""The stage instances of the DAG, and what each one's params are as its dataset sees them.

A stage instance is a stage at one value of each of its axes (dataset, variant, model, ckpt, seed).
:func:`instances` lists every instance the params allow, :func:`dag_instances` those the reports need
(what ``snakemake all`` runs and ``dvc.yaml``'s instance lists hold). What an instance actually read when
it ran is its record (:mod:`r2m.stage.record`), not predicted here.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

from r2m import params as P
from r2m.stage.axes import ALL_DATASETS, AXIS_SOURCES, expand
from r2m.stage.registry import STAGES
from r2m.stage.spec import Gather, Stage


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
    seeded one at each of its run's own seeds (:func:`r2m.stage.axes.expand`; a run its :attr:`Stage.fixed`
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
