"""Building the chosen detector backend by name (:data:`r2m.catalogs.DETECTORS`; its module imported now, no
other backend's) and running it over image files."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from r2m.catalogs import DETECTORS
from r2m.text.dictionary import Dictionary, load_dictionary
from r2m.vision.detectors.base import Detector, Env

OFFLINE_PARTS = ("regions", "faces")  # the default parts of backend ``offline``


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
