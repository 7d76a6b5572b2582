"""``folder``: bring your own images, their COCO references and a text corpus.

Catalog entry keys::

    my_photos:
      kind: folder
      images: path/to/images        # a directory, searched recursively for image files
                                    # (hidden entries skipped, extensions in any case: list_images)
      corpus: path/to/corpus.txt    # UTF-8, one sentence per line
      references: path/to/refs.json # COCO caption-annotation JSON: the test images
      val_fraction: 0.0             # optional: share of the referenced images used for validation
      train_references: path/to/train_refs.json  # optional, COCO caption JSON of training images:
                                    # paired captions for the supervised baselines (m-RNN, ...)

Image ids are the file stems, except for images named in the references JSON (matched by its
``file_name``, as a path relative to ``images`` or a bare file name), which keep the JSON's ids.
Referenced images are the evaluation images (``test``; a deterministic ``val_fraction`` of them
``val``), all others ``train``. Images of ``train_references`` must not be in ``references``; their
captions become ``train_references.json``. Without ``references`` there would be no test image
to caption and score, so the params check (:func:`check`, before any stage) refuses the entry, as it
refuses a references file that names an image not in the folder. Paths in ``images.parquet`` are ``images``/relative path, i.e. as
the entry gives the folder (relative to the repository root, or absolute).

Two stages read the reference files. ``prepare`` (:func:`folder`) reads only which images they list
(``images``: ``id`` and ``file_name``), since that defines the image ids and splits; the ``inputs``
digest records that list alone (:func:`reference_index`). The ``references`` stage
(:func:`folder_references`) reads their captions. So an edit of the ``annotations`` (a caption's words,
a caption added or removed) re-runs ``references`` and its readers only; an edit of the ``images`` list
(an image added, removed, renamed or given another id) re-runs ``prepare`` and everything after it.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from r2m.datasets.base import (
    Recipe,
    eval_records,
    option,
    references_json,
    write_prepared,
)
from r2m.params import DatasetEntry
from r2m.text.corpus import read_lines
from r2m.utils.coco import read_coco_captions
from r2m.utils.guard import IMAGE_SUFFIXES, not_a_file
from r2m.utils.io import read_json


def list_images(folder: Path) -> list[Path]:
    """The images of a ``folder`` dataset, relative to ``folder``, sorted — the one rule that both
    ``prepare`` (this recipe) and the ``inputs`` digest (:mod:`r2m.datasets.inputs`) use:

    * the folder is walked recursively; an entry whose name starts with ``.`` (a hidden file such
      as ``.new.png`` or ``._IMG_1.jpg``, a hidden folder such as ``.thumbnails/``) is skipped;
    * a file counts when its extension, in any case (``.JPG`` = ``.jpg``), is in
      :data:`r2m.utils.guard.IMAGE_SUFFIXES` (the same suffixes ``r2m caption`` takes from a folder); other
      files (``notes.txt``) are not part of the dataset;
    * a link to a file counts as that file; links to folders are not followed (no loops, nothing
      outside the folder by way of a link); broken links, FIFOs and devices are skipped.
    """
    out = []
    for root, dirs, files in os.walk(folder):  # followlinks=False: linked folders are not entered
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        out += [Path(root, f).relative_to(folder) for f in files
                if not f.startswith(".") and Path(f).suffix.lower() in IMAGE_SUFFIXES and Path(root, f).is_file()]
    return sorted(out)


def image_files(folder: Path) -> list[Path]:
    """:func:`list_images` as paths under ``folder`` (what the ``inputs`` stage digests)."""
    return [folder / f for f in list_images(folder)] if folder.is_dir() else [folder]


def _path_option(entry: DatasetEntry, key: str, required: bool, want_dir: bool = False) -> Path | None:
    value = option(entry, key, None, required=required)
    if value is None:
        return None
    path = Path(str(value)).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"catalog entry (kind folder): {key}: {path} does not exist")
    if want_dir != path.is_dir():
        raise ValueError(f"catalog entry (kind folder): {key}: {path} must be a {'directory' if want_dir else 'file'}")
    if not want_dir and not_a_file(path):  # a FIFO would block the reader for ever, /dev/zero never end
        raise ValueError(f"catalog entry (kind folder): {key}: {path}: {not_a_file(path)}")
    return path


def load_references(path: Path) -> tuple[list[dict[str, Any]], dict[str, list[str]]]:
    """``(images, captions)`` from a COCO caption JSON (every image record needs a ``file_name``);
    errors name the file and record."""
    coco = read_coco_captions(path)
    images = []
    for i, img in enumerate(coco.images):
        if not img.get("file_name"):
            raise ValueError(f"{path}: images[{i}] needs 'id' and 'file_name'")
        images.append({"id": img["id"], "file_name": str(img["file_name"])})
    coco.require_listed(str(path))
    captions: dict[str, list[str]] = {}
    for image_id, cap in coco.annotations:
        captions.setdefault(image_id, []).append(cap.strip())
    return images, captions


def reference_index(data: Any) -> Any:
    """What ``prepare`` reads of a parsed reference file: its images' ``id`` and ``file_name``, in order
    (the ``inputs`` digest of a reference file; anything else, e.g. a non-list, as it is)."""
    images = data.get("images") if isinstance(data, dict) else data
    if not isinstance(images, list):
        return images
    return [[img.get("id"), img.get("file_name")] if isinstance(img, dict) else img for img in images]


def is_val(image_id: str, fraction: float) -> bool:
    """Deterministic choice of validation images (hash of the id)."""
    h = int.from_bytes(hashlib.sha1(image_id.encode()).digest()[:8], "big")
    return h / 2**64 < fraction


def _matcher(files: list[Path]) -> Any:
    """``file_name -> file``: exact relative path first, else a unique bare file name."""
    by_rel = {f.as_posix(): f for f in files}
    by_name: dict[str, list[Path]] = {}
    for f in files:
        by_name.setdefault(f.name, []).append(f)

    def match(file_name: str) -> Path | None:
        if file_name in by_rel:
            return by_rel[file_name]
        hits = by_name.get(Path(file_name).name, [])
        return hits[0] if len(hits) == 1 else None

    return match


def _corpus(path: Path) -> Iterator[str]:
    empty = True
    for _, text in read_lines(path):
        empty = False
        yield text
    if empty:  # nothing to learn the language from: every later stage would train on nothing
        raise ValueError(f"catalog entry (kind folder): corpus: {path} has no sentence (empty or blank lines only)")


NO_REFERENCES = ("references: not given; the pipeline captions and scores a dataset's test images, which are "
                 "the images its references file lists (COCO caption JSON). Give one, or caption a folder of "
                 "images without references with `r2m caption FOLDER --model MODEL`")


def _referenced_files(images_dir: Path, refs_path: Path) -> None:
    """Every image a references file lists is a file under ``images_dir`` (found as ``prepare`` finds it:
    its relative path, else a unique bare name); else FileNotFoundError naming the file and record.
    Reads only the ``images`` list (the captions are the ``references`` stage's to check); a stat per
    record, and the folder is listed only when a name is not found as a relative path (5,000
    references: about 0.1 s)."""
    data = read_json(refs_path)
    records = data.get("images") if isinstance(data, dict) else None
    if not isinstance(records, list) or not all(isinstance(r, dict) and r.get("file_name") for r in records):
        records = load_references(refs_path)[0]  # malformed: its own one-line error names the record
    root = str(images_dir)
    match = None
    for img in records:
        name = str(img["file_name"])
        if (not os.path.isabs(name) and not any(p.startswith(".") for p in name.split("/"))
                and os.path.splitext(name)[1].lower() in IMAGE_SUFFIXES and os.path.isfile(os.path.join(root, name))):
            continue
        match = match or _matcher(list_images(images_dir))
        if match(name) is None:
            raise FileNotFoundError(f"{refs_path}: image {str(img.get('id'))!r}: file_name {name!r} not found (or "
                                    f"ambiguous) under {images_dir}")


def check(entry: DatasetEntry) -> None:
    """What ``prepare`` would refuse, found when the params are checked (before any stage runs): the
    folder, corpus and references exist, the references are given, and each image they list is there."""
    images_dir = _path_option(entry, "images", True, want_dir=True)
    _path_option(entry, "corpus", True)
    refs_path = _path_option(entry, "references", False)
    if refs_path is None:
        raise ValueError(f"catalog entry (kind folder): {NO_REFERENCES}")
    assert images_dir is not None
    _referenced_files(images_dir, refs_path)
    train_refs_path = _path_option(entry, "train_references", False)
    if train_refs_path is not None:
        _referenced_files(images_dir, train_refs_path)


def folder(entry: DatasetEntry, out: Path, log: logging.Logger) -> dict[str, Any]:
    import pandas as pd

    images_dir = _path_option(entry, "images", True, want_dir=True)
    corpus = _path_option(entry, "corpus", True)
    refs_path = _path_option(entry, "references", False)
    val_fraction = float(option(entry, "val_fraction", 0.0))
    if not 0 <= val_fraction < 1:
        raise ValueError(f"catalog entry (kind folder): val_fraction must be in [0, 1), got {val_fraction}")
    assert images_dir is not None and corpus is not None
    files = list_images(images_dir)
    if not files:
        raise FileNotFoundError(f"catalog entry (kind folder): images: no image files under {images_dir}")

    ref_images = load_references(refs_path)[0] if refs_path else []
    ids: dict[Path, str] = {}
    split: dict[Path, str] = {}
    match = _matcher(files)
    duplicates: dict[Path, list[str]] = {}  # a file named by several reference ids: the first id is kept
    for img in ref_images:
        f = match(img["file_name"])
        if f is None:
            raise FileNotFoundError(f"{refs_path}: image {img['id']!r}: file_name {img['file_name']!r} "
                                    f"not found (or ambiguous) under {images_dir}")
        if f in ids:
            duplicates.setdefault(f, [ids[f]]).append(img["id"])
            continue
        ids[f] = img["id"]
        split[f] = "val" if is_val(img["id"], val_fraction) else "test"
    train_refs_path = _path_option(entry, "train_references", False)
    train_images = load_references(train_refs_path)[0] if train_refs_path else []
    for img in train_images:
        f = match(img["file_name"])
        if f is None:
            raise FileNotFoundError(f"{train_refs_path}: image {img['id']!r}: file_name {img['file_name']!r} "
                                    f"not found (or ambiguous) under {images_dir}")
        if f in split:
            raise ValueError(f"{train_refs_path}: image {img['id']!r} ({img['file_name']}) is also an "
                             f"evaluation image in {refs_path}; a training image cannot be both")
        ids[f] = img["id"]
    seen: dict[str, Path] = {}
    rows = []
    for f in files:
        image_id = ids.get(f, f.stem)
        if image_id in seen:
            raise ValueError(f"{images_dir}: image id {image_id!r} used by both {seen[image_id]} and {f}; "
                             "rename one file (ids are file stems)")
        seen[image_id] = f
        rows.append({"image_id": image_id, "path": str(images_dir / f), "split": split.get(f, "train")})
    df = pd.DataFrame(rows)
    for f, dup in duplicates.items():
        log.warning("%s: file %s is named by %d image ids (%s); keeping %r, the captions of the others are "
                    "not used", refs_path, f, len(dup), ", ".join(map(repr, dup)), dup[0])
    manifest = {"recipe": "folder", "duplicate_reference_ids": [[f.as_posix(), *d] for f, d in duplicates.items()],
                "sources": {
        "images": str(images_dir), "corpus": str(corpus), "references": str(refs_path) if refs_path else None,
        "train_references": str(train_refs_path) if train_refs_path else None}}
    manifest = write_prepared(out, df, _corpus(corpus), manifest)
    log.info("folder: %s images, %d sentences", manifest["n_images"], manifest["n_sentences"])
    return manifest


def folder_references(entry: DatasetEntry, prepared: Path, log: logging.Logger) -> tuple[dict[str, Any], Any]:
    """The evaluation images of the prepared index with their captions of ``references`` (file names as
    the folder's), and the ``train_references`` images with theirs (none: no such file)."""
    refs_path = _path_option(entry, "references", False)
    listed, captions = load_references(refs_path) if refs_path else ([], {})
    images = eval_records(prepared, lambda p: Path(p).name)
    # the file's image list is what prepare indexed (else it changed since: a stale index, not silent gaps)
    manifest = read_json(prepared / "manifest.json")
    dropped = {str(i) for dup in manifest.get("duplicate_reference_ids") or [] for i in dup[2:]}
    stale = sorted(({img["id"] for img in listed} ^ {img["id"] for img in images}) - dropped)
    if stale:
        raise ValueError(f"{refs_path}: image {stale[0]!r} is not indexed as {prepared / 'images.parquet'} says "
                         f"({len(stale)} such); the references' image list changed after prepare ran: run prepare again")
    refs = references_json(images, captions)
    train_refs_path = _path_option(entry, "train_references", False)
    if not train_refs_path:
        return refs, None
    train_images, train_captions = load_references(train_refs_path)
    return refs, references_json([{**img, "split": "train"} for img in train_images], train_captions)


RECIPE = Recipe(prepare=folder, references=folder_references)  # the kind 'folder' (r2m.catalogs.RECIPES)
