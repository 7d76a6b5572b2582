"""What captioning a new image with a checkpoint needs besides the weights: the vocabulary and the
concept/detector/feature/caption settings the checkpoint was trained with.

Every training stage writes ``inference.json`` beside ``model.pt`` (:func:`record`). For older
checkpoints without it, :func:`load` rebuilds the same from the dataset's files
(``data/<dataset>/vocab/vocab.json``, ``concepts/params.yaml``, ``features/meta.json``) and
``params.yaml``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from r2m.utils.io import read_json, write_json

FILE = "inference.json"
SECTIONS = ("concepts", "detect_concepts", "extract_features", "caption", "fidelity")


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
    dumped = params.model_dump(mode="json")
    out: dict[str, Any] = {"format": 1, "dataset": dataset, "variant": variant, "stage": stage}
    for name in SECTIONS:
        if name in dumped:
            out[name] = dumped[name]
    det = _section_from(concepts_dir, "detect_concepts")  # what the detections were really made with
    if det is not None:
        out["detect_concepts"] = det
    feats = _features_from(features_dir)
    if feats is not None:
        out["extract_features"] = {**out["extract_features"], **feats}
    out["itos"] = list(itos)
    return out


def record(ctx, out_dir: Path, itos: list[str]) -> Path:
    """Write ``inference.json`` into a training stage's output folder."""
    deps = ctx.deps
    data = build(ctx.params, itos, ctx.dataset, ctx.variant, ctx.stage.name,
                 Path(deps["concepts"]) if "concepts" in deps else None,
                 Path(deps["features"]) if "features" in deps else None)
    return write_json(Path(out_dir) / FILE, data, indent=None)


def _checked(data: Any, path: Path) -> dict[str, Any]:
    """A recorded ``inference.json`` with the keys captioning reads; ValueError (one line) otherwise."""
    need = ("itos", "concepts", "detect_concepts", "caption")
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not an inference settings file (a JSON object expected); retrain the model")
    missing = [k for k in need if not isinstance(data.get(k), list if k == "itos" else dict)]
    if missing:
        raise ValueError(f"{path}: missing or malformed {', '.join(missing)}; retrain the model")
    return data


def load(model_dir: Path, ckpt: dict[str, Any], root: Path = Path(".")) -> dict[str, Any]:
    """The settings beside a checkpoint, or rebuilt from its dataset's files (older checkpoints)."""
    f = Path(model_dir) / FILE
    if f.exists():
        return _checked(read_json(f), f)
    from r2m import params as P
    from r2m.text.vocab import load_itos

    dataset = ckpt.get("dataset")
    data_dir = root / "data" / str(dataset)
    if not dataset or not (data_dir / "vocab" / "vocab.json").exists():
        raise FileNotFoundError(f"{model_dir}: no {FILE} and no vocabulary of its dataset {dataset!r} "
                                f"({data_dir / 'vocab' / 'vocab.json'}); retrain or pass a checkpoint folder "
                                "made by this version")
    params = P.for_dataset(P.load(root / "params.yaml"), dataset)
    return build(params, load_itos(data_dir / "vocab"), dataset, ckpt.get("variant"), ckpt.get("stage"),
                 data_dir / "concepts", data_dir / "features")
