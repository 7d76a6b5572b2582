"""The value lists the DAG expands its axes over, and the params each stage instance reads.

Cheap to import (params and pydantic only): Snakemake and the stage registry use it on every run.
"""

from __future__ import annotations

from typing import Any

from r2m.params import TRAIN_STAGES, Params

# value lists the DAG expands axes over; a Gather or Stage may name another list for an axis
# (e.g. the baselines' datasets: ``("dataset", "baselines.datasets")``)
AXIS_SOURCES = {"dataset": "datasets", "variant": "variants", "ckpt": "ckpts", "model": "baselines.models"}
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
}


def axis_value(params: Params, source: str) -> list[str]:
    """The value list named ``source`` (a key of :func:`axis_values`)."""
    return _AXIS_LISTS[source](params)


def axis_values(params: Params) -> dict[str, list[str]]:
    """Every value list an axis can be expanded over, keyed by its params name."""
    return {name: fn(params) for name, fn in _AXIS_LISTS.items()}


def stale_all_datasets(params: Params) -> str | None:
    """A one-line message when the params' ``all_datasets`` (read by DVC) is not the derived list."""
    want = all_datasets(params)
    if params.all_datasets is not None and sorted(params.all_datasets) == sorted(want):
        return None
    have = "missing" if params.all_datasets is None else f"{params.all_datasets}"
    return (f"{ALL_DATASETS}: {have}, but `datasets` + `baselines.datasets` give {want}: write "
            f"`{ALL_DATASETS}: [{', '.join(want)}]` in params.yaml (dvc: -S '{ALL_DATASETS}={want}')")


def pick(dumped: dict[str, Any], key: str, into: dict[str, Any]) -> None:
    """Copy ``key`` (a section, or ``section.item``) of a dumped params mapping into ``into``, nested."""
    section, _, item = key.partition(".")
    if not item:
        into[section] = dumped.get(section)
        return
    into.setdefault(section, {})[item] = (dumped.get(section) or {}).get(item)
