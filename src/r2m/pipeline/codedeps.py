"""A stage instance's code dependencies: every module under ``src/r2m`` it can load, and nothing else.

Three parts, all read from the source (nothing is imported):

* **Imports.** The modules its entry (``impl``) and the stage runner (:data:`RUNNER`: ``r2m.cli``, which
  validates the params, builds the :class:`~r2m.pipeline.context.StageContext` and calls the entry)
  import, transitively — any import statement, lazy ones included (:func:`r2m.utils.imports.closure`).
* **Loads by name.** A registry whose members are imported when one is asked for names the module of
  each member in a declared table; an instance loads the one its values pick (:func:`by_name`): the
  recipe of its dataset's kind (:data:`r2m.datasets.recipes.RECIPE_MODULES`) where ``prepare`` /
  ``references`` build it or the runner runs the kind's check (there the loader itself too,
  :data:`r2m.pipeline.validate.RECIPE_LOADER`: the runner imports it by name); the detector backend its dataset's
  ``detect_concepts.backend`` names (:data:`r2m.vision.detectors.BACKEND_MODULES`) where a detector is
  built (and those its ``options.parts`` names); the feature backends its ``extract_features`` and
  ``sup_features`` name (:data:`r2m.vision.extractors.FEATURE_MODULES`) where an extractor is built; the baseline its ``model`` names (:func:`r2m.models.sup_model_module`);
  its model's inspector (:data:`r2m.supervised.inspect.INSPECTOR_MODULES`) where ``inspect_sup`` runs one, and the
  module that trains its model's CNN end to end (:data:`r2m.supervised.train.END_TO_END_MODULES`) where a
  baseline is trained, the training itself where ``pretrain_sup``'s model has a pretraining phase
  (:data:`r2m.supervised.pretrain.PRETRAINING_MODULES`) (:data:`MODEL_TABLES`).
* **Not code:** the registry's definition of the stage (:data:`NOT_CODE`: what it says of a stage — command,
  paths, params — both engines compare on their own) and :mod:`r2m.params`, whose effect on an instance
  its resolved params already carry (:mod:`r2m.pipeline.resolved`).

Snakemake gets :func:`code_digest` as a rule param; DVC reads the same digest from the instance's
``.params/<stage>/<key>.json`` (written by ``r2m resolve-params``, which re-runs on any ``src`` change), so
both engines re-run exactly the instances that can load an edited file. The check that this is not
circular: ``R2M_AUDIT_MODULES=<dir>`` makes every stage run record the ``r2m`` modules it loaded
(``r2m.cli._record_loaded``), and tests/test_code_deps.py requires loaded ⊆ declared for every instance of
the tiny DAG and a few more.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from r2m import params as P
from r2m.pipeline.spec import Stage
from r2m.pipeline.validate import RECIPE_LOADER  # the runner loads it by name where it checks a kind
from r2m.utils.declared import sup_model_modules
from r2m.utils.imports import PKG, closure_modules, declared_table, module_file

RUNNER = "r2m.cli"  # runs every stage's impl (r2m.cli.run_stage)
# the stage registry and the params schema: not code a stage runs (see the module docstring)
NOT_CODE = ("r2m.pipeline.stages", "r2m.pipeline.sup_stages", "r2m.pipeline.spec", "r2m.params")
# the loaders: a stage whose entry imports one of these can load the members its instance names
DETECTOR_LOADER, MODEL_LOADER = "r2m.vision.detectors", "r2m.models"
FEATURE_LOADER = "r2m.vision.extractors"
# loaders whose member the instance's model picks: (module, its declared table model -> module)
MODEL_TABLES = (("r2m.supervised.inspect", "INSPECTOR_MODULES"), ("r2m.supervised.train", "END_TO_END_MODULES"),
                ("r2m.supervised.pretrain", "PRETRAINING_MODULES"))


def entry_module(stage: Stage) -> str:
    return stage.impl.partition(":")[0]


def static_modules(stage: Stage, pkg: Path = PKG) -> frozenset[str]:
    """What the entry and the runner import (transitively)."""
    return closure_modules((entry_module(stage),), pkg, NOT_CODE) | closure_modules((RUNNER,), pkg, NOT_CODE)


@functools.cache
def _checked_kinds() -> frozenset[str]:
    return frozenset(P.registered_names(P.RECIPE_SOURCES, "RECIPE_CHECKS"))


_views: dict[tuple[int, str], tuple[P.Params, str, tuple[str, ...], tuple[str, ...]]] = {}


def _feature_backends(section: Any) -> list[str]:
    """A feature section's backend and those its ``options.kinds_from`` names."""
    more = (section.options.get("kinds_from") or {}).values()
    return [section.backend, *(m.get("backend") for m in more if isinstance(m, dict) and isinstance(m.get("backend"), str))]


def _dataset_facts(params: P.Params, dataset: str) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(recipe kind, detector backends, feature backends) of ``dataset`` as it sees the params (cached per
    params object): ``detect_concepts.backend`` and the backends its ``options.parts`` names (``offline``'s
    parts); ``extract_features`` and ``sup_features``' backends and their ``kinds_from`` ones."""
    hit = _views.get((id(params), dataset))
    if hit is None or hit[0] is not params:
        view = P.for_dataset(params, dataset)
        det = view.detect_concepts
        parts = det.options.get("parts") or ()
        detectors = (det.backend, *(p for p in parts if isinstance(p, str)))
        features = (*_feature_backends(view.extract_features), *_feature_backends(view.sup_features))
        hit = _views[(id(params), dataset)] = (params, params.catalog[dataset].kind, detectors, features)
    return hit[1], hit[2], hit[3]


def by_name(stage: Stage, bound: Mapping[str, str], params: P.Params, pkg: Path = PKG) -> set[str]:
    """The modules the instance loads by name, from the declared tables (each one's closure follows): those the
    loaders its entry reaches pick, then those the loaders the picked modules reach pick, until none is new (an
    inspector, loaded by name, loads its baseline's model by name)."""
    loaded: set[str] = set()
    while True:
        more = _picked(stage, bound, params, closure_modules((entry_module(stage), *sorted(loaded)), pkg, NOT_CODE),
                       pkg)
        if more <= loaded:
            return loaded
        loaded |= more


def _picked(stage: Stage, bound: Mapping[str, str], params: P.Params, entry: frozenset[str], pkg: Path) -> set[str]:
    """The modules the loaders in ``entry`` (what the instance imports, the runner aside) load for its values."""
    out: set[str | None] = set()
    dataset = bound.get("dataset")
    if dataset is not None and dataset in params.catalog:
        kind, backends, features = _dataset_facts(params, dataset)
        runner_checks = stage.source("dataset") != "baselines.datasets" and kind in _checked_kinds()
        if runner_checks:  # r2m.pipeline.validate.check_files: the kind's own check, through the loader (by name)
            out.add(RECIPE_LOADER)
        if RECIPE_LOADER in entry or runner_checks:
            out.add(declared_table(RECIPE_LOADER, "RECIPE_MODULES", pkg).get(kind))
        if DETECTOR_LOADER in entry:
            out |= {declared_table(DETECTOR_LOADER, "BACKEND_MODULES", pkg).get(b) for b in backends}
        if FEATURE_LOADER in entry:
            out |= {declared_table(FEATURE_LOADER, "FEATURE_MODULES", pkg).get(b) for b in features}
    if "model" in bound and MODEL_LOADER in entry:
        out.add(sup_model_modules(module_file(MODEL_LOADER, pkg).parent, MODEL_LOADER).get(bound["model"]))
    if "model" in bound:
        out |= {declared_table(mod, table, pkg).get(bound["model"]) for mod, table in MODEL_TABLES if mod in entry}
    return {m for m in out if m is not None}


def code_modules(stage: Stage, bound: Mapping[str, str], params: P.Params, pkg: Path = PKG) -> frozenset[str]:
    """Every ``r2m`` module the instance can load (:data:`NOT_CODE` aside)."""
    loaded = by_name(stage, bound, params, pkg)
    return static_modules(stage, pkg) | closure_modules(tuple(sorted(loaded)), pkg, NOT_CODE)


def code_files(stage: Stage, bound: Mapping[str, str], params: P.Params, pkg: Path = PKG) -> list[str]:
    """The files of :func:`code_modules`, relative to the project root (``src/r2m/...``)."""
    root = pkg.parent.parent
    return sorted(str(module_file(m, pkg).relative_to(root)) for m in code_modules(stage, bound, params, pkg))


def code_digest(stage: Stage, bound: Mapping[str, str], params: P.Params, root: Path = Path("."),
                data: bool = True) -> str:
    """One digest of the contents of the instance's :func:`code_files` (and, with ``data``, its declared
    :attr:`Stage.data`: DVC lists those as deps of their own). A content digest: an edit undone re-runs nothing."""
    h = hashlib.sha256()
    for rel in code_files(stage, bound, params) + (list(stage.data) if data else []):
        h.update(f"{rel}\0{_tree_digest(root / rel)}\n".encode())
    return h.hexdigest()


@functools.cache
def _tree_digest(path: Path) -> str:
    """Once per file and process (every instance reads the same utils)."""
    from r2m.utils.digest import tree_digest

    return tree_digest(path) if path.exists() else "missing"
