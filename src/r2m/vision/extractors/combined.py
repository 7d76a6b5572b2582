"""One features folder from several networks: ``options.kinds_from`` names, per feature kind, another
backend that computes it.

The baselines need it on the paper benchmarks: Show, Attend and Tell reads VGG-19's conv5_4 grid
(seed 004) while m-RNN and S-CNN-RNN read VGG-16's fc7 (seeds 001-003), and every baseline reads the
one folder ``D/sup_features``. So the section stays a VGG-16 one and names VGG-19 for the grid::

    sup_features: {backend: vgg16, options: {weights: data/weights/vgg16-397923af.pth, kinds: [pooled, grid],
                   kinds_from: {grid: {backend: vgg19, options: {weights: data/weights/vgg19-dcbb9e9a.pth}}}}}

``kinds`` still lists every kind written; the main backend computes those not in ``kinds_from``. The
networks see the same decoded image (they must share the input size and resize rule), one forward
pass each per batch; ``meta.json`` and the stage's params keep the whole options.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from r2m.vision.extractors.base import Extractor


class Union(nn.Module):
    """Several extractor models on one uint8 batch: each contributes the kinds it is named for."""

    def __init__(self, parts: dict[str, nn.Module], kinds_of: dict[str, tuple[str, ...]]):
        super().__init__()
        self.parts = nn.ModuleDict(parts)
        self.kinds_of = kinds_of

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for name, model in self.parts.items():
            got = model(x)
            out.update({k: got[k] for k in self.kinds_of[name]})
        return out


def split_options(backend: str, options: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(backend, options)`` of every network ``options`` asks for: the main one first (its kinds
    = ``kinds`` minus those of ``kinds_from``; left out when nothing is left for it), then one per
    kind of ``kinds_from`` (its ``kinds`` = that kind)."""
    extra = dict(options.get("kinds_from") or {})
    main = {k: v for k, v in options.items() if k != "kinds_from"}
    kinds = list(options.get("kinds") or [])
    if not kinds:
        raise ValueError("extract_features.options.kinds_from needs options.kinds: every kind to write")
    stray = [k for k in extra if k not in kinds]
    if stray:
        raise ValueError(f"extract_features.options.kinds_from {stray}: not in options.kinds {kinds}")
    out = []
    own = [k for k in kinds if k not in extra]
    if own:
        out.append((backend, {**main, "kinds": own}))
    for kind, spec in extra.items():
        if not isinstance(spec, dict) or not isinstance(spec.get("backend"), str):
            raise ValueError(f"extract_features.options.kinds_from.{kind}: expected {{backend: name, options: {{...}}}}")
        if "kinds_from" in (spec.get("options") or {}):
            raise ValueError(f"extract_features.options.kinds_from.{kind}: no nested kinds_from")
        out.append((spec["backend"], {**(spec.get("options") or {}), "kinds": [kind]}))
    return out


def combine(parts: list[Extractor]) -> Extractor:
    """One :class:`Extractor` computing the kinds of every part (same input size, resize and transform)."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    for p in parts[1:]:
        if (p.size, p.resample, p.transform) != (first.size, first.resample, first.transform):
            raise ValueError(f"extract_features.options.kinds_from: {p.name} reads {p.size} images "
                             f"({p.resample}), {first.name} {first.size} ({first.resample}); they must match")
    names = [f"{i}_{p.name}" for i, p in enumerate(parts)]
    model = Union({n: p.model for n, p in zip(names, parts, strict=True)},
                  {n: tuple(p.kinds) for n, p in zip(names, parts, strict=True)})
    kinds = {k: s for p in parts for k, s in p.kinds.items()}
    return Extractor("+".join(p.name for p in parts), model.eval(), first.size, kinds, first.resample,
                     first.transform)


def build_combined(build: Callable[[str, dict[str, Any]], Extractor], backend: str,
                   options: dict[str, Any]) -> Extractor:
    """The extractor of ``backend`` with ``options``, its ``kinds_from`` kinds computed by their own backends."""
    return combine([build(b, o) for b, o in split_options(backend, options)])
