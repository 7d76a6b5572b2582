"""The embedded ``demo`` dataset: real photos that ship inside installed Python packages.

Nothing is downloaded and no photo is committed. ``data/demo/photos.yaml`` names each photo by
package and resource path plus its sha256; the recipe copies the bytes into
``<prepared>/images/<id>.<ext>`` after checking the checksum and copies the committed
caption-style corpus (``data/demo/corpus.txt``, made by ``scripts/make_demo_corpus.py``). A package is
found by its installed folder and never imported: several photo packages are installed without their
dependencies (the Makefile's ``--no-deps`` pins) and would not import. The
``references`` stage (:func:`demo_references`) writes the hand-written references
(``data/demo/references.json``, five per photo) of the ``test`` split; ``prepare`` never reads them.

The image-side training stages need unpaired *training* images; the demo is tiny and transductive,
so each photo also gets a ``train`` copy ``images/<id>_train.jpg``: flipped left-right and
cropped by a few per cent. No caption of a training image is ever used.

``prepare`` reads ``photos.yaml`` through the view ``demo_photos`` (:func:`photo_sources`: each photo's id,
package, resource and sha256), so its record, and the ``inputs`` stage's digest, leave out what the recipe
never uses (a photo's loader, licence, description, concepts): editing those reruns nothing.

Image paths in ``images.parquet`` are relative to the prepared folder (``images/chelsea.png``).

Catalog options (all optional): ``source_dir`` (folder holding photos.yaml, references.json,
corpus.txt; default ``data/demo`` of the repository), ``train_copies`` (bool, default true),
``crop`` (fraction cut from each side of the train copy, default 0.04).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
from pathlib import Path
from typing import Any

from r2m.datasets.base import Recipe, option, references_json, write_prepared
from r2m.params import NAME_PATTERN, DatasetEntry
from r2m.text.corpus import read_lines
from r2m.utils.io import read_json
from r2m.utils.reads import read_view
from r2m.utils.strict_yaml import yaml_load

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_SOURCE = "data/demo"  # relative to the working directory, else to the repository


class ChecksumError(ValueError):
    """A photo's bytes differ from the sha256 recorded in photos.yaml."""


# what ``prepare`` reads of each photo (the view ``demo_photos``): not its loader, licence, description or concepts
PHOTO_FIELDS = ("id", "package", "resource", "sha256")


def _read_photos_yaml(path: Path) -> Any:
    """The parsed ``photos.yaml`` (errors name the file)."""
    import yaml

    try:
        return yaml_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"demo dataset: missing {path}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not valid YAML: {' '.join(str(err).split())}") from None


def _fields(doc: Any, fields: tuple[str, ...]) -> Any:
    """``doc`` with each photo mapping cut down to ``fields`` (in that order); anything malformed as it is (the
    check in :func:`load_photos` reports it)."""
    photos = doc.get("photos") if isinstance(doc, dict) else None
    if not isinstance(photos, list):
        return doc
    return {"photos": [{k: p[k] for k in fields if k in p} if isinstance(p, dict) else p for p in photos]}


def photo_sources(path: Path) -> Any:
    """The view ``demo_photos`` of ``photos.yaml`` (:data:`r2m.utils.reads.VIEWS`): what ``prepare`` reads of it,
    each photo's :data:`PHOTO_FIELDS` in the file's order. A stage that reads the file through it
    (:func:`load_photos`) is not stale after an edit of a photo's description, licence, loader or concepts."""
    return _fields(_read_photos_yaml(path), PHOTO_FIELDS)


def load_photos(source: Path, extra: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The photo records of ``photos.yaml``, validated (clear errors naming the record): each photo's
    :data:`PHOTO_FIELDS`, read through the view ``demo_photos`` (a recording run names that view, not the file);
    ``extra``: further fields too (``concepts``), read from the file itself."""
    path = source / "photos.yaml"
    doc = _fields(_read_photos_yaml(path), (*PHOTO_FIELDS, *extra)) if extra else read_view(path, "demo_photos")
    photos = doc.get("photos") if isinstance(doc, dict) else None
    if not isinstance(photos, list) or not photos:
        raise ValueError(f"{path}: expected a non-empty list under 'photos'")
    seen: set[str] = set()
    for i, p in enumerate(photos):
        if not isinstance(p, dict):
            raise ValueError(f"{path}: photo #{i + 1} must be a mapping (id, package, resource, sha256), "
                             f"got {type(p).__name__}")
        missing = [k for k in ("id", "package", "resource", "sha256") if not p.get(k)]
        if missing:
            raise ValueError(f"{path}: photo #{i + 1} lacks {missing}")
        if not isinstance(p["id"], str) or not NAME_PATTERN.fullmatch(p["id"]):
            raise ValueError(f"{path}: photo #{i + 1}: id {p['id']!r} must be a name (letters, digits, '_', '.', "
                             "'-'; it names the photo's file)")
        if p["id"] in seen:
            raise ValueError(f"{path}: duplicate photo id {p['id']!r}")
        seen.add(p["id"])
    return photos


def load_references(path: Path, ids: list[str]) -> dict[str, list[str]]:
    """``{photo id: [caption, ...]}`` of ``references.json``: an object mapping each photo id to a
    non-empty list of strings (errors name the file and the photo)."""
    refs = read_json(path)
    if not isinstance(refs, dict):
        raise ValueError(f"{path}: expected an object {{photo id: [caption, ...]}}, got {type(refs).__name__}")
    missing = [i for i in ids if not refs.get(i)]
    if missing:
        raise ValueError(f"{path}: no reference captions for {missing}")
    for i in ids:
        caps = refs[i]
        if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
            raise ValueError(f"{path}: {i!r}: expected a list of caption strings, got {caps!r:.80}")
    return {i: list(refs[i]) for i in ids}


# distribution names of packages whose import name differs (for the error messages' versions)
DISTRIBUTIONS = {"skimage": "scikit-image", "sklearn": "scikit-learn", "orangecontrib": "Orange3-ImageAnalytics"}


def _package_version(package: str) -> str:
    top = package.split(".")[0]
    dist = DISTRIBUTIONS.get(top, top)
    try:
        return f"{dist} {importlib.metadata.version(dist)}"
    except importlib.metadata.PackageNotFoundError:
        return f"{dist} (version unknown)"


def package_folder(package: str) -> Path | None:
    """The installed folder of ``package`` (dotted names: sub-folders of the top-level package), found
    without importing it: some photo packages are installed without their dependencies and would fail
    to import. None when the top-level package is not installed or is a plain module."""
    import importlib.util

    top, *sub = package.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:  # a namespace package may span several folders
        folder = Path(loc).joinpath(*sub)
        if folder.is_dir():
            return folder
    return None


def read_photo(photo: dict[str, Any]) -> bytes:
    """The photo's bytes out of its installed package, checked against its sha256."""
    pid, pkg, res = photo["id"], photo["package"], photo["resource"]
    folder = package_folder(pkg) if isinstance(pkg, str) and pkg else None
    if folder is None:
        raise FileNotFoundError(
            f"demo photo {pid!r}: package {pkg!r} is not installed (`make setup` installs the demo's photo "
            f"packages: scikit-image, scikit-learn, matplotlib and the pinned ones named in the Makefile)"
        )
    f = folder / str(res)
    if Path(str(res)).is_absolute() or not f.resolve().is_relative_to(folder.resolve()):
        raise ValueError(f"demo photo {pid!r}: resource {res!r} must be a path inside package {pkg!r}")
    if not f.is_file():
        raise FileNotFoundError(f"demo photo {pid!r}: {res!r} not found in package {pkg!r} ({_package_version(pkg)})")
    data = f.read_bytes()
    got = hashlib.sha256(data).hexdigest()
    if got != str(photo["sha256"]).lower():
        raise ChecksumError(
            f"demo photo {pid!r} ({pkg}/{res}, {_package_version(pkg)}): sha256 {got} does not match "
            f"photos.yaml {photo['sha256']}"
        )
    return data


def train_copy(src: Path, dst: Path, crop: float) -> None:
    """A horizontally flipped, slightly cropped RGB JPEG of ``src``."""
    from PIL import Image, ImageOps

    with Image.open(src) as im:
        im = ImageOps.mirror(im.convert("RGB"))
        w, h = im.size
        dx, dy = int(round(w * crop)), int(round(h * crop))
        im = im.crop((dx, dy, w - dx, h - dy))
        im.save(dst, format="JPEG", quality=92)


def source_dir(entry: DatasetEntry) -> Path:
    """The folder holding photos.yaml, references.json and corpus.txt (``source_dir``: relative to
    the working directory, else to the repository)."""
    source = Path(option(entry, "source_dir", DEFAULT_SOURCE))
    if not source.is_absolute() and not source.exists() and (REPO_ROOT / source).exists():
        source = REPO_ROOT / source
    return source


def prepare_demo(entry: DatasetEntry, out_dir: Path, log: logging.Logger) -> dict[str, Any]:
    import pandas as pd

    source = source_dir(entry)
    with_train = bool(option(entry, "train_copies", True))
    crop = float(option(entry, "crop", 0.04))
    if not 0.0 <= crop < 0.25:
        raise ValueError(f"catalog option 'crop' must be in [0, 0.25), got {crop}")

    photos = load_photos(source)
    corpus_path = source / "corpus.txt"
    corpus = [text for _, text in read_lines(corpus_path)]  # read (and checked) before any photo is copied
    if not corpus:
        raise ValueError(f"{corpus_path}: empty corpus")

    img_dir = out_dir / "images"
    img_dir.mkdir(parents=True, exist_ok=True)
    rows, sources = [], []
    for p in photos:
        data = read_photo(p)
        ext = Path(p["resource"]).suffix.lower() or ".png"
        name = f"{p['id']}{ext}"
        (img_dir / name).write_bytes(data)
        rows.append({"image_id": p["id"], "path": f"images/{name}", "split": "test"})
        sources.append({"id": p["id"], "package": p["package"], "resource": p["resource"],
                        "version": _package_version(p["package"]), "sha256": p["sha256"]})
        if with_train:
            tname = f"{p['id']}_train.jpg"
            train_copy(img_dir / name, img_dir / tname, crop)
            rows.append({"image_id": f"{p['id']}_train", "path": f"images/{tname}", "split": "train"})
        log.info("demo: %s <- %s/%s (sha256 ok)", p["id"], p["package"], p["resource"])

    manifest = {
        "recipe": "demo",
        "image_paths": "relative to the prepared folder",
        "transductive": with_train,
        "train_images": "flipped + cropped copies of the test photos" if with_train else None,
        "sources": sources,
        "corpus": {"file": str(corpus_path.name), "sha256": hashlib.sha256(corpus_path.read_bytes()).hexdigest()},
    }
    return write_prepared(out_dir, pd.DataFrame(rows), corpus, manifest)


def demo_references(entry: DatasetEntry, prepared: Path, log: logging.Logger) -> tuple[dict[str, Any], None]:
    """The ``test`` photos of the prepared index with their captions in ``references.json`` (every photo
    needs some: an error names the file and the photos without)."""
    from r2m.datasets.base import eval_records

    images = eval_records(prepared)
    refs = load_references(source_dir(entry) / "references.json", [img["id"] for img in images])
    log.info("demo: %d photos, %d reference captions", len(images), sum(map(len, refs.values())))
    return references_json(images, refs), None


RECIPE = Recipe(prepare=prepare_demo, references=demo_references)  # the kind 'demo' (r2m.catalogs.RECIPES)
