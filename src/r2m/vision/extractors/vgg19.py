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

from r2m.vision.extractors.base import Extractor
from r2m.vision.extractors.vgg16 import build_vgg

DEFAULT_WEIGHTS = "data/weights/vgg19-dcbb9e9a.pth"


def vgg19(options: dict[str, Any]) -> Extractor:
    """torchvision VGG-19 at 224x224: ``grid`` = conv5_4 14x14x512, ``pooled`` = fc7 (4096)."""
    return build_vgg("vgg19", options, DEFAULT_WEIGHTS)
