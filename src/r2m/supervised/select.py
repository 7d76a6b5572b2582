"""Checkpoint selection for the supervised baselines by a validation caption metric.

Show, Attend and Tell selects (early-stops) on validation BLEU; ``train_sup.select_by`` picks the
metric for every model: ``last`` (keep the final weights), ``cider`` (CIDEr-D) or ``bleu4``. The
``val`` images with references are captioned with the ``caption`` params' beam search and scored
with coco-caption's scorer on the project tokeniser (no Java), at every ``eval_every`` step; the
best weights are kept. Without val references the last checkpoint is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq

from r2m.evaluation.inputs import load_references
from r2m.text.tokenize import tokenize

METRICS = ("cider", "bleu4")


def _score(metric: str, refs: dict[str, list[str]], res: dict[str, list[str]]) -> float:
    if metric == "cider":
        from pycocoevalcap.cider.cider import Cider

        return float(Cider().compute_score(refs, res)[0])
    from pycocoevalcap.bleu.bleu import Bleu

    return float(Bleu(4).compute_score(refs, res, verbose=0)[0][3])


def val_selector(ctx, feats, itos: list[str], metric: str, device) -> Callable | None:
    """``select(model, step) -> score`` (higher is better), or None when there is nothing to select by."""
    if metric not in METRICS:
        raise ValueError(f"train_sup.select_by {metric!r}: choose last or one of {METRICS}")
    from r2m.decoding.captioner import caption_features

    prepared = Path(ctx.deps["prepared"])
    images = pq.read_table(prepared / "images.parquet", columns=["image_id", "split"]).to_pandas()
    val_ids = {str(i) for i in images.loc[images["split"] == "val", "image_id"]}
    refs = {iid: [" ".join(tokenize(c)) for c in caps]
            for iid, caps in load_references(prepared / "references.json").items()
            if iid in val_ids and iid in feats.row_of}
    ids = sorted(refs)
    if not ids:
        ctx.log.info("%s: no val images with references: keeping the last checkpoint", ctx.stage.name)
        return None
    cp = ctx.params.caption
    ctx.log.info("%s: selecting the checkpoint by %s on %d val images", ctx.stage.name, metric, len(ids))

    def select(model, step: int) -> float:
        was = model.training
        model.eval()
        try:
            toks = caption_features(model, feats, ids, cp.beam, cp.max_len, cp.batch_size, device)
        finally:
            model.train(was)
        res = {i: [" ".join(itos[t] for t in ts) or "<empty>"] for i, ts in zip(ids, toks, strict=True)}
        return _score(metric, {i: refs[i] for i in ids}, res)

    return select
