"""Backend ``vgg16``: torchvision VGG-16 at 224x224, weights from a local file (``options.weights``,
default :data:`DEFAULT_WEIGHTS`); no file → one-line error (:class:`r2m.vision.weights.MissingWeights`),
random weights only with ``options.random_init: true``. :func:`build_vgg` builds ``vgg19`` too."""

from __future__ import annotations

import warnings
from typing import Any

from r2m.vision import weights as W
from r2m.vision.extractors.base import Extractor, Scaled, load_state, select_kinds

# where the backend looks when ``options.weights`` is not given (relative to the repository root)
DEFAULT_WEIGHTS = "data/weights/vgg16-397923af.pth"
KINDS = {"pooled": (4096,), "grid": (14, 14, 512)}


def how_to_get(file: str) -> str:
    """The hint of the missing-weights error for one of torchvision's ImageNet files."""
    return (f"download torchvision's {file} (https://download.pytorch.org/models/{file}) there, or name your "
            "copy in options.weights")


def load_weights(net, what: str, options: dict[str, Any], default: str) -> None:
    """Weights into ``net``: the named or ``default`` file (missing: one-line error), or none with
    ``random_init: true``."""
    W.check_random_init(what, options)
    if options.get("random_init"):
        warnings.warn(f"{what}: random weights (options.random_init) — features are meaningless", stacklevel=4)
        return
    path = W.user_file(options.get("weights") or default, options.get("sha256"), what,
                       how_to_get(default.rsplit("/", 1)[-1]))
    net.load_state_dict(load_state(path), strict=True)


def vgg_kinds(net, x, kinds) -> dict[str, Any]:
    """The ``kinds`` of a torchvision VGG on a normalised 224x224 batch: ``grid`` = the last conv layer
    before the last max-pool (conv5_3 of VGG-16, conv5_4 of VGG-19) as [N, 14, 14, 512], ``pooled`` =
    fc7 [N, 4096] (after its ReLU)."""
    conv5 = net.features[:-1](x)  # [N, 512, 14, 14]
    out = {}
    if "grid" in kinds:
        out["grid"] = conv5.permute(0, 2, 3, 1)
    if "pooled" in kinds:
        h = net.avgpool(net.features[-1](conv5)).flatten(1)
        out["pooled"] = net.classifier[:5](h)  # fc6, relu, dropout, fc7, relu
    return out


def build_vgg(arch: str, options: dict[str, Any], default: str) -> Extractor:
    """torchvision's ``arch`` (``vgg16``, ``vgg19``) at 224x224 with the weights of :func:`load_weights`
    (``default``: the file looked for when ``options.weights`` is not given) and the kinds of :func:`vgg_kinds`."""
    import torchvision

    kinds = select_kinds(KINDS, options, ["pooled", "grid"])
    net = getattr(torchvision.models, arch)(weights=None)
    load_weights(net, arch, options, default)
    return Extractor(arch, Scaled(net, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225],
                                  lambda net, x: vgg_kinds(net, x, kinds)).eval(), (224, 224), kinds)


def vgg16(options: dict[str, Any]) -> Extractor:
    """torchvision VGG-16 at 224x224: ``pooled`` = fc7 (4096, after ReLU), ``grid`` = conv5_3 14x14x512."""
    return build_vgg("vgg16", options, DEFAULT_WEIGHTS)
