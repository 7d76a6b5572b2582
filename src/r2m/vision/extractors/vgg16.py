"""Backend ``vgg16``: torchvision VGG-16 at 224x224, weights from a local file (``options.weights``,
default :data:`DEFAULT_WEIGHTS`); no file → one-line error (:class:`r2m.vision.weights.MissingWeights`),
random weights only with ``options.random_init: true``."""

from __future__ import annotations

import warnings
from typing import Any

from r2m.vision import weights as W
from r2m.vision.extractors.base import FEATURES, Extractor, Scaled, load_state, select_kinds

# where the backend looks when ``options.weights`` is not given (relative to the repository root)
DEFAULT_WEIGHTS = "data/weights/vgg16-397923af.pth"
HOW = ("download torchvision's vgg16-397923af.pth (https://download.pytorch.org/models/vgg16-397923af.pth) "
       "there, or name your copy in options.weights")


def _load(net, options: dict[str, Any]) -> None:
    """Weights into ``net``: the named or default file, or none with ``random_init: true``."""
    W.check_random_init("vgg16", options)
    if options.get("random_init"):
        warnings.warn("vgg16: random weights (options.random_init) — features are meaningless", stacklevel=3)
        return
    path = W.user_file(options.get("weights") or DEFAULT_WEIGHTS, options.get("sha256"), "vgg16", HOW)
    net.load_state_dict(load_state(path), strict=True)


@FEATURES.register("vgg16")
def vgg16(options: dict[str, Any]) -> Extractor:
    """torchvision VGG-16 at 224x224: ``pooled`` = fc7 (4096, after ReLU), ``grid`` = conv5_3 14x14x512."""
    import torchvision

    kinds = select_kinds({"pooled": (4096,), "grid": (14, 14, 512)}, options, ["pooled", "grid"])
    net = torchvision.models.vgg16(weights=None)
    _load(net, options)

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
