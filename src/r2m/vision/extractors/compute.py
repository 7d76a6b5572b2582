"""Running an ``Extractor`` over image files: decode in loader workers (on CUDA: plain JPEGs read by
threads and decoded in batches on the GPU, overlapping the model, ``gpu_decode.py``), batched forward passes (bf16 autocast + channels_last on
CUDA), float16 arrays per kind, bad images listed."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from r2m.utils.progress import progress
from r2m.vision.extractors import gpu_decode as G
from r2m.vision.extractors.base import Extractor
from r2m.vision.images import make_loader

log = logging.getLogger("r2m")


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
    gpu_decode: bool | None = None,
) -> tuple[dict[str, np.ndarray], list[int], list[tuple[int, str]]]:
    """Features of ``files`` (in order): ``({kind: [n_good, ...]}, good positions, [(pos, reason)])``.

    ``gpu_decode``: decode plain JPEGs on the CUDA device (default: on, unless ``R2M_GPU_DECODE=0``);
    never on other devices."""
    device = torch.device(device)
    model = to_device(ex, device)
    # filled batch by batch (a list of batches concatenated at the end held each shard twice: 1.6 GB for
    # 4,096 images of a 14x14x512 grid); the good rows are a prefix
    arrays = {k: np.empty((len(files), *ex.kinds[k]), np.float16) for k in ex.kinds}
    good: list[int] = []
    bad: list[tuple[int, str]] = []
    prep, why = _gpu_prep(ex, device, gpu_decode)
    if device.type == "cuda":
        log.info("features: JPEG decode %s", f"on the GPU ({why})" if prep is not None else f"on the CPU ({why})")
    stats: dict[str, int] = {"cpu": 0}
    if prep is None:
        loader = make_loader(files, ex.prepare, batch_size, workers, min_side=1, pin_memory=device.type == "cuda")
        batches = ((b.indices, b.data, b.bad, len(b.indices) + len(b.bad)) for b in loader)
    else:  # reader threads, decoding on the device in a thread of its own (gpu_decode.decoded_batches)
        batches = G.decoded_batches(ex, prep, files, batch_size, device, workers, stats)
    bar = progress(total=len(files), desc=f"features {ex.name}", unit="img", disable=None if show else True)
    with contextlib.closing(batches):  # an error here stops the reader and decode threads
        for indices, x, batch_bad, done in batches:
            bad.extend(batch_bad)
            if indices:
                out = features_of_batch(ex, model, x, device)
                for k in ex.kinds:
                    arrays[k][len(good):len(good) + len(indices)] = out[k]
                good.extend(indices)
            bar.update(done)
    bar.close()
    if prep is not None:
        bad.sort(key=lambda item: item[0])  # a refused file's entry came after its batch's loader ones
    if prep is not None and stats["cpu"]:
        log.info("features: %d of %d file(s) decoded on the CPU (not plain JPEG, or refused by the GPU decoder)",
                 stats["cpu"], len(files))
    return {k: a[:len(good)] for k, a in arrays.items()}, good, bad


def _gpu_prep(ex: Extractor, device: torch.device, enabled: bool | None):
    """``(tensor twin of ex's transform, why)`` when JPEGs are to be decoded on ``device``, else ``(None, why)``."""
    on, why = G.wanted(device, enabled)
    if not on:
        return None, why
    prep = G.tensor_prep(ex)
    if prep is None:
        return None, f"backend {ex.name}: its transform {type(ex.prepare).__name__} has no GPU twin"
    return prep, why
