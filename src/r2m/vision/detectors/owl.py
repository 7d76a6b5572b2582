"""Backend ``owl``: open-vocabulary detection with OWL-ViT / OWLv2 (Hugging Face ``transformers``,
optional extra ``owl``: ``pip install -e '.[owl]'``), queried with the visual dictionary's class names.

Every class name of the dictionary (the 601 OpenImages-v4 names by default, or ``options.labels``)
becomes a text query (``prompt``, default ``"a photo of a {}"``); the query embeddings are computed
once, then each batch of images goes through the vision tower once and every predicted box gets the
query with the highest sigmoid score (as the Hugging Face post-processing does), its box in pixels
(OWLv2 pads images to a square at the bottom/right before resizing, OWL-ViT stretches them), then
per-label non-maximum suppression (``nms_iou``) and the ``max_detections`` best per image.

Weights: ``model`` is a local folder saved with ``save_pretrained`` (model + tokenizer + image
processor) or a hub id (default ``google/owlv2-base-patch16-ensemble``), fetched by ``transformers``
into its cache only when ``allow_download: true``; otherwise a missing local copy is an error that
says how to get one. Runs on the stage's device (CUDA when present, bf16 autocast there).

Options: ``model``, ``revision``, ``allow_download`` (false), ``prompt``, ``labels`` (list of class
names; default the dictionary's), ``query_batch`` (128 text queries per forward), ``nms_iou``
(0.5), ``max_detections`` (50), ``floor`` (0.05).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from r2m.text.dictionary import Dictionary
from r2m.utils.options import parse_options, require
from r2m.vision.detectors.base import DEFAULT_FLOOR, Detector, ImageDetector, Raw

log = logging.getLogger("r2m")
DEFAULT_MODEL = "google/owlv2-base-patch16-ensemble"


@dataclass
class OwlConfig:
    model: str = DEFAULT_MODEL
    revision: str | None = None
    allow_download: bool = False
    prompt: str = "a photo of a {}"
    labels: list[str] | None = None
    query_batch: int = 128
    nms_iou: float = 0.5
    max_detections: int = 50
    floor: float = DEFAULT_FLOOR

    def validate(self, where: str) -> None:
        if "{}" not in self.prompt:
            raise ValueError(f"{where}: prompt must contain '{{}}' where the class name goes, got {self.prompt!r}")
        if not 0 <= self.floor <= 1 or not 0 < self.nms_iou <= 1:
            raise ValueError(f"{where}: floor must be in [0, 1] and nms_iou in (0, 1]")
        if self.query_batch < 1 or self.max_detections < 1:
            raise ValueError(f"{where}: query_batch and max_detections must be >= 1")
        if self.labels is not None and (not self.labels or any(not str(x).strip() for x in self.labels)):
            raise ValueError(f"{where}: labels must be a non-empty list of class names")


def boxes_to_pixels(boxes, w: int, h: int, padded_square: bool):
    """``[P, 4]`` normalised (cx, cy, bw, bh) -> pixel (x1, y1, x2, y2) clipped to the image.

    OWLv2's processor pads the image to a square (bottom/right) before resizing, so coordinates are
    relative to the padded side ``max(w, h)``; OWL-ViT's stretches the image, so they are relative
    to ``(w, h)``."""
    import torch

    sx, sy = (max(w, h), max(w, h)) if padded_square else (w, h)
    cx, cy, bw, bh = boxes.unbind(-1)
    xyxy = torch.stack([(cx - bw / 2) * sx, (cy - bh / 2) * sy, (cx + bw / 2) * sx, (cy + bh / 2) * sy], -1)
    limits = torch.tensor([w, h, w, h], dtype=xyxy.dtype, device=xyxy.device)
    return torch.minimum(xyxy.clamp(min=0), limits)


class OwlDetector(ImageDetector):
    def __init__(self, cfg: OwlConfig, dictionary: Dictionary, device: Any):
        transformers = require("transformers", "owl", "detect_concepts backend 'owl'")
        import torch

        self.cfg, self.dictionary, self.floor = cfg, dictionary, cfg.floor
        self.device = torch.device(device or "cpu")
        local = Path(cfg.model).expanduser()
        source = str(local) if local.exists() else cfg.model
        kw: dict[str, Any] = {"revision": cfg.revision, "local_files_only": not cfg.allow_download}
        try:
            self.model = transformers.AutoModelForZeroShotObjectDetection.from_pretrained(source, **kw)
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(source, **kw)
            self.processor = transformers.AutoImageProcessor.from_pretrained(source, **kw)
        except OSError as err:
            hint = ("it is not a local folder; pass a folder saved with save_pretrained, or set "
                    "options.allow_download: true to let transformers fetch it from the hub")
            raise RuntimeError(f"owl: cannot load {cfg.model!r} ({str(err).splitlines()[0]}); "
                               f"{hint if not local.exists() else 'the folder is incomplete'}") from None
        kind = self.model.config.model_type
        if kind not in ("owlvit", "owlv2"):
            raise ValueError(f"owl: {cfg.model!r} is a {kind!r} model, not OWL-ViT/OWLv2")
        self.model = self.model.eval().to(self.device)
        self.padded_square = bool(getattr(self.processor, "do_pad", False))
        self.labels = [str(x).strip() for x in (cfg.labels or dictionary.labels)]
        self.concepts = [dictionary.label_to_concept(x) for x in self.labels]
        unknown = [x for x, c in zip(self.labels, self.concepts, strict=True) if c is None]
        if unknown:
            log.warning("owl: %d query label(s) map to no %s dictionary word (their detections are dropped), "
                        "e.g. %s", len(unknown), dictionary.name, unknown[:5])
        self.queries = self._embed_queries([cfg.prompt.format(x) for x in self.labels])  # [Q, D]
        log.info("owl: %s (%s) on %s, %d text queries", cfg.model, kind, self.device, len(self.labels))

    @property
    def _base(self):
        return self.model.base_model  # OwlViTModel / Owlv2Model

    def _autocast(self):
        import torch

        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda")

    def _embed_queries(self, texts: list[str]):
        import torch

        limit = getattr(self.model.config.text_config, "max_position_embeddings", 16)
        out = []
        with torch.inference_mode(), self._autocast():
            for a in range(0, len(texts), self.cfg.query_batch):
                tok = self.tokenizer(texts[a:a + self.cfg.query_batch], padding="max_length", truncation=True,
                                     max_length=limit, return_tensors="pt")
                feats = self._base.get_text_features(input_ids=tok["input_ids"].to(self.device),
                                                     attention_mask=tok["attention_mask"].to(self.device))
                feats = getattr(feats, "pooler_output", feats)
                out.append(feats.float())
        return torch.cat(out)

    def raw_outputs(self, pixel_values):
        """``(logits [B, P, Q], boxes [B, P, 4] normalised cxcywh)`` for a batch of processed images."""
        import torch

        with torch.inference_mode(), self._autocast():
            feature_map = self.model.image_embedder(pixel_values=pixel_values.to(self.device))[0]
            b, ph, pw, d = feature_map.shape
            feats = feature_map.reshape(b, ph * pw, d)
            queries = self.queries.to(feats.dtype).unsqueeze(0).expand(b, -1, -1)
            mask = torch.ones(queries.shape[:2], dtype=torch.bool, device=self.device)
            logits = self.model.class_predictor(feats, queries, mask)[0]
            boxes = self.model.box_predictor(feats, feature_map)
        return logits.float(), boxes.float()

    def prepare(self, img):
        return img  # the model's own image processor resizes/pads/normalises the batch

    def predict(self, imgs, sizes):
        from torchvision.ops import batched_nms

        pixel_values = self.processor(images=list(imgs), return_tensors="pt")["pixel_values"]
        logits, boxes = self.raw_outputs(pixel_values)
        scores, best = logits.sigmoid().max(dim=-1)  # [B, P]
        out: list[list[Raw]] = []
        for n, (w, h) in enumerate(sizes):
            keep = scores[n] >= self.floor
            s, q = scores[n][keep], best[n][keep]
            xyxy = boxes_to_pixels(boxes[n][keep], w, h, self.padded_square)
            if len(s):
                idx = batched_nms(xyxy, s, q, self.cfg.nms_iou)[: self.cfg.max_detections]
                s, q, xyxy = s[idx], q[idx], xyxy[idx]
            raws: list[Raw] = []
            for score, qi, box in zip(s.tolist(), q.tolist(), xyxy.tolist(), strict=True):
                concept = self.concepts[qi]
                if concept is not None:
                    raws.append((self.labels[qi], concept, float(score), tuple(box)))
            out.append(raws)
        return out


def build(options, dictionary, device) -> Detector:
    return OwlDetector(parse_options(OwlConfig, options, "detect_concepts.options (backend owl)"), dictionary, device)
