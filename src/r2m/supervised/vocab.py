"""``sup_vocab``: the supervised vocabulary and the encoded image–caption pairs of a dataset.

Inputs: ``references/train_references.json`` (paired training captions) and ``references.json``
(val/test), the ``references`` stage's. Outputs in ``data/<D>/sup_vocab/``:

* ``vocab.json``: words of the *training* captions seen ≥ ``sup_vocab.min_count`` times (most
  frequent first) after the specials (``<pad>`` 0, ``<#start>``, ``<#end>``, ``<UNK>``) — separate
  from R²M's corpus vocabulary;
* ``captions.parquet``: ``image_id`` (str), ``split`` (train | val | test), ``ids``
  (list<int32>, no start/end, unknown words → <UNK>), ``caption`` (the raw sentence); training
  captions longer than ``sup_vocab.max_tokens`` tokens are dropped (counted in the stats);
* ``stats.json``: ``paired`` (bool), ``reason`` (why the baselines are skipped, or null), counts.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from r2m.datasets.base import REFERENCES, TRAIN_REFERENCES
from r2m.stage.context import StageContext
from r2m.text.tokenize import tokenize
from r2m.text.vocab import SPECIALS, Vocab, build_vocab
from r2m.utils.coco import read_coco_captions
from r2m.utils.io import atomic_path, write_json

NO_PAIRS = "no paired training captions (references/{file} is absent): supervised baselines skipped"


def _captions(path: Path, splits: set[str]) -> list[tuple[str, str, str]]:
    """``(image_id, split, caption)`` from a COCO caption JSON (an image record without ``split`` is
    ``train``); errors name the file and record."""
    coco = read_coco_captions(path)
    coco.require_listed(str(path))
    split_of = {i: str(s) for i, s in coco.split_of("train").items()}
    return [(i, split_of[i], cap.strip()) for i, cap in coco.annotations if split_of[i] in splits]


def build(references: Path, out: Path, min_count: int, max_tokens: int) -> dict[str, Any]:
    """Write the sup_vocab folder ``out`` (a fresh folder) from the ``references`` folder; returns the stats."""
    out.mkdir(parents=True, exist_ok=True)
    train_path = references / TRAIN_REFERENCES
    if not train_path.exists():
        Vocab(list(SPECIALS)).save(out / "vocab.json")
        empty = pa.table({"image_id": pa.array([], pa.string()), "split": pa.array([], pa.string()),
                          "ids": pa.array([], pa.list_(pa.int32())), "caption": pa.array([], pa.string())})
        pq.write_table(empty, out / "captions.parquet")
        stats = {"paired": False, "reason": NO_PAIRS.format(file=TRAIN_REFERENCES), "vocab_size": len(SPECIALS)}
        write_json(out / "stats.json", stats)
        return stats
    train = _captions(train_path, {"train"})
    held = _captions(references / REFERENCES, {"val", "test"})
    tokens = {id(c): tokenize(c[2]) for c in (*train, *held)}
    kept = [c for c in train if 0 < len(tokens[id(c)]) <= max_tokens]
    counts: Counter[str] = Counter(w for c in kept for w in tokens[id(c)])
    vocab = build_vocab(counts, min_count)
    vocab.save(out / "vocab.json")
    rows = [*kept, *held]
    table = pa.table({
        "image_id": pa.array([c[0] for c in rows], pa.string()),
        "split": pa.array([c[1] for c in rows], pa.string()),
        "ids": pa.array([vocab.encode(tokens[id(c)]) for c in rows], pa.list_(pa.int32())),
        "caption": pa.array([c[2] for c in rows], pa.string()),
    })
    pq.write_table(table, out / "captions.parquet")
    n_tok = sum(len(tokens[id(c)]) for c in kept)
    stats = {
        "paired": bool(kept), "reason": None if kept else f"{train_path}: no usable training caption",
        "vocab_size": len(vocab), "min_count": min_count,
        "captions": {s: sum(1 for c in rows if c[1] == s) for s in ("train", "val", "test")},
        "train_images": len({c[0] for c in kept}),
        "dropped_too_long_or_empty": len(train) - len(kept),
        "train_unk_rate": (sum(1 for c in kept for w in tokens[id(c)] if w not in vocab) / n_tok) if n_tok else 0.0,
    }
    write_json(out / "stats.json", stats)
    return stats


def run(ctx: StageContext) -> None:
    sp = ctx.params.sup_vocab
    out = Path(ctx.outs["sup_vocab"])
    with atomic_path(out) as tmp:
        stats = build(Path(ctx.deps["references"]), tmp, sp.min_count, sp.max_tokens)
        ctx.save_params(tmp)
    if stats["paired"]:
        ctx.log.info("sup_vocab: %d words, captions %s", stats["vocab_size"], stats["captions"])
    else:
        ctx.log.info("sup_vocab: %s", stats["reason"])
