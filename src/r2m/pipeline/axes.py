"""The value lists the DAG expands its axes over, and the params each stage instance reads.

Cheap to import (params and pydantic only): Snakemake and the stage registry use it on every run.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from r2m.params import TRAIN_STAGES, Params, all_seeds, seeds_for

# every seed some run uses (DVC's matrix; the derived params key): a stage's instances run over it, while a
# Gather takes each run's own seeds (:func:`run_seeds`: the dataset's, per variant or baseline)
ALL_SEEDS = "all_seeds"
# value lists the DAG expands axes over; a Gather or Stage may name another list for an axis
# (e.g. the baselines' datasets: ``("dataset", "baselines.datasets")``)
AXIS_SOURCES = {"dataset": "datasets", "variant": "variants", "ckpt": "ckpts", "model": "baselines.models",
                "seed": ALL_SEEDS}
# the dataset list of the data stages other lists' stages need (DVC: the derived params key)
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
    ALL_SEEDS: lambda p: [str(s) for s in all_seeds(p)],
}


def axis_value(params: Params, source: str) -> list[str]:
    """The value list named ``source`` (a key of :func:`axis_values`)."""
    return _AXIS_LISTS[source](params)


def axis_values(params: Params) -> dict[str, list[str]]:
    """Every value list an axis can be expanded over, keyed by its params name."""
    return {name: fn(params) for name, fn in _AXIS_LISTS.items()}


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
    """(axis values, path) of every file or folder a :class:`~r2m.pipeline.spec.Gather` dependency names for the
    instance at ``bound``: one per combination of its ``over`` axes (:func:`expand`), its ``fixed`` values pinned.
    The one expansion the engines (Snakemake's inputs, ``snakemake all``'s instances) and the stages
    (``StageContext.gather``) share."""
    keys = expand(params, gather.over, gather.source, {**bound, **dict(gather.fixed)})
    return [(k, gather.pattern.format(**k)) for k in keys]


def _stale(key: str, have: list | None, want: list, source: str) -> str | None:
    """A one-line message when the derived list ``key`` in the params (read by DVC) is not ``want``."""
    if have is not None and sorted(have) == sorted(want):
        return None
    shown = "missing" if have is None else f"{have}"
    return (f"{key}: {shown}, but {source} give {want}: write `{key}: [{', '.join(map(str, want))}]` in "
            f"params.yaml (dvc: -S '{key}={want}')")


def stale_all_seeds(params: Params) -> str | None:
    """A one-line message when the params' ``all_seeds`` (read by DVC) is not the derived list."""
    return _stale(ALL_SEEDS, params.all_seeds, all_seeds(params), "`seeds` and the catalog entries' `seeds`")


def stale_all_datasets(params: Params) -> str | None:
    """A one-line message when the params' ``all_datasets`` (read by DVC) is not the derived list."""
    return _stale(ALL_DATASETS, params.all_datasets, all_datasets(params), "`datasets` + `baselines.datasets`")


def pick(dumped: dict[str, Any], key: str, into: dict[str, Any]) -> None:
    """Copy ``key`` (a section, or ``section.item``) of a dumped params mapping into ``into``, nested."""
    section, _, item = key.partition(".")
    if not item:
        into[section] = dumped.get(section)
        return
    into.setdefault(section, {})[item] = (dumped.get(section) or {}).get(item)
