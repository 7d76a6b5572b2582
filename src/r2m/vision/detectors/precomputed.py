"""Backend ``precomputed``: imports detections from ``options.path`` (default
``<prepared>/detections.jsonl``): JSONL ``{"image_id", "label", "score", "box": [x1, y1, x2, y2]}``,
a JSON list of such objects, or Parquet/CSV/TSV with ``image_id``, ``label``, ``score`` and
``x1 y1 x2 y2`` (or ``box``) columns. Errors name the file and line (row)."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from r2m.text.dictionary import Dictionary
from r2m.vision.detectors.base import DEFAULT_FLOOR, Detector, Env, frame, log


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
    if not math.isfinite(score):
        raise ValueError(f"{where}: score must be a finite number (got {rec['score']!r})")
    if isinstance(rec["score"], bool) or not 0.0 <= score <= 1.0:  # percentages or logits would all pass 0.3
        raise ValueError(f"{where}: score must be a probability in [0, 1] (got {rec['score']!r}; "
                         "percentages? divide by 100)")
    if len(box_t) != 4 or not all(math.isfinite(v) for v in box_t):
        raise ValueError(f"{where}: box needs 4 finite numbers [x1, y1, x2, y2] (got {box!r})")
    if box_t[2] < box_t[0] or box_t[3] < box_t[1]:
        raise ValueError(f"{where}: box {box!r} has x2 < x1 or y2 < y1 (expected the corners [x1, y1, x2, y2])")
    if not isinstance(rec["label"], str):
        raise ValueError(f"{where}: label must be a string, got {rec['label']!r}")
    label = rec["label"].strip()
    if not label:
        raise ValueError(f"{where}: empty label")
    image_id = rec["image_id"]
    if isinstance(image_id, bool) or not isinstance(image_id, (str, int, float)):
        raise ValueError(f"{where}: image_id must be a string or an integer, got {image_id!r}")
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
        records = read_precomputed(path)
        if records and not known & {r[0] for r in records}:
            raise ValueError(f"{path}: none of its {len(records)} detection(s) matches an image of images.parquet "
                             f"(e.g. image_id {records[0][0]!r}; images are e.g. {sorted(known)[:3]}); "
                             "check that the ids are the dataset's image ids")
        for image_id, label, score, box in records:
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


def build(options, dictionary, device) -> Detector:
    return Precomputed(dictionary, options.get("path"), float(options.get("floor", DEFAULT_FLOOR)))
