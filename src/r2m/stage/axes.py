"""The value lists the DAG expands its axes over, and the params each stage instance reads.

Cheap to import (params and pydantic only): Snakemake and the stage registry use it on every run.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from r2m.params import TRAIN_STAGES, Params, seeds_for

# value lists the DAG expands axes over; a Gather or Stage may name another list for an axis
# (e.g. the baselines' datasets: ``("dataset", "baselines.datasets")``). The seed axis has no list of its
# own: each run takes its own seeds (:func:`run_seeds`: the dataset's, per variant or baseline)
AXIS_SOURCES = {"dataset": "datasets", "variant": "variants", "ckpt": "ckpts", "model": "baselines.models",
                "seed": "seeds"}
# the dataset list of the data stages other lists' stages need (:func:`all_datasets`)
ALL_DATASETS = "all_datasets"


def all_datasets(params: Params) -> list[str]:
    """Every dataset some stage runs for: ``datasets``, then ``baselines.datasets`` not yet named."""
    out = list(params.datasets)
    out += [d for d in params.baselines.datasets if d not in out]
    return out


# every value list an axis can be expanded over, keyed by its params name (read only when asked
# for: a stage gathering over datasets reads `datasets`, not the other lists)
_AXIS_LISTS: dict[str, Any] = {
    "datasets": lambda p: list(p.datasets),
    "variants": lambda p: list(p.variants),
    "ckpts": lambda p: list(TRAIN_STAGES),
    "baselines.models": lambda p: list(p.baselines.models),
    "baselines.datasets": lambda p: list(p.baselines.datasets),
    ALL_DATASETS: all_datasets,
}


def axis_value(params: Params, source: str) -> list[str]:
    """The value list named ``source`` (a key of :data:`_AXIS_LISTS`)."""
    return _AXIS_LISTS[source](params)


def run_seeds(params: Params, keys: Mapping[str, str]) -> list[str]:
    """The seeds of the run ``keys`` names (its dataset and variant or baseline model)."""
    return [str(s) for s in seeds_for(params, keys["dataset"], keys.get("variant") or keys.get("model"))]


def expand(params: Params, over: tuple[str, ...], source: Callable[[str], str],
           bound: Mapping[str, str]) -> Iterator[dict[str, str]]:
    """Every combination of the ``over`` axes (values from the list ``source(axis)`` names), ``bound`` filled
    in; a ``seed`` among them takes the seeds of each combination's run (:func:`run_seeds`), last."""
    plain = [a for a in over if a != "seed"]
    for combo in itertools.product(*(axis_value(params, source(a)) for a in plain)):
        keys = {**bound, **dict(zip(plain, combo, strict=True))}
        if "seed" not in over:
            yield keys
            continue
        for seed in run_seeds(params, keys):
            yield {**keys, "seed": seed}


def gathered(params: Params, gather: Any, bound: Mapping[str, str]) -> list[tuple[dict[str, str], str]]:
    """(axis values, path) of every file or folder a :class:`~r2m.stage.spec.Gather` dependency names for the
    instance at ``bound``: one per combination of its ``over`` axes (:func:`expand`), its ``fixed`` values pinned.
    The one expansion the engines (Snakemake's inputs, ``snakemake all``'s instances) and the stages
    (``StageContext.gather``) share."""
    keys = expand(params, gather.over, gather.source, {**bound, **dict(gather.fixed)})
    return [(k, gather.pattern.format(**k)) for k in keys]


def pick(dumped: dict[str, Any], key: str, into: dict[str, Any]) -> None:
    """Copy ``key`` (a section, or ``section.item``) of a dumped params mapping into ``into``, nested."""
    section, _, item = key.partition(".")
    if not item:
        into[section] = dumped.get(section)
        return
    into.setdefault(section, {})[item] = (dumped.get(section) or {}).get(item)
