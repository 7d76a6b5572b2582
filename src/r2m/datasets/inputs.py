"""The files a dataset recipe reads from outside the DAG, and the ``inputs`` stage that digests them.

``prepare`` reads files nobody produces: a ``folder`` entry's ``images`` folder and ``corpus``; the
demo's committed ``photos.yaml`` and ``corpus.txt``. The ``references`` stage reads the reference
captions: a ``folder`` entry's ``references`` and ``train_references``, the demo's ``references.json``.
Each recipe that has such files declares them here (:data:`RECIPE_INPUTS` for ``prepare``,
:data:`REFERENCE_INPUTS` for ``references``; kind -> ``fn(entry) -> [path, …]``; folders are walked):

- the ``inputs`` stage writes ``data/<dataset>/inputs.json``: every file ``prepare`` reads with its
  size and SHA-256 (:mod:`r2m.utils.digest`; its stat cache in ``.r2m/digests/`` keeps re-runs to one
  ``stat`` per unchanged file); ``prepare`` depends on it, so an edited input re-runs ``prepare`` and
  what follows, and an unchanged one (same bytes) re-runs nothing. A reference file counts there only
  by what ``prepare`` reads of it (:data:`INDEXED`: a ``folder`` entry's reference files by the image
  list that defines its ids and splits), so a caption's words never re-run ``prepare``;
- the ``references`` stage depends on the digest of its files itself (:func:`reference_digest`);
- DVC runs both at every ``repro`` (``always_changed``; cheap), Snakemake when the digest of what they
  would record changes (:func:`input_digest`, :func:`reference_digest`: rule params compared by
  content). JSON and YAML files count by their parsed content, so a comment or a reformatting re-runs
  nothing; a file ``prepare`` reads through a view (:data:`VIEWED`: the demo's ``photos.yaml``, by each
  photo's id, package, resource and sha256) counts by that view, so a photo's description re-runs nothing.

The paper benchmarks are left out: their raw sources are fixed downloads checked by ``prepare``.
Cheap to import (no torch, no pandas): Snakemake calls :func:`input_files` while planning.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from r2m.datasets.base import option
from r2m.params import DatasetEntry
from r2m.stage.context import StageContext
from r2m.utils.digest import data_digest, digest_files, expand
from r2m.utils.registry import Registry

RECIPE_INPUTS: Registry[Callable[[DatasetEntry], list[Path]]] = Registry("dataset inputs")
REFERENCE_INPUTS: Registry[Callable[[DatasetEntry], list[Path]]] = Registry("dataset reference inputs")
DIGEST_CACHE = Path(".r2m/digests")

FOLDER_KEYS = ("images", "corpus")
FOLDER_REFERENCE_KEYS = ("references", "train_references")
DEMO_FILES = ("photos.yaml", "corpus.txt")
DEMO_REFERENCES = ("references.json",)


def _folder_paths(entry: DatasetEntry, keys: tuple[str, ...]) -> list[Path]:
    """The ``folder`` entry's paths of ``keys`` (those it names; absence is the recipe's check to report)."""
    from r2m.datasets.folder import image_files  # the images: the recipe's own rule (list_images)

    return [f for k in keys if (v := option(entry, k)) is not None
            for f in (image_files(Path(str(v)).expanduser()) if k == "images" else [Path(str(v)).expanduser()])]


def _demo_paths(entry: DatasetEntry, names: tuple[str, ...]) -> list[Path]:
    """The demo's committed files in its ``source_dir`` (resolved as the recipe resolves it)."""
    from r2m.datasets.demo import source_dir

    source = source_dir(entry)
    return [source / name for name in names]


def _declare(kind: str, paths: Callable[[DatasetEntry, tuple[str, ...]], list[Path]], prepare: tuple[str, ...],
             references: tuple[str, ...]) -> None:
    """``kind``'s files outside the DAG: those ``prepare`` reads and the reference files (``paths`` of each)."""
    RECIPE_INPUTS.register(kind)(lambda entry: paths(entry, prepare))
    REFERENCE_INPUTS.register(kind)(lambda entry: paths(entry, references))


_declare("folder", _folder_paths, FOLDER_KEYS, FOLDER_REFERENCE_KEYS)
_declare("demo", _demo_paths, DEMO_FILES, DEMO_REFERENCES)


def _index_view(data: Any) -> Any:
    from r2m.datasets.folder import reference_index

    return reference_index(data)


# kind -> what ``prepare`` reads of the reference files (REFERENCE_INPUTS), digested under that name
INDEXED: dict[str, tuple[str, Callable[[Any], Any]]] = {"folder": ("index", _index_view)}
# kind -> {file name: view}: a file ``prepare`` reads through a view (r2m.utils.reads.VIEWS), digested by it
VIEWED: dict[str, dict[str, str]] = {"demo": {"photos.yaml": "demo_photos"}}


def _declared(registry: Registry[Callable[[DatasetEntry], list[Path]]], entry: DatasetEntry) -> list[Path]:
    return registry.get(entry.kind)(entry) if entry.kind in registry else []


def declared_inputs(entry: DatasetEntry) -> list[Path]:
    """The files and folders ``entry``'s ``prepare`` reads from outside the DAG (none for most kinds)."""
    return _declared(RECIPE_INPUTS, entry) + (_declared(REFERENCE_INPUTS, entry) if entry.kind in INDEXED else [])


def input_files(params: Any, dataset: str) -> list[str]:
    """Every existing file the dataset's recipe reads (``prepare`` and ``references``)."""
    entry = params.catalog.get(dataset)
    if entry is None:
        return []
    paths = _declared(RECIPE_INPUTS, entry) + _declared(REFERENCE_INPUTS, entry)
    return [str(f) for f in expand(paths) if f.is_file()]


def input_records(entry: DatasetEntry, dataset: str, root: Path = Path(".")) -> list[dict[str, Any]]:
    """What ``inputs.json`` records of each file ``prepare`` reads: JSON/YAML by their parsed content (a
    comment changes nothing), every other file by its bytes (:func:`r2m.utils.digest.digest_files`), a
    reference file by what ``prepare`` reads of it (:data:`INDEXED`)."""
    cache = root / DIGEST_CACHE / "inputs" / f"{dataset}.json"
    files = expand(_declared(RECIPE_INPUTS, entry))
    views = VIEWED.get(entry.kind, {})
    plain = iter(digest_files([f for f in files if f.name not in views], cache, parsed=True))
    records = [_view_record(f, views[f.name]) if f.name in views else next(plain) for f in files]
    if entry.kind in INDEXED:
        records += digest_files(expand(_declared(REFERENCE_INPUTS, entry)), cache.with_suffix(".index.json"),
                                view=INDEXED[entry.kind])
    return records


def _view_record(path: Path, view: str) -> dict[str, Any]:
    """``{"path", "<view>_sha256"}``: a file digested by what ``view`` reads of it (recorded as that view while
    the ``inputs`` stage runs); a missing one (or no file) as :func:`r2m.utils.digest.digest_files` says, one the
    view cannot read by its bytes (``prepare`` reports the error)."""
    from r2m.utils.reads import read_view, view_digest

    if not path.is_file():
        return digest_files([path])[0]  # {"path", "missing": true}; a FIFO or device is refused
    try:
        return {"path": str(path), f"{view}_sha256": view_digest(read_view(path, view))}
    except (OSError, ValueError, RecursionError):
        return digest_files([path])[0]


def reference_records(entry: DatasetEntry, dataset: str, root: Path = Path(".")) -> list[dict[str, Any]]:
    """What the ``references`` stage depends on: its reference files by their parsed content."""
    return digest_files(expand(_declared(REFERENCE_INPUTS, entry)),
                        root / DIGEST_CACHE / "references" / f"{dataset}.json", parsed=True)


def input_digest(params: Any, dataset: str) -> str:
    """Snakemake's ``external`` param of ``inputs`` (:attr:`r2m.stage.spec.Stage.external`): one digest
    of :func:`input_records`, compared by content, so ``inputs`` re-runs when, and only when, what it
    would record changes (a touched or re-commented file re-runs nothing)."""
    entry = params.catalog.get(dataset)
    return data_digest(input_records(entry, dataset) if entry is not None else [], spaced=True)


def reference_digest(params: Any, dataset: str) -> str:
    """The ``external`` param of ``references``: one digest of :func:`reference_records` (as
    :func:`input_digest`)."""
    entry = params.catalog.get(dataset)
    return data_digest(reference_records(entry, dataset) if entry is not None else [], spaced=True)


def run(ctx: StageContext) -> None:
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
