"""Backend ``faster_rcnn``: a torchvision detection model. ``options.checkpoint`` (a state dict) +
``options.classes`` (class names, one per line, index 0 = background) for a local, e.g.
OpenImages-trained, model; otherwise torchvision's COCO weights (a download: fails offline with a
clear message). ``random_init: true`` + ``num_classes`` builds an untrained model (plumbing tests
only). Options: ``arch`` (a torchvision detection model name), ``min_size``, ``max_size``,
``max_detections``, ``floor``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from r2m.text.dictionary import Dictionary
from r2m.vision import weights as W
from r2m.vision.detectors.base import DEFAULT_FLOOR, Detector, ImageDetector, Raw


def read_class_names(path: str | Path) -> list[str]:
    names = [ln.strip() for ln in Path(path).read_text(encoding="utf-8").splitlines()]
    if not names or any(not n for n in names):
        raise ValueError(f"{path}: class names must be non-empty, one per line (index 0 = background)")
    return names


class FasterRCNN(ImageDetector):
    def __init__(self, options: dict[str, Any], dictionary: Dictionary, device: Any):
        import torch
        import torchvision

        self.dictionary, self.device = dictionary, torch.device(device or "cpu")
        self.floor = float(options.get("floor", DEFAULT_FLOOR))
        arch = str(options.get("arch", "fasterrcnn_resnet50_fpn"))
        kw: dict[str, Any] = {k: options[k] for k in ("min_size", "max_size") if k in options}
        kw["box_score_thresh"] = self.floor
        kw["box_detections_per_img"] = int(options.get("max_detections", 100))
        if options.get("checkpoint") or options.get("random_init"):
            if options.get("classes"):
                self.classes = read_class_names(options["classes"])
            elif options.get("random_init"):
                self.classes = ["__background__"] + [f"class{i}" for i in range(1, int(options.get("num_classes", 2)))]
            else:
                raise ValueError("faster_rcnn: options.checkpoint needs options.classes (a class-name file)")
            net = torchvision.models.get_model(arch, weights=None, weights_backbone=None,
                                               num_classes=len(self.classes), **kw)
            if options.get("checkpoint"):
                state = torch.load(W.user_file(options["checkpoint"], options.get("sha256")),
                                   map_location="cpu", weights_only=True)
                net.load_state_dict(state.get("model", state) if isinstance(state, dict) else state)
        else:
            weights = torchvision.models.get_model_weights(arch).DEFAULT
            try:
                net = torchvision.models.get_model(arch, weights=weights, **kw)
            except Exception as err:
                raise RuntimeError(
                    f"faster_rcnn: could not fetch torchvision's COCO weights for {arch} ({type(err).__name__}: "
                    f"{err}); offline, set detect_concepts.options.checkpoint + options.classes, or use the "
                    "'offline' or 'precomputed' backend"
                ) from None
            self.classes = list(weights.meta["categories"])
        self.net = net.eval().to(self.device)

    def prepare(self, img):
        from torchvision.transforms import functional as F

        return F.to_tensor(img)

    def predict(self, xs, sizes):
        import torch

        with torch.inference_mode():
            outs = self.net([x.to(self.device) for x in xs])
        res = []
        for o in outs:
            raws: list[Raw] = []
            for box, lab, s in zip(o["boxes"].tolist(), o["labels"].tolist(), o["scores"].tolist(), strict=True):
                name = self.classes[lab] if 0 <= lab < len(self.classes) else str(lab)
                raws.append((name, None, s, tuple(box)))
            res.append(raws)
        return res


def build(options, dictionary, device) -> Detector:
    return FasterRCNN(options, dictionary, device)
