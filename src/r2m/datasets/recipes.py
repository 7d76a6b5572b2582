"""A dataset kind's recipe by name: :data:`r2m.catalogs.RECIPES` names it (its module is imported when
asked for), and the ``references`` stage's work over it."""

from __future__ import annotations

from pathlib import Path

from r2m.catalogs import RECIPES
from r2m.datasets.base import Recipe, check_index, write_references
from r2m.params import DatasetEntry


def recipe(kind: str) -> Recipe:
    """The recipe of ``kind`` (an unknown kind: KeyError listing the known ones)."""
    return RECIPES.load(kind)


def build_references(entry: DatasetEntry, prepared: Path, out: Path, log, dataset: str = "") -> dict[str, int]:
    """The ``references`` stage's work: the entry's references (its recipe's ``references``) over the
    prepared index ``prepared``, checked against it and written into ``out``; returns the counts."""
    refs, train_refs = recipe(entry.kind).references(entry, prepared, log)
    check_index(prepared, refs, f"references of {dataset or 'the dataset'} (kind {entry.kind})")
    return write_references(out, refs, train_refs)
