"""Concept detection backends, one per file, named in ``r2m.catalogs.DETECTORS``; each is a
factory ``(options, dictionary, device) -> Detector`` chosen by ``detect_concepts.backend``:

``offline`` (default, ``offline.py``)
    union of ``regions`` and ``faces``; runs offline with weights shipped in registry packages.
``regions`` (``regions.py``)
    several objects per photo: the ImageNet classifier on the whole image and a grid of crops,
    merged per concept (best region's score and box, non-maximum suppression).
``classifier`` (``classifier.py``)
    MobileNetV2 ImageNet classifier mapped to dictionary concepts; top-k whole-image detections.
``faces`` (``faces.py``)
    MTCNN faces -> ``person`` and ``face`` with the face box.
``faster_rcnn`` (``faster_rcnn.py``)
    a torchvision detector from a local checkpoint + class names (or torchvision's COCO weights).
``precomputed`` (``precomputed.py``)
    detections imported from a JSONL / JSON / Parquet / CSV file.
``tf_oid`` (``tf_oid.py``; optional extra ``tf``)
    the paper's detector: TensorFlow Faster R-CNN Inception-ResNet-v2 trained on OpenImages-v4
    (a local SavedModel, or TF Hub / model-zoo release downloaded once with a recorded checksum).
``owl`` (``owl.py``; optional extra ``owl``)
    open-vocabulary OWL-ViT / OWLv2 (Hugging Face ``transformers``) queried with the dictionary's
    class names.

Add a backend: a new module here with its factory ``build(options, dictionary, device) -> Detector``, named
in :data:`r2m.catalogs.DETECTORS`. :func:`build_detector` imports the chosen backend's module only.
Every detection with a dictionary concept and ``score >= floor`` (default 0.05; ``detect_concepts.floor``
sets it for every backend, :func:`with_floor`) is kept — ``concepts.score_threshold`` and the at-most-5
rule are applied by consumers. The stage is ``r2m.vision.detect``.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from r2m.catalogs import DETECTORS
from r2m.text.dictionary import Dictionary, load_dictionary
from r2m.vision.detectors.base import (
    COLUMNS,
    DEFAULT_FLOOR,
    Detector,
    Env,
    ImageDetector,
    Raw,
    empty_detections,
    finish,
    frame,
)

OFFLINE_PARTS = ("regions", "faces")  # the default parts of backend ``offline``
# names this package re-exports from a backend's module (imported when one is asked for)
_LAZY = {"MAPPING_FILE": "classifier", "Classifier": "classifier", "class_concepts": "classifier",
         "read_mapping": "classifier", "Faces": "faces", "FasterRCNN": "faster_rcnn", "read_class_names": "faster_rcnn",
         "Union": "offline", "Precomputed": "precomputed", "read_precomputed": "precomputed"}

__all__ = [
    "COLUMNS", "DEFAULT_FLOOR", "DETECTORS", "Detector", "Env", "ImageDetector", "Raw",
    "build_detector", "detect_images", "with_floor", "empty_detections", "finish", "frame", *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def with_floor(backend: str, options: dict[str, Any] | None, floor: float | None) -> dict[str, Any]:
    """``options`` with ``floor`` as the lowest score kept wherever they set none (``detect_concepts.floor``;
    None: each backend's own default). ``offline`` passes it to each of its parts. With 0 a backend returns
    every detection up to its own cap: ``tf_oid`` the 100 of the frozen graph (the released code's
    ``num_detections``), ``faster_rcnn`` torchvision's ``box_detections_per_img`` (100), ``owl`` and
    ``regions`` their ``max_detections`` (50, 20), ``classifier`` its ``topk`` (5), ``faces`` every face
    MTCNN's own thresholds pass, ``precomputed`` every row of its file."""
    out = copy.deepcopy(dict(options or {}))
    if floor is None:
        return out
    if backend == "offline":
        for part in out.get("parts", OFFLINE_PARTS):
            out[part] = {"floor": floor, **dict(out.get(part) or {})}
        return out
    out.setdefault("floor", floor)
    return out


def build_detector(backend: str, options: dict[str, Any] | None, dictionary: Dictionary | str = "openimages",
                   device: Any = "cpu", floor: float | None = None) -> Detector:
    d = load_dictionary(dictionary) if isinstance(dictionary, str) else dictionary
    return DETECTORS.load(backend)(with_floor(backend, options, floor), d, device)


def detect_images(
    paths: Sequence[str | Path],
    backend: str = "offline",
    options: dict[str, Any] | None = None,
    image_ids: Sequence[str] | None = None,
    dictionary: str = "openimages",
    batch_size: int = 8,
    min_side: int = 1,
    device: Any = "cpu",
    workers: int = 0,
) -> pd.DataFrame:
    """Detections for image files (``image_id`` defaults to the path); bad images are in
    ``df.attrs["bad_images"]`` as ``(image_id, path, reason)``."""
    ids = [str(i) for i in image_ids] if image_ids is not None else [str(p) for p in paths]
    images = pd.DataFrame({"image_id": ids, "file": [str(p) for p in paths]})
    det = build_detector(backend, options, dictionary, device)
    df, bad = det.detect(images, Env(batch_size=batch_size, workers=workers, min_side=min_side))
    df.attrs["bad_images"] = bad
    return df
