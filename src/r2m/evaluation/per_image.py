"""``per_image.parquet``: the per-image sufficient statistics of one evaluation, beside its ``eval.json``.

One row per scored image, in the order the evaluation scored them:

* ``image_id`` (string);
* ``bleu_testlen``, ``bleu_reflen`` (the closest reference length, coco-caption's rule),
  ``bleu_guess_1..4`` (candidate n-grams), ``bleu_correct_1..4`` (clipped matches);
* ``meteor_00`` … ``meteor_22``: METEOR 1.5's segment statistics as the jar writes them (test and
  reference lengths, function words, 4 modules × test/reference content/function matches, chunks,
  test and reference word matches);
* ``ROUGE_L``, ``CIDEr``, ``SPICE``: per-image scores (CIDEr-D with the document frequencies of the
  whole scored reference set, held fixed under resampling; a metric that did not run is absent);
* ``concept_given``, ``concept_named``: input concepts of the image and how many its caption names
  (0, 0 for an image without concepts or without ``caption_info.json``).

The file's schema metadata ``r2m`` (JSON) holds ``format`` (:data:`FORMAT`), ``metrics`` (the
aggregate values ``eval.json`` reports), ``references_sha256`` and ``captions_sha256`` (the
files scored, so a reader can tell whether the statistics are still those of its inputs) and
``cider_df``. :func:`r2m.evaluation.bootstrap.corpus_metrics` turns rows into corpus metrics.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from r2m.evaluation.bootstrap import MEAN_METRICS, PerImage

FORMAT = "r2m.per_image/1"
CIDER_DF = "document frequencies of the whole scored reference set, held fixed under resampling"


class PerImageError(ValueError):
    """An unreadable or foreign per-image file (the message names it)."""


def from_evaluation(ids: Sequence[str], scores: Mapping[str, Mapping[str, float | None]],
                    stats: Mapping[str, Sequence[float]],
                    concepts: Mapping[str, Mapping[str, Any]] | None = None) -> PerImage:
    """A :class:`PerImage` from :func:`r2m.evaluation.coco.evaluate_stats`' per-image scores and
    statistics (in ``ids`` order) and, optionally, concept recall's ``per_image``
    (``{image_id: {"concepts", "named"}}``)."""
    cols: dict[str, np.ndarray] = {k: np.asarray(v, dtype=np.float64) for k, v in stats.items()}
    for m in MEAN_METRICS:
        vals = [scores[i].get(m, None) for i in ids]
        if ids and any(m in scores[i] for i in ids) and not all(v is None for v in vals):
            cols[m] = np.asarray([np.nan if v is None else v for v in vals], dtype=np.float64)
    if concepts is not None:
        cols["concept_given"] = np.asarray([len(concepts.get(i, {}).get("concepts", [])) for i in ids], dtype=np.float64)
        cols["concept_named"] = np.asarray([len(concepts.get(i, {}).get("named", [])) for i in ids], dtype=np.float64)
    return PerImage(tuple(ids), cols)


def write(path: str | Path, stats: PerImage, meta: Mapping[str, Any]) -> None:
    """Write ``stats`` and ``meta`` (stored as the schema metadata ``r2m``) atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from r2m.utils.io import atomic_path

    arrays = {"image_id": pa.array(list(stats.ids), pa.string())}
    arrays.update({k: pa.array(np.asarray(v, dtype=np.float64)) for k, v in stats.columns.items()})
    table = pa.table(arrays).replace_schema_metadata(
        {"r2m": json.dumps({"format": FORMAT, "cider_df": CIDER_DF, **meta}, sort_keys=True)})
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read(path: str | Path) -> tuple[PerImage, dict[str, Any]]:
    """``(stats, meta)`` of a per-image file; :class:`PerImageError` (one line) when it is not one."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as err:
        raise PerImageError(f"{path}: unreadable per-image file ({' '.join(str(err).split())[:200]})") from None
    raw = (table.schema.metadata or {}).get(b"r2m")
    try:
        meta = json.loads(raw) if raw else {}
    except ValueError:
        meta = {}
    if meta.get("format") != FORMAT or "image_id" not in table.column_names:
        raise PerImageError(f"{path}: not an r2m per-image file (format {meta.get('format')!r}; expected {FORMAT!r})")
    ids = tuple(str(i) for i in table.column("image_id").to_pylist())
    cols = {c: table.column(c).to_numpy(zero_copy_only=False).astype(np.float64)
            for c in table.column_names if c != "image_id"}
    if len(set(ids)) != len(ids):
        raise PerImageError(f"{path}: an image id appears twice")
    return PerImage(ids, cols), meta
