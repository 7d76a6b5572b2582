"""What every feature backend shares: the ``Extractor`` it builds (a backend, named in
:data:`r2m.catalogs.FEATURE_BACKENDS`, is a factory ``options -> Extractor``), the input scaling ``Scaled``,
the default loader transform ``ResizeToUint8`` and two option helpers (``select_kinds``, ``load_state``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn


class ResizeToUint8:
    """RGB PIL image -> uint8 tensor [3, H, W] (picklable; runs in the loader workers)."""

    def __init__(self, size: tuple[int, int], resample: str = "bilinear"):
        self.size, self.resample = size, resample

    def __call__(self, img) -> torch.Tensor:
        from PIL import Image

        filt = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}[self.resample]
        h, w = self.size
        arr = np.asarray(img.resize((w, h), filt), dtype=np.uint8)
        return torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous()


class Scaled(nn.Module):
    """uint8 NCHW -> float ``(x/255 - mean) / std`` -> ``fn(net, x)`` = ``{kind: tensor [N, ...]}``."""

    def __init__(self, net: nn.Module, mean: Sequence[float], std: Sequence[float],
                 fn: Callable[[nn.Module, torch.Tensor], dict[str, torch.Tensor]]):
        super().__init__()
        self.net = net
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1) * 255.0, persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1) * 255.0, persistent=False)
        self.fn = fn

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.fn(self.net, (x.float() - self.mean) / self.std)


@dataclass
class Extractor:
    """A feature model: ``model(uint8 NCHW) -> {kind: float tensor [N, ...]}``."""

    name: str
    model: Scaled
    size: tuple[int, int]  # input (height, width)
    kinds: dict[str, tuple[int, ...]]  # kind -> per-image shape
    resample: str = "bilinear"  # PIL filter used to resize
    transform: Callable[[Any], torch.Tensor] | None = None  # replaces the plain resize when given

    @property
    def prepare(self) -> Callable[[Any], torch.Tensor]:
        return self.transform or ResizeToUint8(self.size, self.resample)



def select_kinds(all_kinds: dict[str, tuple[int, ...]], options: dict[str, Any],
                 default: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """The kinds asked for in ``options.kinds`` (else ``default``) with their per-image shapes."""
    kinds = list(options.get("kinds", default))
    unknown = [k for k in kinds if k not in all_kinds]
    if unknown or not kinds:
        raise ValueError(f"extract_features.options.kinds {kinds}: choose from {sorted(all_kinds)}")
    return {k: all_kinds[k] for k in kinds}


def load_state(path: Path, drop_prefixes: Sequence[str] = ()) -> dict[str, Any]:
    """A state dict from a ``.safetensors`` or ``torch.save`` file (a ``{"state_dict": ...}`` wrapper
    unwrapped), without the keys starting with ``drop_prefixes`` (classifier heads)."""
    if Path(path).suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path))
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    return {k: v for k, v in state.items() if not any(k.startswith(p) for p in drop_prefixes)}
