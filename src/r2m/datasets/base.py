"""The dataset-recipe interface.

A recipe turns a catalog entry (``params.yaml: catalog.<name>``) into the prepared folder
described in ``docs/ARCHITECTURE.md``: ``images.parquet``, ``references.json``, ``corpus.txt``,
optional ``detections.jsonl``, optional ``train_references.json`` (paired captions of the train
images, for the supervised baselines) and ``manifest.json``. Recipes register themselves with
``@RECIPES.register("<kind>")`` and are functions ``(entry, out_dir, log) -> manifest dict``.
The prepare stage gives them a temporary folder and renames it into place on success.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from r2m.params import DatasetEntry
from r2m.utils.registry import Registry

RecipeFn = Callable[[DatasetEntry, Path, logging.Logger], dict[str, Any]]
RECIPES: Registry[RecipeFn] = Registry("dataset kind")
# optional up-front checks of a recipe's options (referenced files), run when params are validated
# (``r2m.pipeline.validate.check_files``): ``fn(entry)`` raising OSError/ValueError naming the key
RECIPE_CHECKS: Registry[Callable[[DatasetEntry], None]] = Registry("dataset check")
SPLITS = ("train", "val", "test")
TRAIN_REFERENCES = "train_references.json"  # optional: paired captions of the train images


def option(entry: DatasetEntry, key: str, default: Any = None, required: bool = False) -> Any:
    """A recipe option from the catalog entry, with an error naming the key when required."""
    extra = entry.model_extra or {}
    if key not in extra:
        if required:
            raise ValueError(f"catalog entry of kind {entry.kind!r} needs the key {key!r}")
        return default
    return extra[key]


def references_json(images: Iterable[dict[str, Any]], captions: dict[str, list[str]]) -> dict[str, Any]:
    """COCO caption-annotation JSON for the given images ({"id", "file_name", "split"})."""
    imgs, anns = [], []
    for img in images:
        imgs.append({"id": str(img["id"]), "file_name": img.get("file_name", ""), "split": img.get("split", "test")})
        for cap in captions.get(str(img["id"]), []):
            anns.append({"id": len(anns) + 1, "image_id": str(img["id"]), "caption": cap})
    return {"info": {}, "licenses": [], "type": "captions", "images": imgs, "annotations": anns}


def write_prepared(
    out: Path,
    images: Any,  # pandas.DataFrame with image_id, path, split
    references: dict[str, Any],
    corpus: Iterable[str],
    manifest: dict[str, Any],
    train_references: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write the standard prepared files into ``out`` (a fresh temporary folder).

    ``train_references`` (COCO caption JSON for ``train`` images) is written as
    ``train_references.json`` when the dataset has paired training captions (supervised baselines)."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    bad = set(images["split"]) - set(SPLITS)
    if bad:
        raise ValueError(f"images.parquet: unknown split(s) {sorted(bad)}; expected {SPLITS}")
    images = images.astype({"image_id": str, "path": str, "split": str})
    images.to_parquet(out / "images.parquet", index=False)
    (out / "references.json").write_text(json.dumps(references))
    if train_references is not None:
        (out / TRAIN_REFERENCES).write_text(json.dumps(train_references))
    n = 0
    with open(out / "corpus.txt", "w", encoding="utf-8") as fh:
        for line in corpus:
            fh.write(" ".join(line.splitlines()).strip() + "\n")  # one line, whatever breaks it held
            n += 1
    manifest = {
        **manifest,
        "n_images": {s: int((images["split"] == s).sum()) for s in SPLITS},
        "n_references": len(references.get("annotations", [])),
        "n_train_references": len(train_references.get("annotations", [])) if train_references else 0,
        "n_sentences": n,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def split_ids(prepared_dir: str | Path, split: str) -> list[str]:
    """The image ids of one split of ``<prepared>/images.parquet``, in file order; a split with no
    image is an error naming the file and the splits it has (``caption.split: val`` on a dataset
    without val images used to write an empty captions file over the good one, and exit 0)."""
    import pyarrow.parquet as pq

    path = Path(prepared_dir) / "images.parquet"
    images = pq.read_table(path, columns=["image_id", "split"]).to_pandas()
    ids = [str(i) for i in images.loc[images["split"] == split, "image_id"]]
    if not ids:
        have = {str(k): int(v) for k, v in images["split"].value_counts().items()}
        raise ValueError(f"{path}: no {split!r} image (split: {split}; the dataset has {have})")
    return ids


def resolve_image_path(prepared_dir: str | Path, path: str | Path) -> Path:
    """Where an ``images.parquet`` ``path`` points: absolute paths as they are; a relative path is
    taken relative to the prepared folder (the folder holding ``images.parquet``) when that file
    exists, else relative to the current directory (the repository root, where stages run)."""
    p = Path(path)
    if p.is_absolute():
        return p
    local = Path(prepared_dir) / p
    if local.exists() or not p.exists():
        return local
    return p
