"""What captioning a new image with a checkpoint needs besides the weights: the vocabulary, the
concept/detector/feature settings the checkpoint was trained with, and the test-time decoding settings.

Every training stage writes ``inference.json`` beside ``model.pt`` (:func:`record`) with what the model *is*: its
vocabulary and, for the image stages (those that read detections and features), the concept settings and the
detector and feature backends its training inputs were made with (from those folders' own ``params.yaml`` and
``meta.json``). Test-time settings — the ``caption`` section (beam, length, images without concepts) and the
``fidelity`` decoding items — are captioning's, not training's: a training stage never reads them (a beam sweep
retrains nothing). :func:`load` fills every section the file lacks from the workspace's ``params.yaml`` for the
checkpoint's dataset and that dataset's files (``data/<dataset>/concepts/params.yaml``, ``features/meta.json``),
else from the defaults; a file of format 1 (older checkpoints, with every section) is read as it is.

A model folder may come from anyone, so its ``inference.json`` is data checked against a closed
schema (:func:`vet`): the keys :func:`build` writes and no other, each section's keys and values those
of its params section; it only *selects* among what this project ships: detector and feature backends
by their registered names, each part of a combined backend too, and plain option values. A backend
whose options make it download (``faster_rcnn`` without a checkpoint: torchvision's COCO weights;
:func:`r2m.vision.downloads.download_of`) is refused unless what it would fetch is already on this
machine. It names no code and no download: an option value
that is a URL, ``allow_download``, ``cache_dir``, a ``source`` outside the backend's own catalog,
and the options that load a program (:data:`CODE_OPTIONS`: ``tf_oid``'s SavedModel, the TorchScript
file of ``inception_v3_fid``, ``owl``'s model) are refused in one line naming the file and the key.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from r2m.stage.context import StageContext
from r2m.utils.io import read_json, write_json
from r2m.vision.downloads import download_of, local_copy

FILE = "inference.json"
FORMAT = 2  # 2: what the model is (vocabulary, its training inputs' settings); 1: every section
SECTIONS = ("concepts", "detect_concepts", "extract_features", "caption", "fidelity")
# options that make a backend load a program (a TF SavedModel, TorchScript, a transformers folder)
CODE_OPTIONS = {"tf_oid": ("model",), "inception_v3_fid": ("weights",), "owl": ("model", "revision")}
CATALOG_SOURCES = {"tf_oid": ("zoo", "hub")}  # the pinned releases a backend may fetch (downloads.TF_OID_SOURCES)
TOP_KEYS = ("format", "dataset", "variant", "stage", "itos", *SECTIONS)  # what build() writes, nothing else
# each section's keys and values: those of the params section of that name (r2m.params)
SECTION_MODELS = {"concepts": "ConceptsParams", "detect_concepts": "DetectParams", "extract_features": "R2MFeatureParams",
                  "caption": "CaptionParams", "fidelity": "FidelityParams"}
NEVER = ("allow_download", "cache_dir")  # a download switch; where downloads land
URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _section_from(folder: Path | None, name: str) -> dict[str, Any] | None:
    """A params section as recorded by the stage that made ``folder`` (its params.yaml)."""
    if folder is None or not (Path(folder) / "params.yaml").exists():
        return None
    doc = yaml.safe_load((Path(folder) / "params.yaml").read_text(encoding="utf-8")) or {}
    return doc.get(name)


def _features_from(folder: Path | None) -> dict[str, Any] | None:
    if folder is None or not (Path(folder) / "meta.json").exists():
        return None
    meta = json.loads((Path(folder) / "meta.json").read_text(encoding="utf-8"))
    return {"backend": meta["backend"], "options": meta.get("options", {})}


def build(params: Any, itos: list[str], dataset: str | None, variant: str | None, stage: str | None,
          concepts_dir: Path | None = None, features_dir: Path | None = None) -> dict[str, Any]:
    """Every section, from ``params`` (the workspace's view of a dataset) and the dataset's concepts and features
    folders: what :func:`load` falls back on."""
    out: dict[str, Any] = {"format": 1, "dataset": dataset, "variant": variant, "stage": stage}
    for name in SECTIONS:
        if name in type(params).model_fields:
            out[name] = getattr(params, name).model_dump(mode="json")
    det = _section_from(concepts_dir, "detect_concepts")  # what the detections were really made with
    if det is not None:
        out["detect_concepts"] = det
    feats = _features_from(features_dir)
    if feats is not None:
        out["extract_features"] = {**out["extract_features"], **feats}
    out["itos"] = list(itos)
    return out


def trained(ctx: StageContext, itos: list[str]) -> dict[str, Any]:
    """What a training stage records of its model: the vocabulary and, for an image stage, the concept settings
    it trained with and the detector and feature settings its inputs were made with (read from the input
    folders, so no params key of a stage it does not run is read)."""
    out: dict[str, Any] = {"format": FORMAT, "dataset": ctx.dataset, "variant": ctx.variant, "stage": ctx.stage.name}
    deps = ctx.deps
    if "concepts" in deps:
        out["concepts"] = ctx.params.concepts.model_dump(mode="json")  # an image stage builds its concepts so
        det = _section_from(Path(deps["concepts"]), "detect_concepts")
        if det is not None:
            out["detect_concepts"] = det
    feats = _features_from(Path(deps["features"])) if "features" in deps else None
    if feats is not None:
        out["extract_features"] = feats
    out["itos"] = list(itos)
    return out


def record(ctx: StageContext, out_dir: Path, itos: list[str]) -> Path:
    """Write ``inference.json`` into a training stage's output folder (:func:`trained`)."""
    return write_json(Path(out_dir) / FILE, trained(ctx, itos), indent=None)


def _checked(data: Any, path: Path) -> dict[str, Any]:
    """A recorded ``inference.json`` with the keys captioning reads; ValueError (one line) otherwise."""
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not an inference settings file (a JSON object expected); retrain the model")
    need = ("itos", "concepts", "detect_concepts", "caption") if data.get("format", 1) == 1 else ("itos",)
    missing = [k for k in need if not isinstance(data.get(k), list if k == "itos" else dict)]
    if missing:
        raise ValueError(f"{path}: missing or malformed {', '.join(missing)}; retrain the model")
    return data


def _vet_options(kind: str, backend: str, options: Any, where: str) -> None:
    """Refuse a recorded backend's options that name code or a download (one line, ``where``: the key)."""
    from r2m.catalogs import DETECTORS, FEATURE_BACKENDS

    names = (DETECTORS if kind == "detector" else FEATURE_BACKENDS).names()
    if not isinstance(backend, str) or backend not in names:
        raise ValueError(f"{where}.backend: {backend!r} is not a {kind} backend of this project "
                         f"({', '.join(names)}); a model folder may only select one of them")
    if not isinstance(options, dict):
        raise ValueError(f"{where}.options: expected a mapping, got {type(options).__name__}")
    parts = [p for p in options.get("parts") or [] if isinstance(p, str)] if backend == "offline" else []
    nested = {*parts, *(("kinds_from",) if kind == "features" else ())}  # vetted as backends of their own below
    for key, value in options.items():
        at = f"{where}.options.{key}"
        if value in (None, False, "", [], {}) or key in nested:  # unset (the backend's default); a part
            continue
        if key in NEVER or key in CODE_OPTIONS.get(backend, ()):
            why = "it is about downloads" if key in NEVER else "it names a program to load"
            raise ValueError(f"{at}: a model folder may not set this ({why}); set it in your own params.yaml "
                             "and caption with the pipeline instead")
        if key == "source" and value not in CATALOG_SOURCES.get(backend, ()):
            raise ValueError(f"{at}: {value!r} is not one of the project's own sources "
                             f"({', '.join(CATALOG_SOURCES.get(backend, ())) or 'none'})")
        for text in _strings(value):
            if URL.match(text.strip()):
                raise ValueError(f"{at}: {text!r} is a download address; a model folder may not name one")
    fetch = download_of(kind, backend, options, cached=True, parts=False)
    if fetch:  # e.g. faster_rcnn without a checkpoint: torchvision's COCO weights, unless in torch's hub cache
        local = local_copy(kind, backend, options)
        raise ValueError(f"{where}.backend: {backend!r} with these options downloads {fetch}"
                         f"{f' (not in {local})' if local is not None else ''}; a model folder may name only "
                         "backends that need nothing from the network (their weights on this machine)")
    for part in options.get("parts") or [] if backend == "offline" else ():  # other detectors, options under their names
        _vet_options(kind, part, options.get(part, {}), f"{where}.options.{part}")
    for n, spec in (options.get("kinds_from") or {}).items() if kind == "features" else ():
        if not isinstance(spec, dict):
            raise ValueError(f"{where}.options.kinds_from.{n}: expected a mapping")
        _vet_options(kind, spec.get("backend"), spec.get("options") or {}, f"{where}.options.kinds_from.{n}")


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def beam_problem(beam: Any, where: str) -> None:
    """ValueError (one line, ``where``) unless ``beam`` is an integer from 1 to :data:`r2m.params.MAX_BEAM`."""
    from r2m.params import MAX_BEAM

    if beam is None:
        return
    if isinstance(beam, bool) or not isinstance(beam, int) or not 1 <= beam <= MAX_BEAM:
        raise ValueError(f"{where}: {beam!r} is not a beam width from 1 to {MAX_BEAM} (each step scores batch x "
                         "beam x vocabulary candidates)")


def _closed(data: dict[str, Any]) -> None:
    """The file's keys are those :func:`build` writes, each section's keys and values those of its params
    section (:data:`SECTION_MODELS`); else a one-line ValueError naming the first bad key."""
    from pydantic import ValidationError

    from r2m import params as P

    unknown = [k for k in data if k not in TOP_KEYS]
    if unknown:
        raise ValueError(f"{unknown[0]}: not a key of a model folder's settings (known: {', '.join(TOP_KEYS)})")
    if data.get("format", 1) not in (1, FORMAT) or isinstance(data.get("format", 1), bool):
        raise ValueError(f"format: {data.get('format')!r} is not a settings format this version reads (1, {FORMAT})")
    if not all(isinstance(w, str) for w in data["itos"]):
        raise ValueError("itos: expected a list of words (strings)")
    for name, model in SECTION_MODELS.items():
        if name not in data:
            continue
        try:
            getattr(P, model).model_validate(data[name])
        except ValidationError as err:
            e = err.errors()[0]
            key = ".".join(str(p) for p in (name, *e["loc"]))
            got = e.get("input")
            shown = f" (got {got!r})" if isinstance(got, (str, int, float)) and len(repr(got)) <= 80 else ""
            raise ValueError(f"{key}: {e['msg'].removeprefix('Value error, ')}{shown}") from None


def vet(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """``data`` when its backends are this project's and none of their options names code or a
    download; else a one-line ValueError naming ``path`` and the key."""
    try:
        beam_problem((data.get("caption") or {}).get("beam"), "caption.beam")
        _closed(data)
        det = data.get("detect_concepts")
        if det is not None:
            _vet_options("detector", det.get("backend"), det.get("options") or {}, "detect_concepts")
        feats = data.get("extract_features")
        if feats is not None:
            if not isinstance(feats, dict):
                raise ValueError("extract_features: expected a mapping")
            _vet_options("features", feats.get("backend"), feats.get("options") or {}, "extract_features")
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    return data


def _defaults(root: Path, dataset: Any) -> tuple[Any, Path | None]:
    """The params a checkpoint of ``dataset`` is captioned with where its folder does not say: the workspace's
    view of that dataset (and its data folder) when the workspace's ``params.yaml`` declares it, else the defaults
    of the ``paper`` profile."""
    from r2m import params as P

    path = Path(root) / "params.yaml"
    if isinstance(dataset, str) and path.exists():
        try:
            params = P.load(path)
            if dataset in params.catalog:
                return P.for_dataset(params, dataset), Path(root) / "data" / dataset
        except P.ParamsError:
            pass  # another project's params: the defaults serve
    raw = {"catalog": {"demo": {"kind": "demo"}}, "baselines": {"datasets": ["demo"]}}  # every section's defaults
    return P.Params.model_validate(P.resolve_fidelity(P.Params.model_validate(raw).model_dump(mode="json"), "paper")), None


def load(model_dir: Path, ckpt: dict[str, Any], root: Path = Path(".")) -> dict[str, Any]:
    """The settings of a checkpoint: its folder's ``inference.json``, every section it lacks (test-time decoding;
    a text stage's detector and features) from :func:`_defaults`. Without the file (a checkpoint older than it),
    all of them, with the vocabulary of the checkpoint's dataset in the workspace."""
    f = Path(model_dir) / FILE
    dataset = ckpt.get("dataset")
    if f.exists():
        data = vet(_checked(read_json(f), f), f)
        if all(name in data for name in SECTIONS):
            return data
        params, data_dir = _defaults(root, data.get("dataset") or dataset)
        base = build(params, data["itos"], data.get("dataset"), data.get("variant"), data.get("stage"),
                     data_dir / "concepts" if data_dir else None, data_dir / "features" if data_dir else None)
        merged = {**base, **data, "format": data.get("format", 1)}
        for name in SECTIONS:  # a section the file gives in part: the rest from the defaults
            if isinstance(base.get(name), dict) and isinstance(data.get(name), dict):
                merged[name] = {**base[name], **data[name]}
        return vet(merged, f)
    from r2m.text.vocab import load_itos

    data_dir = root / "data" / str(dataset)
    if not dataset or not (data_dir / "vocab" / "vocab.json").exists():
        raise FileNotFoundError(f"{model_dir}: no {FILE} and no vocabulary of its dataset {dataset!r} "
                                f"({data_dir / 'vocab' / 'vocab.json'}); retrain or pass a checkpoint folder "
                                "made by this version")
    params, _ = _defaults(root, dataset)
    return build(params, load_itos(data_dir / "vocab"), dataset, ckpt.get("variant"), ckpt.get("stage"),
                 data_dir / "concepts", data_dir / "features")
