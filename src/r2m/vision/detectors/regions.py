"""Backend ``regions``: several objects per photo from an ImageNet classifier, offline.

The image is cut into regions — the whole image (the ``classifier`` backend's view: resize 256,
centre crop 224) plus, for every ``s`` in ``scales``, an ``s × s`` grid of overlapping crops
(each ``(1 + overlap) / s`` of the image's width and height, evenly spread from edge to edge),
each resized to ``size × size``. All regions of a batch of images go through the classifier in
one batch. Per region, ImageNet softmax probabilities are summed per dictionary concept (as in
``classifier``) and its ``per_region`` best concepts become candidates, crop scores multiplied by
``crop_weight``. Candidates are merged per concept with :func:`merge_regions`: the best-scoring
region gives the concept's score and box, and other regions of that concept are suppressed when
their box overlaps a kept one by IoU ≥ ``nms_iou`` (non-maximum suppression), so two separate
instances survive while overlapping crops of one object do not. At most ``max_detections`` per
image are returned, best first.

Options: ``scales`` ([3]), ``overlap`` (0.5), ``size`` (224), ``per_region`` (3), ``crop_weight``
(0.8), ``nms_iou`` (0.5), ``max_detections`` (20), ``chunk`` (regions per forward pass, 64),
plus the classifier's ``floor``, ``weights`` (+ ``sha256``) and ``mapping``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from r2m.text.dictionary import Dictionary
from r2m.vision.detectors.base import Detector, Raw
from r2m.vision.detectors.classifier import Classifier

Box = tuple[float, float, float, float]


def iou(a: Box, b: Box) -> float:
    """Intersection over union of two ``(x1, y1, x2, y2)`` boxes (0 for empty boxes)."""
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def merge_regions(cands: Sequence[Raw], nms_iou: float = 0.5, max_detections: int | None = None) -> list[Raw]:
    """Per concept (``Raw[1]``, else the label): keep the best-scoring candidate, drop candidates of
    the same concept whose box overlaps a kept one by IoU ≥ ``nms_iou``; the result is ordered by
    descending score (ties: concept, then box) and cut to ``max_detections``."""
    order = sorted(cands, key=lambda r: (-r[2], r[1] or r[0], r[3]))
    kept: list[Raw] = []
    boxes: dict[str, list[Box]] = {}
    for r in order:
        key = r[1] or r[0]
        if any(iou(r[3], b) >= nms_iou for b in boxes.get(key, [])):
            continue
        boxes.setdefault(key, []).append(r[3])
        kept.append(r)
    return kept[:max_detections] if max_detections is not None else kept


def grid_boxes(w: int, h: int, scales: Sequence[int], overlap: float) -> list[Box]:
    """The crop boxes of all grids (whole image not included), row-major per scale."""
    out: list[Box] = []
    for s in scales:
        if s < 1:
            raise ValueError(f"regions: scales must be >= 1, got {s}")
        cw, ch = min(float(w), w * (1 + overlap) / s), min(float(h), h * (1 + overlap) / s)
        for j in range(s):
            for i in range(s):
                x1 = (w - cw) * i / (s - 1) if s > 1 else (w - cw) / 2
                y1 = (h - ch) * j / (s - 1) if s > 1 else (h - ch) / 2
                out.append((x1, y1, x1 + cw, y1 + ch))
    return out


class Regions(Classifier):
    """Whole image + multi-scale grid of crops, classified in one batch, merged per concept."""

    def __init__(self, options: dict[str, Any], dictionary: Dictionary, device: Any):
        super().__init__(options, dictionary, device)
        self.scales = [int(s) for s in options.get("scales", [3])]
        self.overlap = float(options.get("overlap", 0.5))
        self.size = int(options.get("size", 224))
        self.per_region = int(options.get("per_region", 3))
        self.crop_weight = float(options.get("crop_weight", 0.8))
        self.nms_iou = float(options.get("nms_iou", 0.5))
        self.max_detections = int(options.get("max_detections", 20))
        self.chunk = int(options.get("chunk", 64))
        grid_boxes(2, 2, self.scales, self.overlap)  # validates the scales up front

    def prepare(self, img):
        import torch
        from torchvision.transforms import functional as F

        w, h = img.size
        views = [super().prepare(img)]
        for x1, y1, x2, y2 in grid_boxes(w, h, self.scales, self.overlap):
            crop = img.crop((round(x1), round(y1), round(x2), round(y2)))
            crop = F.resize(crop, [self.size, self.size], interpolation=F.InterpolationMode.BILINEAR, antialias=True)
            views.append(F.normalize(F.to_tensor(crop), [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]))
        if self.size != 224:
            views[0] = F.resize(views[0], [self.size, self.size], antialias=True)
        return torch.stack(views)  # [R, 3, size, size]

    def predict(self, x, sizes):
        import torch

        if isinstance(x, list):  # images of one batch always give the same number of regions
            x = torch.stack(x)
        b, r = x.shape[:2]
        flat = x.reshape(b * r, *x.shape[2:])
        with torch.inference_mode():
            probs = torch.cat([self.net(flat[i: i + self.chunk].to(self.device)).float().softmax(-1)
                               for i in range(0, len(flat), self.chunk)])  # [B*R, 1000]
            scores = (probs @ self.membership).view(b, r, -1)  # [B, R, n_concepts]
            k = min(self.per_region, scores.shape[-1])
            top_s, top_c = scores.topk(k, dim=-1)
            # the ImageNet class behind each candidate concept (its most probable member class)
            probs = probs.view(b, r, -1)
        out = []
        for n, (w, h) in enumerate(sizes):
            boxes = [(0.0, 0.0, float(w), float(h)), *grid_boxes(w, h, self.scales, self.overlap)]
            cands: list[Raw] = []
            for j, box in enumerate(boxes):
                weight = 1.0 if j == 0 else self.crop_weight
                for s, c in zip(top_s[n, j].tolist(), top_c[n, j].tolist(), strict=True):
                    if s * weight < self.floor:
                        continue
                    best = int((probs[n, j] * self.membership[:, c]).argmax())
                    cands.append((self.categories[best], self.concepts[c], s * weight, box))
            out.append(merge_regions(cands, self.nms_iou, self.max_detections))
        return out


def build(options, dictionary, device) -> Detector:
    return Regions(options, dictionary, device)
