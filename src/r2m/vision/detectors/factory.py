"""Building the chosen detector backend by name (:data:`r2m.catalogs.DETECTORS`; its module imported now, no
other backend's) and running it over image files."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from r2m.catalogs import DETECTORS
from r2m.text.dictionary import Dictionary, load_dictionary
from r2m.vision.detectors.base import Detector, Env


def build_detector(backend: str, options: dict[str, Any] | None, dictionary: Dictionary | str = "openimages",
                   device: Any = "cpu") -> Detector:
    d = load_dictionary(dictionary) if isinstance(dictionary, str) else dictionary
    return DETECTORS.load(backend)(dict(options or {}), d, device)


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
