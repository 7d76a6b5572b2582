"""Backend ``inception_v4`` (the paper's): timm Inception-V4 with the TF-slim ImageNet weights and
the authors' TF1 preprocessing (resize 346, centre crop 299; ``tf1.py``)."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from r2m.vision import weights as W
from r2m.vision.extractors.base import Extractor, Scaled, load_state, select_kinds
from r2m.vision.extractors.tf1 import OfficialResizeCrop

HOW = ("set options.weights to a local checkpoint of timm's inception_v4.tf_in1k (its model.safetensors, "
       "https://huggingface.co/timm/inception_v4.tf_in1k)")
OPTIONS = frozenset({"kinds", "weights", "sha256", "random_init", "preprocess", "resize", "crop"})


def _network(options: dict[str, Any]):
    """The timm network without its classifier: local weights, random (``random_init``), or timm's
    download; neither → one-line :class:`r2m.vision.weights.MissingWeights`."""
    import timm

    W.check_random_init("inception_v4", options)
    if options.get("weights"):
        net = timm.create_model("inception_v4", pretrained=False, num_classes=0)
        path = W.user_file(options["weights"], options.get("sha256"), "inception_v4", HOW)
        net.load_state_dict(load_state(path, ("last_linear.", "fc.", "classifier.")), strict=True)
        return net
    if options.get("random_init"):
        warnings.warn("inception_v4: random weights (options.random_init) — features are meaningless", stacklevel=3)
        return timm.create_model("inception_v4", pretrained=False, num_classes=0)
    try:
        return timm.create_model("inception_v4.tf_in1k", pretrained=True, num_classes=0)
    except Exception as err:
        raise W.MissingWeights(
            f"inception_v4: could not fetch timm's pretrained weights inception_v4.tf_in1k ({type(err).__name__}: "
            f"{' '.join(str(err).split())}); {HOW}, or use the offline backend inception_v3_fid"
        ) from None


def inception_v4(options: dict[str, Any]) -> Extractor:
    """timm Inception-V4 (the paper's): ``pooled`` 1536-d, optional ``grid`` 8x8x1536.

    Weights: ``weights`` (a local ``.pth``/``.bin``/``.safetensors`` state dict, e.g. timm's
    ``inception_v4.tf_in1k`` = the TF-slim ImageNet checkpoint the authors used, ported; optional
    ``sha256``), else timm's ``inception_v4.tf_in1k`` from the Hugging Face hub (a download, cached by
    timm), or ``random_init: true`` (tests). ``preprocess``: ``official`` (default; TF1 bilinear resize
    to ``resize`` 346 then the centre ``crop`` 299, as the authors' code) or ``resize`` (PIL bicubic
    straight to 299, timm-style without the crop)."""
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        raise ValueError(f"extract_features.options (backend inception_v4): unknown option(s) {unknown}; "
                         f"known: {', '.join(sorted(OPTIONS))}")
    kinds = select_kinds({"pooled": (1536,), "grid": (8, 8, 1536)}, options, ["pooled"])
    preprocess = options.get("preprocess", "official")
    if preprocess not in ("official", "resize"):
        raise ValueError(f"extract_features.options.preprocess: 'official' or 'resize', got {preprocess!r}")
    crop = int(options.get("crop", 299))
    transform = OfficialResizeCrop(int(options.get("resize", 346)), crop) if preprocess == "official" else None
    net = _network(options)
    size = crop if preprocess == "official" else 299
    if "grid" in kinds and size != 299:
        with torch.inference_mode():
            g = net.eval().forward_features(torch.zeros(1, 3, size, size)).shape[-1]
        kinds = {**kinds, "grid": (g, g, 1536)}

    def fn(net, x):
        fmap = net.forward_features(x)  # [N, 1536, 8, 8] at 299
        out = {}
        if "pooled" in kinds:
            out["pooled"] = fmap.mean(dim=(2, 3))
        if "grid" in kinds:
            out["grid"] = fmap.permute(0, 2, 3, 1)
        return out

    return Extractor("inception_v4", Scaled(net, [0.5] * 3, [0.5] * 3, fn).eval(), (size, size), kinds, "bicubic",
                     transform)
