"""Running an ``Extractor`` over image files: decode in loader workers, batched forward passes
(bf16 autocast + channels_last on CUDA), float16 arrays per kind, bad images listed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from r2m.utils.progress import progress
from r2m.vision.extractors.base import Extractor
from r2m.vision.images import make_loader


def to_device(ex: Extractor, device: torch.device):
    """The extractor's model on ``device`` (channels_last on CUDA)."""
    model = ex.model.to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    return model


def features_of_batch(ex: Extractor, model, x, device) -> dict[str, np.ndarray]:
    """One forward pass; returns float16 arrays per kind (bf16 autocast + channels_last on CUDA)."""
    x = x.to(device, non_blocking=True)
    cuda = device.type == "cuda"
    if cuda:
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
        out = model(x)
    return {k: v.float().cpu().numpy().astype(np.float16) for k, v in out.items()}


def extract_arrays(
    ex: Extractor,
    files: Sequence[str],
    batch_size: int = 32,
    device: Any = "cpu",
    workers: int = 0,
    show: bool = True,
) -> tuple[dict[str, np.ndarray], list[int], list[tuple[int, str]]]:
    """Features of ``files`` (in order): ``({kind: [n_good, ...]}, good positions, [(pos, reason)])``."""
    device = torch.device(device)
    model = to_device(ex, device)
    chunks: dict[str, list[np.ndarray]] = {k: [] for k in ex.kinds}
    good: list[int] = []
    bad: list[tuple[int, str]] = []
    loader = make_loader(files, ex.prepare, batch_size, workers, min_side=1, pin_memory=device.type == "cuda")
    bar = progress(total=len(files), desc=f"features {ex.name}", unit="img", disable=None if show else True)
    for batch in loader:
        bad.extend(batch.bad)
        if batch.indices:
            out = features_of_batch(ex, model, batch.data, device)
            for k in ex.kinds:
                chunks[k].append(out[k])
            good.extend(batch.indices)
        bar.update(len(batch.indices) + len(batch.bad))
    bar.close()
    arrays = {
        k: (np.concatenate(v) if v else np.zeros((0, *ex.kinds[k]), np.float16)) for k, v in chunks.items()
    }
    return arrays, good, bad
