"""The files a dataset recipe reads from outside the DAG, and the ``inputs`` stage that digests them.

``prepare`` reads files nobody produces: a ``folder`` entry's ``images`` folder, ``corpus``,
``references`` and ``train_references``; the demo's committed ``photos.yaml``, ``references.json``
and ``corpus.txt``. Each recipe that has such files declares them here (:data:`RECIPE_INPUTS`, kind ->
``fn(entry) -> [path, …]``; folders are walked), and both DAG tools see them through one file:

- the ``inputs`` stage writes ``data/<dataset>/inputs.json``: every such file with its size and
  SHA-256 (:mod:`r2m.utils.digest`; its stat cache in ``.r2m/digests/`` keeps re-runs to one
  ``stat`` per unchanged file);
  ``prepare`` depends on it, so an edited input re-runs ``prepare`` and what follows, and an
  unchanged one (same bytes) re-runs nothing;
- DVC runs ``inputs`` at every ``repro`` (``always_changed``; cheap), Snakemake when the digest of
  what it would record changes (:func:`input_digest`, a rule param compared by content). JSON and
  YAML files count by their parsed content, so a comment or a reformatting re-runs nothing.

The paper benchmarks are left out: their raw sources are fixed downloads checked by ``prepare``.
Cheap to import (no torch, no pandas): Snakemake calls :func:`input_files` while planning.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from r2m.datasets.base import option
from r2m.params import DatasetEntry
from r2m.utils.digest import digest_files, expand
from r2m.utils.registry import Registry

RECIPE_INPUTS: Registry[Callable[[DatasetEntry], list[Path]]] = Registry("dataset inputs")
DIGEST_CACHE = Path(".r2m/digests")

FOLDER_KEYS = ("images", "corpus", "references", "train_references")
DEMO_FILES = ("photos.yaml", "references.json", "corpus.txt")


@RECIPE_INPUTS.register("folder")
def folder_inputs(entry: DatasetEntry) -> list[Path]:
    """The ``folder`` entry's paths (those it names; absence is the recipe's check to report)."""
    from r2m.datasets.folder import image_files  # the images: the recipe's own rule (list_images)

    return [f for k in FOLDER_KEYS if (v := option(entry, k)) is not None
            for f in (image_files(Path(str(v)).expanduser()) if k == "images" else [Path(str(v)).expanduser()])]


@RECIPE_INPUTS.register("demo")
def demo_inputs(entry: DatasetEntry) -> list[Path]:
    """The demo's committed files in its ``source_dir`` (resolved as the recipe resolves it)."""
    from r2m.datasets.demo import source_dir

    source = source_dir(entry)
    return [source / name for name in DEMO_FILES]


def declared_inputs(entry: DatasetEntry) -> list[Path]:
    """The files and folders ``entry``'s recipe reads from outside the DAG (none for most kinds)."""
    return RECIPE_INPUTS.get(entry.kind)(entry) if entry.kind in RECIPE_INPUTS else []


def input_files(params: Any, dataset: str) -> list[str]:
    """Every existing file the dataset's recipe reads."""
    entry = params.catalog.get(dataset)
    if entry is None:
        return []
    return [str(f) for f in expand(declared_inputs(entry)) if f.is_file()]


def input_records(entry: DatasetEntry, dataset: str, root: Path = Path(".")) -> list[dict[str, Any]]:
    """What ``inputs.json`` records of each file: JSON/YAML by their parsed content (a comment changes
    nothing), every other file by its bytes (:func:`r2m.utils.digest.digest_files`)."""
    return digest_files(expand(declared_inputs(entry)), root / DIGEST_CACHE / "inputs" / f"{dataset}.json",
                        parsed=True)


def input_digest(params: Any, dataset: str) -> str:
    """Snakemake's ``external`` param of ``inputs`` (:attr:`r2m.pipeline.spec.Stage.external`): one digest
    of :func:`input_records`, compared by content, so ``inputs`` re-runs when, and only when, what it
    would record changes (a touched or re-commented file re-runs nothing)."""
    import hashlib
    import json

    entry = params.catalog.get(dataset)
    records = input_records(entry, dataset) if entry is not None else []
    return hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()


def run(ctx) -> None:
    """DAG stage ``inputs``: ``data/<dataset>/inputs.json``, the digest of the recipe's external files."""
    from r2m.utils.io import write_json

    declared = declared_inputs(ctx.entry)
    files = input_records(ctx.entry, ctx.dataset, ctx.root)
    missing = [f["path"] for f in files if f.get("missing")]
    if missing:
        ctx.log.warning("inputs: %d declared input(s) missing (prepare will say more): %s",
                        len(missing), ", ".join(missing[:5]))
    write_json(ctx.outs["inputs"], {"dataset": ctx.dataset, "kind": ctx.entry.kind,
                                    "declared": [str(p) for p in declared], "files": files})
    ctx.log.info("inputs: %d file(s) of %d declared path(s) digested", len(files), len(declared))
