"""Backend ``faces``: MTCNN (facenet-pytorch's bundled P/R/O-Nets); every face gives the labels
``Person`` and ``Human face`` (-> ``person``, ``face``) with the face box. Options: ``labels``,
``min_face_size``, ``thresholds``, ``floor`` (0.9)."""

from __future__ import annotations

from typing import Any

from r2m.text.dictionary import Dictionary
from r2m.vision.detectors.base import Detector, ImageDetector, Raw


def _mtcnn_class():
    try:  # facenet-pytorch is installed --no-deps; the MTCNN module needs only torch/torchvision/PIL
        from facenet_pytorch.models.mtcnn import MTCNN
    except ImportError as err:
        raise ImportError(
            f"faces backend needs facenet-pytorch (pip install --no-deps facenet-pytorch==2.6.0): {err}"
        ) from None
    return MTCNN


class Faces(ImageDetector):
    """MTCNN faces -> ``Person`` and ``Human face`` detections with the face box."""

    def __init__(self, options: dict[str, Any], dictionary: Dictionary, device: Any):
        import torch

        self.dictionary = dictionary
        self.floor = float(options.get("floor", 0.9))
        self.labels = list(options.get("labels", ["Person", "Human face"]))
        kwargs = {"keep_all": True, "device": torch.device(device or "cpu"),
                  "min_face_size": int(options.get("min_face_size", 20))}
        if "thresholds" in options:
            kwargs["thresholds"] = list(options["thresholds"])
        self.mtcnn = _mtcnn_class()(**kwargs)

    def prepare(self, img):
        return img  # MTCNN takes PIL images (it builds its own pyramid)

    def predict(self, imgs, sizes):
        import torch

        out = []
        for img, (w, h) in zip(imgs, sizes, strict=True):
            with torch.inference_mode():
                boxes, probs = self.mtcnn.detect(img)
            raws: list[Raw] = []
            if boxes is not None:
                for (x1, y1, x2, y2), p in zip(boxes, probs, strict=True):
                    box = (max(0.0, float(x1)), max(0.0, float(y1)), min(float(w), float(x2)), min(float(h), float(y2)))
                    raws += [(label, None, float(p), box) for label in self.labels]
            out.append(raws)
        return out


def build(options, dictionary, device) -> Detector:
    return Faces(options, dictionary, device)
