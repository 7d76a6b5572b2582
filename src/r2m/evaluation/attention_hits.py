"""Where does Show, Attend and Tell look? Attention maps against ground-truth object boxes.

For every generated word that names an object drawn in the image (the synthetic ``tiny`` data
knows each object's box), take the attention α_t used to emit that word (a [h, w] grid over the
image) and ask:

* **hit**: does the most attended cell's centre lie inside the named object's box (any of them,
  when the object occurs twice)? *Chance* for the same event is the fraction of cells whose centre
  lies inside the box(es), the hit rate of a uniformly random cell;
* **mass**: the attention mass on those cells, against the same fraction (uniform attention).

Grid cell (r, c) of an h×w grid covers ``[c·W/w, (c+1)·W/w) × [r·H/h, (r+1)·H/h)`` of a W×H image
(the feature backends resize the whole image, so the grid spans it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np


def cells_in_boxes(grid_hw: tuple[int, int], image_wh: tuple[int, int], boxes: Sequence[Sequence[float]]) -> np.ndarray:
    """Bool [h, w]: cells whose centre lies inside any of ``boxes`` ([x1, y1, x2, y2], pixels)."""
    h, w = grid_hw
    W, H = image_wh
    cx = (np.arange(w) + 0.5) * W / w
    cy = (np.arange(h) + 0.5) * H / h
    inside = np.zeros((h, w), dtype=bool)
    for x1, y1, x2, y2 in boxes:
        inside |= ((cy >= y1) & (cy <= y2))[:, None] & ((cx >= x1) & (cx <= x2))[None, :]
    return inside


@dataclass
class HitStats:
    events: int = 0
    hits: int = 0
    chance: float = 0.0  # summed over events, divided in as_dict
    mass: float = 0.0
    empty: int = 0  # events whose box covers no cell centre (left out)

    def add(self, alpha: np.ndarray, inside: np.ndarray) -> None:
        if not inside.any():
            self.empty += 1
            return
        self.events += 1
        r, c = np.unravel_index(int(np.argmax(alpha)), alpha.shape)
        self.hits += int(inside[r, c])
        self.chance += float(inside.mean())
        self.mass += float(alpha[inside].sum() / max(float(alpha.sum()), 1e-12))

    def as_dict(self) -> dict[str, float | int]:
        n = max(self.events, 1)
        return {"events": self.events, "hit_rate": self.hits / n, "chance": self.chance / n,
                "attention_mass_in_box": self.mass / n, "box_area_fraction": self.chance / n,
                "events_without_cells": self.empty}


def attention_hit_rate(records: Iterable[tuple[Sequence[str], np.ndarray, dict[str, list[list[float]]], tuple[int, int]]],
                       word_to_object: dict[str, str]) -> dict[str, float | int]:
    """``records``: per image (generated words, α [T, h, w] aligned with the words, boxes by object
    word, image (W, H)). ``word_to_object`` maps a caption word (singular or plural) to the object
    word that keys the boxes."""
    stats = HitStats()
    for words, alphas, boxes, image_wh in records:
        for t, word in enumerate(words):
            obj = word_to_object.get(word)
            if obj is None or obj not in boxes or t >= len(alphas):
                continue
            alpha = np.asarray(alphas[t], dtype=np.float64)
            stats.add(alpha, cells_in_boxes(alpha.shape, image_wh, boxes[obj]))
    return stats.as_dict()


def smooth_map(alpha: np.ndarray, size_hw: tuple[int, int], sigma_cells: float = 0.5) -> np.ndarray:
    """α [h, w] → a [H, W] map for display, as the paper's figures: upsampled to the image size
    (bilinear) and smoothed with a Gaussian of ``sigma_cells`` grid cells; scaled to [0, 1]."""
    import torch
    from scipy.ndimage import gaussian_filter

    h, w = alpha.shape
    H, W = size_hw
    up = torch.nn.functional.interpolate(torch.as_tensor(alpha, dtype=torch.float32)[None, None], size=(H, W),
                                         mode="bilinear", align_corners=False)[0, 0].numpy()
    up = gaussian_filter(up, sigma=(sigma_cells * H / h, sigma_cells * W / w))
    lo, hi = float(up.min()), float(up.max())
    return (up - lo) / (hi - lo) if hi > lo else np.zeros_like(up)
