"""Backend ``vgg19``: torchvision VGG-19 at 224x224, the network Show, Attend and Tell reads (seed 004:
"the 14×14×512 feature map of the fourth convolutional layer before max pooling").

``grid`` = conv5_4 after its ReLU and before the last max-pool, 14x14x512 from a 224x224 input (SAT
flattens it to 196 annotations of 512); ``pooled`` = fc7 (4096, after its ReLU). Weights: a local file
``options.weights`` (torchvision's ``vgg19-dcbb9e9a.pth``, optional ``sha256``); without it the same
rule as ``vgg16`` (random weights with a warning; ``random_init: true`` says it is meant, for tests).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from r2m.vision import weights as W
from r2m.vision.extractors.base import FEATURES, Extractor, Scaled, load_state, select_kinds

log = logging.getLogger("r2m")

WEIGHTS_FILE = "vgg19-dcbb9e9a.pth"  # torchvision's ImageNet weights (https://download.pytorch.org/models/)
KINDS = {"pooled": (4096,), "grid": (14, 14, 512)}


def vgg19_features(net, x, kinds) -> dict[str, Any]:
    """The ``kinds`` of a torchvision VGG-19 on a normalised batch: ``grid`` = conv5_4 (before the last
    max-pool) as [N, 14, 14, 512], ``pooled`` = fc7 [N, 4096]."""
    conv5_4 = net.features[:-1](x)  # [N, 512, 14, 14]
    out = {}
    if "grid" in kinds:
        out["grid"] = conv5_4.permute(0, 2, 3, 1)
    if "pooled" in kinds:
        h = net.avgpool(net.features[-1](conv5_4)).flatten(1)
        out["pooled"] = net.classifier[:5](h)  # fc6, relu, dropout, fc7, relu
    return out


@FEATURES.register("vgg19")
def vgg19(options: dict[str, Any]) -> Extractor:
    """torchvision VGG-19 at 224x224: ``grid`` = conv5_4 14x14x512, ``pooled`` = fc7 (4096)."""
    import torchvision

    kinds = select_kinds(KINDS, options, ["pooled", "grid"])
    net = torchvision.models.vgg19(weights=None)
    if options.get("weights"):
        net.load_state_dict(load_state(W.user_file(options["weights"], options.get("sha256"))), strict=True)
    else:
        warnings.warn(
            f"vgg19: no options.weights given — using RANDOM weights; features are meaningless "
            f"(set the options.weights of this backend to torchvision's {WEIGHTS_FILE})", stacklevel=2
        )
        if not options.get("random_init"):
            log.warning("vgg19: no options.weights; features come from a randomly initialised network")

    def fn(net, x):
        return vgg19_features(net, x, kinds)

    return Extractor("vgg19", Scaled(net, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225], fn).eval(),
                     (224, 224), kinds)
