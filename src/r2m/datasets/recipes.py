"""Which module defines each dataset kind, and the by-name loading of one recipe.

The recipe modules register their kinds on import (``@RECIPES.register``); nothing imports them all.
A stage loads the one module its dataset's kind names (:data:`RECIPE_MODULES`), so its code
dependencies (:mod:`r2m.pipeline.codedeps`) hold that file and no other recipe's: editing
``datasets/tiny.py`` re-runs nothing of the ``demo`` dataset.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from r2m.datasets.base import RECIPE_CHECKS, RECIPES, REFERENCE_BUILDERS, check_index, write_references
from r2m.params import DatasetEntry
from r2m.utils.registry import load_member

# dataset kind -> the module that registers it (tests/test_code_deps.py checks it against the source)
RECIPE_MODULES: dict[str, str] = {
    "tiny": "r2m.datasets.tiny",
    "demo": "r2m.datasets.demo",
    "folder": "r2m.datasets.folder",
    "coco_shutterstock": "r2m.datasets.benchmarks",
    "flickr30k_coco": "r2m.datasets.benchmarks",
    "coco_gcc": "r2m.datasets.benchmarks",
}


def recipe_module(kind: str) -> str | None:
    return RECIPE_MODULES.get(kind)


def load_recipe(kind: str) -> None:
    """Import the module registering ``kind`` (an unknown kind: the registry's own error at ``get``)."""
    load_member(RECIPE_MODULES, kind)


def load_recipes() -> None:
    """Every recipe module (``r2m datasets`` lists them all)."""
    for kind in RECIPE_MODULES:
        load_recipe(kind)


def recipe_attr(kind: str, name: str):
    """``name`` of the module defining ``kind`` (imported now): a kind's own helpers, used by name."""
    module = recipe_module(kind)
    if module is None:
        raise KeyError(f"unknown dataset kind {kind!r}")
    return getattr(importlib.import_module(module), name)


def recipe(kind: str):
    load_recipe(kind)
    return RECIPES.get(kind)


def recipe_check(kind: str):
    load_recipe(kind)
    return RECIPE_CHECKS.get(kind)


def build_references(entry: DatasetEntry, prepared: Path, out: Path, log, dataset: str = "") -> dict[str, int]:
    """The ``references`` stage's work: the entry's references (its kind's ``REFERENCE_BUILDERS``) over
    the prepared index ``prepared``, checked against it and written into ``out``; returns the counts."""
    load_recipe(entry.kind)
    refs, train_refs = REFERENCE_BUILDERS.get(entry.kind)(entry, prepared, log)
    check_index(prepared, refs, f"references of {dataset or 'the dataset'} (kind {entry.kind})")
    return write_references(out, refs, train_refs)
