"""Backend ``offline`` (the default): the union of image detectors (``parts``, default
``regions`` and ``faces``) over one pass of image decoding; runs offline with weights shipped in
registry packages. Per-part options go under ``options.<part>`` (``options.regions``, ...).

``parts: [classifier, faces]`` is the earlier default (one whole-image classification: one object
per photo). On the 16 demo photos (``r2m bench concepts``) regions + faces give 10 images with a
concept instead of 8, concept precision 0.35 instead of 0.33 and recall 0.14 instead of 0.09."""

from __future__ import annotations

from collections.abc import Sequence

from r2m.catalogs import DETECTORS
from r2m.vision.detectors.base import Detector, ImageDetector, Raw


class Union(ImageDetector):
    """Several image detectors over one pass of image decoding; detections are concatenated."""

    def __init__(self, parts: Sequence[ImageDetector]):
        self.parts = list(parts)
        self.dictionary = self.parts[0].dictionary
        self.floor = 0.0  # each part applies its own floor in predict below

    def prepare(self, img):
        return tuple(p.prepare(img) for p in self.parts)

    def predict(self, inputs, sizes):
        import torch

        out: list[list[Raw]] = [[] for _ in sizes]
        for j, part in enumerate(self.parts):
            xs = [x[j] for x in inputs]
            if xs and all(isinstance(x, torch.Tensor) for x in xs):
                xs = torch.stack(xs)
            for n, raws in enumerate(part.predict(xs, sizes)):
                out[n] += [r for r in raws if r[2] >= part.floor]
        return out


def build(options, dictionary, device) -> Detector:
    names = list(options.get("parts", ["regions", "faces"]))  # detectors.factory.OFFLINE_PARTS
    parts = []
    for name in names:
        part = DETECTORS.load(name)(dict(options.get(name, {})), dictionary, device)
        if not isinstance(part, ImageDetector):
            raise ValueError(f"offline: part {name!r} does not look at images and cannot be combined")
        parts.append(part)
    return Union(parts)
