"""What each stage instance depends on besides its input files: its resolved params and its code.

* **Params.** A stage instance (a stage at one value of each of its axes: dataset, variant, model,
  ckpt) reads the sections its registry entry declares, *as its dataset sees them*: the catalog
  entry's ``overrides`` merged in, the fidelity profile resolved, a baseline's ``per_model`` keys
  applied (:func:`instance_params`). Snakemake uses that mapping as the rule's ``params`` (its params
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
import itertools
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from r2m import params as P
from r2m.pipeline.axes import ALL_DATASETS, AXIS_SOURCES, all_datasets, axis_values, pick
from r2m.pipeline.spec import Gather, Stage
from r2m.pipeline.stages import STAGES

PARAMS_DIR = ".params"  # git-ignored, NOT dvc-ignored: DVC stages depend on the files in it
# catalog entry items that are not the recipe's: they reach stages through the sections they feed
# (overrides, fidelity), are declared on their own (beta, gamma: ``catalog.beta``) or are the seed axis (seeds)
NOT_RECIPE = ("overrides", "fidelity", "beta", "gamma", "seeds")


# --------------------------------------------------------------------------- params
def _view(params: P.Params, dataset: str | None, cache: dict | None,
          seed: str | None = None) -> tuple[P.Params, dict[str, Any]]:
    """The params as ``dataset``'s run ``seed`` sees them (as :class:`~r2m.pipeline.context.StageContext` does)."""
    key = (dataset, seed)
    if cache is not None and key in cache:
        return cache[key]
    view = P.for_dataset(params, dataset) if dataset else params
    view = P.with_seed(view, int(seed)) if seed is not None else view
    out = (view, view.model_dump(mode="json"))
    if cache is not None:
        cache[key] = out
    return out


def instance_params(params: P.Params, stage: Stage, bound: Mapping[str, str],
                    _views: dict | None = None) -> dict[str, Any]:
    """The resolved values one stage instance reads (``bound``: its axis values)."""
    dataset = bound.get("dataset")
    view, dumped = _view(params, dataset, _views, bound.get("seed"))
    data: dict[str, Any] = {}
    for name in stage.params:
        name = name.format(**{a: bound[a] for a in stage.axes})
        head, _, item = name.partition(".")
        if head == "catalog" and dataset:
            entry = dumped["catalog"][dataset]
            data.setdefault("catalog", {}).update(
                {item: entry.get(item)} if item else {k: v for k, v in entry.items() if k not in NOT_RECIPE})
        elif head == "catalog" and item:  # a stage over no dataset reading one item of every entry (seeds)
            data.setdefault("catalog", {}).update({ds: {item: e.get(item)} for ds, e in dumped["catalog"].items()})
        elif head == "catalog":  # a stage over no dataset reading every entry: as each dataset sees it
            others = [n for n in stage.params if n.partition(".")[0] not in ("catalog", "datasets", "baselines")]
            data["catalog"] = {ds: _entry_view(params, ds, others, _views) for ds in params.catalog}
        elif head == "train_sup" and not item and "model" in bound:
            data[head] = view.train_sup.for_model(bound["model"]).model_dump(mode="json")
        else:
            pick(dumped, name, data)
    return data


def _entry_view(params: P.Params, dataset: str, sections: list[str], views: dict | None) -> dict[str, Any]:
    """A catalog entry's recipe items, and the given sections as that dataset sees them."""
    _, dumped = _view(params, dataset, views)
    out = {k: v for k, v in dumped["catalog"][dataset].items() if k not in NOT_RECIPE}
    for name in sections:
        pick(dumped, name, out)
    return out


def canonical(data: Mapping[str, Any]) -> str:
    """One text per meaning: sorted keys, fixed separators."""
    return json.dumps(data, sort_keys=True, indent=1) + "\n"


def instance_key(stage: Stage, bound: Mapping[str, str]) -> str:
    return "-".join(str(bound[a]) for a in stage.axes) or "all"


def params_file(stage: Stage, key: str | None = None) -> str:
    """``.params/<stage>/<axis values>.json``; ``key`` defaults to the ``{axis}`` template."""
    if key is None:
        key = "-".join(f"{{{a}}}" for a in stage.axes) or "all"
    return f"{PARAMS_DIR}/{stage.name}/{key}.json"


@functools.cache
def needed_by_other_datasets(stages: tuple[Stage, ...] = STAGES) -> frozenset[str]:
    """Stages over the default dataset list whose outputs (transitively) feed a stage over another list
    (``prepare`` for the baselines' datasets): they run over ``all_datasets``."""
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
    """Every stage instance the params ask for (the DVC matrix's items; Snakemake builds the subset a
    target needs)."""
    values = {**axis_values(params), ALL_DATASETS: all_datasets(params)}
    for stage in stages:
        lists = [values[axis_source(stage, a)] for a in stage.axes]
        for combo in itertools.product(*lists):
            yield stage, dict(zip(stage.axes, combo, strict=True))


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
    for stage, bound in instances(params):
        data = instance_params(params, stage, bound, views)
        if root is not None:
            data["code"] = code_digest(stage, bound, params, root, data=False)
        out[params_file(stage, instance_key(stage, bound))] = canonical(data)
    return out


def write_params_files(params: P.Params, root: Path = Path(".")) -> list[str]:
    """Every instance's resolved-params file (with its code digest); returns the ones whose content changed."""
    return [rel for rel, text in all_instance_params(params, root).items() if write_if_changed(root / rel, text)]
