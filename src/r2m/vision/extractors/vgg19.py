"""Backend ``vgg19``: torchvision VGG-19 at 224x224, the network Show, Attend and Tell reads (seed 004:
"the 14×14×512 feature map of the fourth convolutional layer before max pooling").

``grid`` = conv5_4 after its ReLU and before the last max-pool, 14x14x512 from a 224x224 input (SAT
flattens it to 196 annotations of 512); ``pooled`` = fc7 (4096, after its ReLU). Weights: a local file
``options.weights`` (default :data:`DEFAULT_WEIGHTS`, torchvision's ``vgg19-dcbb9e9a.pth``, optional
``sha256``); the same rule as ``vgg16`` (no file: one-line error; random weights only with
``random_init: true``).
"""

from __future__ import annotations

from typing import Any

from r2m.vision.extractors.base import FEATURES, Extractor, Scaled, select_kinds
from r2m.vision.extractors.vgg16 import KINDS, load_weights, vgg_kinds

DEFAULT_WEIGHTS = "data/weights/vgg19-dcbb9e9a.pth"


@FEATURES.register("vgg19")
def vgg19(options: dict[str, Any]) -> Extractor:
    """torchvision VGG-19 at 224x224: ``grid`` = conv5_4 14x14x512, ``pooled`` = fc7 (4096)."""
    import torchvision

    kinds = select_kinds(KINDS, options, ["pooled", "grid"])
    net = torchvision.models.vgg19(weights=None)
    load_weights(net, "vgg19", options, DEFAULT_WEIGHTS)
    return Extractor("vgg19", Scaled(net, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225],
                                     lambda net, x: vgg_kinds(net, x, kinds)).eval(), (224, 224), kinds)
