"""The dataset-recipe interface.

A recipe turns a catalog entry (``params.yaml: catalog.<name>``) into two folders described in
``docs/ARCHITECTURE.md``:

* ``prepared/`` (stage ``prepare``): ``images.parquet``, ``corpus.txt``, optional
  ``detections.jsonl`` and ``manifest.json`` — what detection, features and the text stages read.
  A kind's recipe (a :class:`Recipe`, named in :data:`r2m.catalogs.RECIPES`) prepares it with a function
  ``(entry, out_dir, log) -> manifest dict``; the stage gives it a temporary folder and renames it
  into place on success. They never read a reference caption (only, for ``folder``, which images
  the reference files list: that defines the image ids and splits).
* ``references/`` (stage ``references``): ``references.json`` (the ``val``/``test`` images) and
  optional ``train_references.json`` (paired captions of the train images, for the supervised
  baselines), built by the recipe's ``references``
  ``(entry, prepared_dir, log) -> (references, train_references or None)`` from the recipe's caption
  source and the prepared image index. So an edit of a caption's words re-runs what reads references
  (evaluation, checkpoint selection, the baselines) and not detection, features or text training.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from r2m.params import DatasetEntry
from r2m.utils.reads import note_item, unrecorded

RecipeFn = Callable[[DatasetEntry, Path, logging.Logger], dict[str, Any]]
References = dict[str, Any]  # COCO caption-annotation JSON (references_json)
ReferenceBuilder = Callable[[DatasetEntry, Path, logging.Logger], tuple[References, References | None]]
SPLITS = ("train", "val", "test")
REFERENCES = "references.json"  # the val/test images' captions (stage ``references``)
TRAIN_REFERENCES = "train_references.json"  # optional: paired captions of the train images



@dataclass(frozen=True)
class Recipe:
    """A dataset kind's two steps: ``prepare`` (stage ``prepare``) and ``references`` (stage ``references``).
    A kind may also check its options up front (``check`` in its :class:`r2m.catalogs.Kind`): ``fn(entry)``
    raising OSError/ValueError naming the key, run when params are validated."""

    prepare: RecipeFn
    references: ReferenceBuilder


def option(entry: DatasetEntry, key: str, default: Any = None, required: bool = False) -> Any:
    """A recipe option from the catalog entry, with an error naming the key when required. The run's record names
    this key alone, with the default it took when the entry does not set it (so setting it later, to anything but
    the default, reruns the readers)."""
    with unrecorded():  # the entry's other options are not read here
        extra = entry.model_extra or {}
    if key not in extra:
        if required:
            raise ValueError(f"catalog entry of kind {entry.kind!r} needs the key {key!r}")
        note_item(entry, (key,), default, default=default)
        return default
    if required:
        note_item(entry, (key,), extra[key])
    else:  # removing the key gives the default: the same value if the entry restated it
        note_item(entry, (key,), extra[key], default=default)
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
    corpus: Iterable[str],
    manifest: dict[str, Any],
) -> dict[str, Any]:
    """Write the standard prepared files into ``out`` (a fresh temporary folder); the references are the
    ``references`` stage's (:func:`write_references`)."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    bad = set(images["split"]) - set(SPLITS)
    if bad:
        raise ValueError(f"images.parquet: unknown split(s) {sorted(bad)}; expected {SPLITS}")
    images = images.astype({"image_id": str, "path": str, "split": str})
    images.to_parquet(out / "images.parquet", index=False)
    n = 0
    with open(out / "corpus.txt", "w", encoding="utf-8") as fh:
        for line in corpus:
            fh.write(" ".join(line.splitlines()).strip() + "\n")  # one line, whatever breaks it held
            n += 1
    manifest = {
        **manifest,
        "n_images": {s: int((images["split"] == s).sum()) for s in SPLITS},
        "n_sentences": n,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def write_references(out: Path, references: References, train_references: References | None) -> dict[str, int]:
    """Write ``references.json`` (and ``train_references.json`` when the dataset has paired training
    captions) into ``out`` (a fresh temporary folder); returns the caption counts."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    (out / REFERENCES).write_text(json.dumps(references))
    if train_references is not None:
        (out / TRAIN_REFERENCES).write_text(json.dumps(train_references))
    return {"n_references": len(references.get("annotations", [])),
            "n_train_references": len(train_references.get("annotations", [])) if train_references else 0}


def check_index(prepared: Path, refs: dict[str, Any], source: str) -> None:
    """Every evaluation image the references name is in the prepared index with the same split (else the
    reference files' image list changed after ``prepare`` ran): one line naming the image."""
    index = read_index(prepared)
    split_of = dict(zip(index["image_id"].astype(str), index["split"].astype(str), strict=True))
    for img in refs.get("images", []):
        have, want = split_of.get(str(img["id"])), img.get("split", "test")
        if have != want:
            where = "not in" if have is None else f"of split {have!r} in"
            raise ValueError(f"{source}: image {img['id']!r} (split {want!r}) is {where} {prepared / 'images.parquet'}; "
                             "the references' image list changed after prepare ran: run prepare again")


def read_index(prepared_dir: str | Path) -> Any:
    """``prepared/images.parquet``'s ``image_id``, ``path``, ``split`` (a pandas DataFrame, file order)."""
    import pyarrow.parquet as pq

    return pq.read_table(Path(prepared_dir) / "images.parquet", columns=["image_id", "path", "split"]).to_pandas()


def eval_records(prepared_dir: str | Path, file_name: Callable[[str], str] = lambda p: p) -> list[dict[str, str]]:
    """The ``{"id", "file_name", "split"}`` records of the evaluation (``val``/``test``) images of the
    prepared index, in its order (``file_name`` of the image's ``path``: as it is by default)."""
    df = read_index(prepared_dir)
    return [{"id": str(i), "file_name": file_name(str(p)), "split": str(s)}
            for i, p, s in zip(df["image_id"], df["path"], df["split"], strict=True) if s != "train"]


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


# ----------------------------------------------------------------- generated references (tiny, rehearsal)
GENERATED = "generated_references.json"  # in the prepared folder: {"references", "train_references"}


def generated_references(entry: DatasetEntry, prepared: Path, log: logging.Logger) -> tuple[dict[str, Any], Any]:
    """The captions a synthetic recipe's ``prepare`` generated with the images (:data:`GENERATED`)."""
    from r2m.utils.io import read_json

    data = read_json(prepared / GENERATED)
    if not isinstance(data, dict) or not isinstance(data.get("references"), dict):
        raise ValueError(f"{prepared / GENERATED}: expected {{\"references\": {{...}}, \"train_references\": ...}}")
    return data["references"], data.get("train_references")
