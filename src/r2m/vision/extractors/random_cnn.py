"""Backend ``random_cnn``: a small seeded random CNN (synthetic ``tiny`` data, tests; fast, deterministic).

Random by name and definition (``r2m.vision.weights.RANDOM_BY_DEFINITION``): it needs no
``random_init`` option, and its features folder and the report page still say "random weights"."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from r2m.vision.extractors.base import Extractor, Scaled, select_kinds


def random_cnn(options: dict[str, Any]) -> Extractor:
    """Four strided conv layers with seeded random weights: ``pooled`` (global average) and, with
    ``options.kinds: [pooled, grid]``, the last feature map as ``grid``. Options ``size`` (64),
    ``dim`` (128), ``seed`` (0), ``grid_side`` (default ``size / 16``: the map as it is; another value
    resamples it (nearest) to that side, e.g. 14 for a VGG-conv5-shaped grid from small images)."""
    size, dim, seed = int(options.get("size", 64)), int(options.get("dim", 128)), int(options.get("seed", 0))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        widths = [3, 32, 64, 128, dim]
        layers: list[nn.Module] = []
        for cin, cout in zip(widths[:-1], widths[1:], strict=True):
            layers += [nn.Conv2d(cin, cout, 3, stride=2, padding=1), nn.ReLU(inplace=True)]
        net = nn.Sequential(*layers)
    native = -(-size // 16)  # four stride-2 convolutions
    side = int(options.get("grid_side") or native)
    kinds = select_kinds({"pooled": (dim,), "grid": (side, side, dim)}, options, ["pooled"])

    def fn(net, x):
        fmap = net(x)
        out = {"pooled": fmap.mean(dim=(2, 3))}
        if "grid" in kinds:
            if side != native:
                fmap = torch.nn.functional.interpolate(fmap, size=(side, side), mode="nearest")
            out["grid"] = fmap.permute(0, 2, 3, 1)
        return out

    model = Scaled(net, [0.5] * 3, [0.25] * 3, fn)
    return Extractor("random_cnn", model.eval(), (size, size), kinds)
