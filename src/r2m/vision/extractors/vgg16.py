"""Backend ``vgg16``: torchvision VGG-16 at 224x224 (``options.weights`` file, else random with a warning)."""

from __future__ import annotations

import logging
import warnings
from typing import Any

from r2m.vision import weights as W
from r2m.vision.extractors.base import FEATURES, Extractor, Scaled, load_state, select_kinds

log = logging.getLogger("r2m")


@FEATURES.register("vgg16")
def vgg16(options: dict[str, Any]) -> Extractor:
    """torchvision VGG-16 at 224x224: ``pooled`` = fc7 (4096, after ReLU), ``grid`` = conv5_3 14x14x512."""
    import torchvision

    kinds = select_kinds({"pooled": (4096,), "grid": (14, 14, 512)}, options, ["pooled", "grid"])
    net = torchvision.models.vgg16(weights=None)
    if options.get("weights"):
        net.load_state_dict(load_state(W.user_file(options["weights"], options.get("sha256"))), strict=True)
    else:
        warnings.warn(
            "vgg16: no options.weights given — using RANDOM weights; features are meaningless "
            "(set extract_features.options.weights to torchvision's vgg16-397923af.pth)", stacklevel=2
        )
        if not options.get("random_init"):
            log.warning("vgg16: no options.weights; features come from a randomly initialised network")

    def fn(net, x):
        conv5 = net.features[:-1](x)  # before the last max-pool: [N, 512, 14, 14]
        out = {}
        if "grid" in kinds:
            out["grid"] = conv5.permute(0, 2, 3, 1)
        if "pooled" in kinds:
            h = net.avgpool(net.features[-1](conv5)).flatten(1)
            out["pooled"] = net.classifier[:5](h)  # fc6, relu, dropout, fc7, relu
        return out

    return Extractor("vgg16", Scaled(net, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225], fn).eval(),
                     (224, 224), kinds)
