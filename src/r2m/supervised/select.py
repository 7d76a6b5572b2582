"""Checkpoint selection for the supervised baselines by a validation caption metric.

Show, Attend and Tell selects (early-stops) on validation BLEU; ``train_sup.select_by`` picks the
metric for every model: ``last`` (keep the final weights), ``cider`` (CIDEr-D) or ``bleu4``. The
``val`` images with references are captioned with the ``selection`` params' beam search and scored
exactly as ``r2m evaluate`` scores (:class:`r2m.evaluation.val_score.ValScorer`: PTB tokenisation,
the evaluation's CIDEr-D / BLEU-4), at every ``eval_every`` step; the best weights are kept. Without val references the last checkpoint is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from r2m.evaluation.val_score import METRICS, ValScorer, val_references
from r2m.stage.context import StageContext


def val_selector(ctx: StageContext, feats, itos: list[str], metric: str, device) -> Callable | None:
    """``select(model, step) -> score`` (higher is better), or None when there is nothing to select by."""
    if metric not in METRICS:
        raise ValueError(f"train_sup.select_by {metric!r}: choose last or one of {tuple(METRICS)}")
    from r2m.captioning.captioner import caption_features, words_of

    refs = {iid: caps for iid, caps in val_references(Path(ctx.deps["prepared"]), Path(ctx.deps["references"])).items() if iid in feats.row_of}
    ids = sorted(refs)
    if not ids:
        ctx.log.info("%s: no val images with references: keeping the last checkpoint", ctx.stage.name)
        return None
    cp = ctx.params.selection
    scorer = ValScorer(refs, log=ctx.log)
    ctx.log.info("%s: selecting the checkpoint by %s on %d val images", ctx.stage.name, metric, len(ids))

    def select(model, step: int) -> float:
        was = model.training
        model.eval()
        try:
            toks = caption_features(model, feats, ids, cp.beam, cp.max_len, cp.batch_size, device)
        finally:
            model.train(was)
        return scorer.score({i: words_of(ts, itos) for i, ts in zip(ids, toks, strict=True)}, metric)

    return select
