"""Backend ``tf_oid``: the paper's detector — TensorFlow's Faster R-CNN Inception-ResNet-v2 (atrous)
trained on OpenImages-v4, run through TensorFlow (optional extra ``tf``: ``pip install -e '.[tf]'``).

The concepts of R²M (and UC-GAN before it) came from this model (the authors' preprocessing loads
``faster_rcnn_inception_resnet_v2_atrous_oid_v4_2018_12_12`` from the TF object-detection model
zoo); no PyTorch port exists. Two public releases, both TensorFlow SavedModels, are understood:

``source: hub``
    TF Hub ``google/faster_rcnn/openimages_v4/inception_resnet_v2/1`` (TF1 Hub format). Signature
    ``default``: input ``images`` float32 ``[1, H, W, 3]`` in [0, 1] (one image per call); outputs
    ``detection_boxes`` ``[N, 4]`` (normalised ymin, xmin, ymax, xmax), ``detection_scores``,
    ``detection_class_entities`` / ``detection_class_names`` (strings: display names and
    Freebase MIDs such as ``/m/01g317``), ``detection_class_labels``.
``source: zoo`` (default)
    the model zoo archive (the release the authors' code loads); its ``saved_model/`` has the signature
    ``serving_default``: input ``inputs`` uint8 ``[B, H, W, 3]``; outputs ``detection_boxes``
    ``[B, 100, 4]``, ``detection_scores``, ``detection_classes`` (class ids 1..601 of the
    OpenImages-v4 label map, whose order is ``data/dictionaries/openimages_v4_boxable.names``) and
    ``num_detections``.

Any SavedModel with these names works; which input dtype, batch size and label outputs it has is
read from its signature. Images of one loader batch that share a size go through the model
together when its input has a free batch dimension; otherwise one image per call.

Options (``detect_concepts.options``): ``model`` (a local SavedModel folder, or a ``.tar.gz`` /
``.zip`` of one; no download then), ``source`` (``zoo`` | ``hub`` | a URL; downloaded once into
``cache_dir``, default ``$R2M_CACHE`` or ``~/.cache/r2m``, its SHA-256 recorded beside it on the first
download and checked on every later run), ``sha256`` (pin the archive), ``signature``, ``tags``
(meta-graph tags of a TF1 SavedModel), ``classes`` (class-id names file for id outputs; default the
OpenImages-v4 names), ``mid_names`` (CSV ``MID,Display name`` for models that output MIDs only),
``floor`` (0.05), ``max_detections`` (100 per image).
"""

from __future__ import annotations

import csv
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from r2m.text.dictionary import DICTIONARY_DIR, Dictionary, read_names
from r2m.utils.options import parse_options, require
from r2m.vision import weights as W
from r2m.vision.detectors.base import DEFAULT_FLOOR, Detector, ImageDetector, Raw
from r2m.vision.downloads import TF_OID_SOURCES, cache_root

log = logging.getLogger("r2m")

SOURCES = TF_OID_SOURCES  # hub, zoo: r2m.vision.downloads, beside what the other backends download
OID_V4_NAMES = DICTIONARY_DIR / "openimages_v4_boxable.names"
LABEL_OUTPUTS = ("detection_class_entities", "detection_class_names")  # strings: names or MIDs
ID_OUTPUTS = ("detection_classes", "detection_class_labels")  # class ids (1-based into ``classes``), used
# only when the model has no string labels (the model zoo export)


@dataclass
class TFOIDConfig:
    model: str | None = None
    source: str = "zoo"
    sha256: str | None = None
    cache_dir: str | None = None
    signature: str | None = None
    tags: list[str] | None = None
    classes: str | None = None
    mid_names: str | None = None
    floor: float = DEFAULT_FLOOR
    max_detections: int = 100

    def validate(self, where: str) -> None:
        if not 0 <= self.floor <= 1:
            raise ValueError(f"{where}: floor must be in [0, 1], got {self.floor}")
        if self.max_detections < 1:
            raise ValueError(f"{where}: max_detections must be >= 1, got {self.max_detections}")
        if self.model is None and self.source not in SOURCES and "://" not in self.source:
            raise ValueError(f"{where}: source must be one of {sorted(SOURCES)} or a URL, got {self.source!r}")

    @property
    def url(self) -> str:
        return SOURCES.get(self.source, self.source)


class UnbatchedOutputs(RuntimeError):
    """The model was given several images but returned the outputs of one (no batch dimension)."""


def find_saved_model(path: Path) -> Path:
    """The folder holding ``saved_model.pb`` at or below ``path`` (an archive is unpacked first)."""
    if path.is_file():
        path = W.extract_archive(path)
    if not path.exists():
        raise FileNotFoundError(f"tf_oid: model not found: {path}")
    if (path / "saved_model.pb").is_file() or (path / "saved_model.pbtxt").is_file():
        return path
    found = sorted(p.parent for p in path.rglob("saved_model.pb*") if p.name in ("saved_model.pb", "saved_model.pbtxt"))
    if not found:
        raise FileNotFoundError(f"tf_oid: no saved_model.pb in {path} (expected a TensorFlow SavedModel folder)")
    return min(found, key=lambda p: len(p.parts))


def read_mid_names(path: str | Path) -> dict[str, str]:
    """``MID,Display name`` rows (OpenImages' ``class-descriptions-boxable.csv``) -> {MID: name}."""
    out = {}
    with open(path, newline="", encoding="utf-8") as fh:
        for n, row in enumerate(csv.reader(fh), 1):
            if not row:
                continue
            if len(row) < 2 or not row[0].startswith("/"):
                if n == 1:
                    continue  # a header
                raise ValueError(f"{path}:{n}: expected 'MID,Display name', got {row!r}")
            out[row[0].strip()] = row[1].strip()
    return out


def _is_mid(s: str) -> bool:
    return s.startswith(("/m/", "/g/"))


def _load(tf, folder: Path, tags: list[str] | None):
    """``tf.saved_model.load``; TF1 SavedModels with several meta-graphs (TF1 Hub format) need tags."""
    tries = [tags] if tags is not None else [None, [], ["serve"]]
    last: Exception | None = None
    for t in tries:
        try:
            return tf.saved_model.load(str(folder), tags=t)
        except (ValueError, RuntimeError) as err:  # "... MetaGraphs ... tags ..." -> try the next
            last = err
    raise RuntimeError(f"tf_oid: cannot load the SavedModel in {folder} ({last}); set options.tags") from None


class TFOIDDetector(ImageDetector):
    def __init__(self, cfg: TFOIDConfig, dictionary: Dictionary, device: Any):
        tf = require("tensorflow", "tf", "detect_concepts backend 'tf_oid'")
        self.tf, self.cfg, self.dictionary, self.floor = tf, cfg, dictionary, cfg.floor
        if str(device or "cpu").startswith("cpu"):  # the run asked for the CPU: keep TensorFlow off any GPU
            try:
                tf.config.set_visible_devices([], "GPU")
            except (RuntimeError, ValueError):  # devices already initialised in this process
                pass
        if cfg.model:
            folder = find_saved_model(Path(cfg.model).expanduser())
        else:
            cache = cache_root(cfg.cache_dir) / "detectors"
            folder = find_saved_model(W.cached_download(cfg.url, cache, cfg.sha256, log))
        self.folder = folder
        self._module = _load(tf, folder, cfg.tags)  # keep a reference: signatures need the loaded object alive
        sigs = dict(self._module.signatures)
        name = cfg.signature or next((s for s in ("default", "serving_default") if s in sigs), None)
        if name is None or name not in sigs:
            raise ValueError(f"tf_oid: {folder} has no signature {cfg.signature or 'default/serving_default'!r} "
                             f"(it has {sorted(sigs)}); set options.signature")
        self.fn = sigs[name]
        inputs = self.fn.structured_input_signature[1]
        if len(inputs) != 1:
            raise ValueError(f"tf_oid: signature {name!r} of {folder} takes {sorted(inputs)}; expected one image input")
        (self.input_name, spec), = inputs.items()
        self.input_float = spec.dtype.is_floating
        self.batched = spec.shape.rank is None or spec.shape[0] is None or spec.shape[0] > 1
        outs = set(self.fn.structured_outputs)
        missing = {"detection_boxes", "detection_scores"} - outs
        if missing or not outs & {*LABEL_OUTPUTS, *ID_OUTPUTS}:
            raise ValueError(f"tf_oid: signature {name!r} of {folder} lacks detection outputs "
                             f"(has {sorted(outs)}; needs detection_boxes, detection_scores and class names or ids)")
        self.classes = read_names(Path(cfg.classes) if cfg.classes else OID_V4_NAMES)
        self.mids = read_mid_names(cfg.mid_names) if cfg.mid_names else {}
        self.unmapped: dict[str, int] = {}
        log.info("tf_oid: %s signature %r, input %s %s %s, %s", folder, name, self.input_name, spec.dtype.name,
                 spec.shape, "batched" if self.batched else "one image per call")

    # ---------------------------------------------------------------- pixels in, raw detections out
    def prepare(self, img):
        return np.asarray(img, dtype=np.uint8)  # H x W x 3 RGB; scaled in predict by the input dtype

    def _call(self, arrays: list[np.ndarray]) -> list[dict[str, np.ndarray]]:
        x = np.stack(arrays)
        x = self.tf.constant(x.astype(np.float32) / 255.0 if self.input_float else x)
        out = {k: v.numpy() for k, v in self.fn(**{self.input_name: x}).items()}
        n = len(arrays)
        if out["detection_scores"].ndim == 1:  # unbatched outputs ([N]): one image per call only
            if n != 1:
                raise UnbatchedOutputs()
            return [out]
        return [{k: v[i] for k, v in out.items() if v.ndim >= 1 and v.shape[0] == n} for i in range(n)]

    def _label(self, out: dict[str, np.ndarray], j: int) -> str:
        names = []
        for key in LABEL_OUTPUTS:
            if key in out:
                v = out[key][j]
                names.append(v.decode("utf-8") if isinstance(v, bytes) else str(v))
        for s in names:  # a display name beats a MID
            if s and not _is_mid(s):
                return s
        for s in names:
            if s in self.mids:
                return self.mids[s]
        if names:  # string labels but only unknown MIDs: ids of such models follow their own label map
            return names[0]
        for key in ID_OUTPUTS:
            if key in out:
                k = int(out[key][j])
                if 1 <= k <= len(self.classes):
                    return self.classes[k - 1]
        return names[0] if names else "?"

    def _raws(self, out: dict[str, np.ndarray], w: int, h: int) -> list[Raw]:
        scores = out["detection_scores"].reshape(-1)
        n = len(scores)
        if "num_detections" in out:
            n = min(n, int(np.asarray(out["num_detections"]).reshape(-1)[0]))
        boxes = out["detection_boxes"].reshape(-1, 4)
        order = np.argsort(-scores[:n], kind="stable")[: self.cfg.max_detections]
        raws: list[Raw] = []
        for j in order:
            ymin, xmin, ymax, xmax = (float(v) for v in boxes[j])
            label = self._label(out, int(j))
            if self.dictionary.label_to_concept(label) is None:
                self.unmapped[label] = self.unmapped.get(label, 0) + 1
            box = (max(0.0, xmin * w), max(0.0, ymin * h), min(float(w), xmax * w), min(float(h), ymax * h))
            raws.append((label, None, float(scores[j]), box))
        return raws

    def detect(self, images, env):
        df, bad = super().detect(images, env)
        if self.unmapped:
            top = sorted(self.unmapped.items(), key=lambda kv: -kv[1])[:5]
            log.info("tf_oid: %d detection(s) with labels outside the %s dictionary (dropped), e.g. %s",
                     sum(self.unmapped.values()), self.dictionary.name, top)
        return df, bad

    def predict(self, arrays, sizes):
        results: list[list[Raw] | None] = [None] * len(arrays)
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, a in enumerate(arrays):
            groups.setdefault(a.shape if self.batched else (i,), []).append(i)
        for idx in groups.values():
            try:
                outs = self._call([arrays[i] for i in idx])
            except UnbatchedOutputs:  # a free batch dimension on the input, but one image's outputs
                log.info("tf_oid: the model returns one image's detections per call; running images one by one")
                self.batched = False
                outs = [self._call([arrays[i]])[0] for i in idx]
            for i, out in zip(idx, outs, strict=True):
                results[i] = self._raws(out, *sizes[i])
        return [r or [] for r in results]


def build(options, dictionary, device) -> Detector:
    return TFOIDDetector(parse_options(TFOIDConfig, options, "detect_concepts.options (backend tf_oid)"),
                         dictionary, device)
