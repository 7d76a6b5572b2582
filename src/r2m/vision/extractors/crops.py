"""Seeded random crops beside each image's usual view: the released code's training augmentation, cached.

The authors' image stages feed the CNN a fresh random 299 × 299 crop of the 346 × 346 resize at every
step (``obj2sen_tri.py:255-262``: ``tf.image.resize_images`` then ``tf.random_crop``); their test code
takes the centre crop. A feature cache cannot hold every crop, so ``extract_features.crops: K`` (K > 0)
stores K random crops per image as kind ``<kind>_crops`` [K, ...] beside the usual view (kind ``<kind>``,
unchanged), and the image stages draw one of the K per image and step (:class:`r2m.training.data.ImageSet`);
validation, selection and captioning read the usual view. Each crop is one the authors' code could have
drawn (offsets uniform over the ``resize − crop + 1`` positions on each axis); what the cache gives up is
the number of distinct crops an image is seen with: K instead of one per step.

The offsets are drawn per image from a generator seeded with the image's pixels (CRC-32 of the RGB
array), so a photo gets the same K crops in any order, shard or worker, and another photo other ones.
Backends resize in one of two ways: the authors' (:class:`~r2m.vision.extractors.tf1.OfficialResizeCrop`,
whose crops are the released code's exactly) or a plain resize to the network's input
(:class:`~r2m.vision.extractors.base.ResizeToUint8`; its crops come from a resize larger by the same
ratio, 346 / 299). A backend with another transform refuses ``crops`` with a clear error.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import torch
from torch import nn

from r2m.vision.extractors.base import Extractor, ResizeToUint8
from r2m.vision.extractors.tf1 import OfficialResizeCrop

RATIO = 346 / 299  # the released code's resize over its crop, used for backends with a plain resize
SUFFIX = "_crops"


def crop_offsets(img_rgb: np.ndarray, k: int, span_y: int, span_x: int) -> np.ndarray:
    """``k`` (y, x) offsets, each uniform over ``0 … span`` on its axis, from a generator seeded with the
    image's pixels: the same photo gives the same offsets wherever it is computed."""
    rng = np.random.default_rng(zlib.crc32(np.ascontiguousarray(img_rgb).tobytes()))
    return np.stack([rng.integers(0, span_y + 1, k), rng.integers(0, span_x + 1, k)], axis=1)


class RandomCrops:
    """An image -> ``[1 + K, 3, H, W]``: the backend's own view first, then K seeded random crops of the
    same size (float for the official transform, uint8 for a plain resize, as the backend's own). Both come
    from the backend's own resize code: the official one at ``resize × resize`` (its own view is that image's
    centre window), a plain resize at the larger size."""

    def __init__(self, base: Any, k: int):
        if isinstance(base, OfficialResizeCrop):
            self.big: Any = OfficialResizeCrop(base.resize, base.resize)  # the whole resize, nothing cut
            self.size = (base.crop, base.crop)
        elif isinstance(base, ResizeToUint8):
            h, w = base.size
            self.big, self.size = ResizeToUint8((round(h * RATIO), round(w * RATIO)), base.resample), base.size
        else:
            raise ValueError(f"extract_features.crops: the backend's preprocessing {type(base).__name__} has no "
                             "random-crop form (only the official resize-then-crop and a plain resize do); "
                             "set crops: 0")
        self.base, self.k = base, int(k)

    def __call__(self, img) -> torch.Tensor:
        big = self.big(img)
        h, w = self.size
        if isinstance(self.base, OfficialResizeCrop):
            o = self.base.offset
            own = big[:, o:o + h, o:o + w]
        else:
            own = self.base(img)
        offsets = crop_offsets(np.asarray(img, dtype=np.uint8), self.k, big.shape[1] - h, big.shape[2] - w)
        return torch.stack([own, *(big[:, y:y + h, x:x + w] for y, x in offsets)])


class WithCrops(nn.Module):
    """The backend's model on ``[B, 1 + K, 3, H, W]``: one forward pass over all views, then each kind of
    the first view as it is and the K crops of each kind in ``cropped`` as ``<kind>_crops`` [B, K, ...]."""

    def __init__(self, inner: nn.Module, cropped: list[str]):
        super().__init__()
        self.inner, self.cropped = inner, list(cropped)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        b, n = x.shape[:2]
        out: dict[str, torch.Tensor] = {}
        for kind, v in self.inner(x.flatten(0, 1)).items():
            v = v.reshape(b, n, *v.shape[1:])
            out[kind] = v[:, 0]
            if kind in self.cropped:
                out[kind + SUFFIX] = v[:, 1:]
        return out


def with_crops(ex: Extractor, k: int) -> Extractor:
    """``ex`` with K seeded random crops of each pooled (vector) kind beside its usual view; ``k = 0``: ``ex``."""
    if k <= 0:
        return ex
    cropped = [kind for kind, shape in ex.kinds.items() if len(shape) == 1]
    if not cropped:
        raise ValueError(f"extract_features.crops: backend {ex.name} gives no pooled kind to crop "
                         f"(kinds {sorted(ex.kinds)}); set crops: 0")
    kinds = {**ex.kinds, **{c + SUFFIX: (k, *ex.kinds[c]) for c in cropped}}
    model: Any = WithCrops(ex.model, cropped).eval()
    return Extractor(ex.name, model, ex.size, kinds, ex.resample, RandomCrops(ex.prepare, k))
