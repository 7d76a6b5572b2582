"""What every concept detector shares: the output columns, the ``Detector`` protocol (a backend, named in
:data:`r2m.catalogs.DETECTORS`, is a factory ``(options, dictionary, device) -> Detector``) and
``ImageDetector`` (decode images in loader workers, predict in batches)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from r2m.text.dictionary import Dictionary
from r2m.utils.progress import progress
from r2m.vision.images import make_loader

COLUMNS = ("image_id", "label", "concept", "score", "x1", "y1", "x2", "y2")
DEFAULT_FLOOR = 0.05
log = logging.getLogger("r2m")

# one raw detection: (label, concept or None = ask the dictionary, score, (x1, y1, x2, y2))
Raw = tuple[str, str | None, float, tuple[float, float, float, float]]


@dataclass
class Env:
    """What a detector needs besides its options."""

    batch_size: int = 8
    workers: int = 0
    min_side: int = 1
    prepared_dir: Path | None = None
    root: Path = Path(".")
    show: bool = True  # a progress bar of its own (r2m caption, detecting a batch at a time, shows one of its own)


class Detector(Protocol):
    def detect(self, images: pd.DataFrame, env: Env) -> tuple[pd.DataFrame, list[tuple[str, str, str]]]:
        """``images`` has ``image_id`` and ``file``; returns (detections, bad rows (id, path, reason))."""



def empty_detections() -> pd.DataFrame:
    return frame([])


def frame(rows: Sequence[tuple[str, str, str, float, float, float, float, float]]) -> pd.DataFrame:
    df = pd.DataFrame(list(rows), columns=list(COLUMNS))
    return df.astype({"image_id": str, "label": str, "concept": str, "score": "float32",
                      "x1": "float32", "y1": "float32", "x2": "float32", "y2": "float32"})


def finish(image_id: str, raws: Sequence[Raw], dictionary: Dictionary, floor: float) -> list[tuple]:
    """Raw detections -> output rows: the dictionary concept of each label, ``score >= floor``."""
    rows = []
    for label, concept, score, (x1, y1, x2, y2) in raws:
        concept = concept if concept is not None else dictionary.label_to_concept(label)
        if concept and score >= floor:
            rows.append((image_id, label, concept, float(score), float(x1), float(y1), float(x2), float(y2)))
    return rows


class ImageDetector:
    """Base for detectors that look at pixels: ``prepare`` (in loader workers) + batched ``predict``."""

    floor: float = DEFAULT_FLOOR
    dictionary: Dictionary

    def prepare(self, img) -> Any:  # PIL RGB image -> model input
        raise NotImplementedError

    def predict(self, inputs: Any, sizes: list[tuple[int, int]]) -> list[list[Raw]]:
        raise NotImplementedError

    def detect(self, images: pd.DataFrame, env: Env) -> tuple[pd.DataFrame, list[tuple[str, str, str]]]:
        ids, files = list(images["image_id"]), list(images["file"])
        rows: list[tuple] = []
        bad: list[tuple[str, str, str]] = []
        loader = make_loader(files, self.prepare, env.batch_size, env.workers, env.min_side)
        bar = progress(total=len(files), desc=f"detect {type(self).__name__}", unit="img",
                       **({} if env.show else {"disable": True}))
        for batch in loader:
            bad += [(ids[i], files[i], reason) for i, reason in batch.bad]
            if batch.indices:
                for i, raws in zip(batch.indices, self.predict(batch.data, batch.sizes), strict=True):
                    rows += finish(ids[i], raws, self.dictionary, self.floor)
            bar.update(len(batch.indices) + len(batch.bad))
        bar.close()
        return frame(rows), bad
