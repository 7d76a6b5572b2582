"""Checkpoint selection by validation CIDEr (the paper selects its checkpoints this way).

``cider_selector(ctx, model_device)`` returns a :data:`r2m.training.loop.Selector` that captions
the dataset's ``val`` images (beam search with the ``selection`` params, concepts as at test time)
and scores them exactly as ``r2m evaluate`` does (:class:`r2m.evaluation.val_score.ValScorer`:
coco-caption's PTB tokenisation of captions and references, the evaluation's CIDEr-D), so the
selected score is the CIDEr the evaluation would report for those captions; references are
tokenised once and each caption string at most once, so it is cheap enough to call at every
``eval_every`` step. Concepts and decoding are the
captioning library's (:mod:`r2m.captioning.captioner`), as in the ``caption`` stage. When the dataset has no ``val``
images with references (e.g. ``demo``), there is nothing to select by and the last checkpoint is
kept.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from r2m.captioning.captioner import caption_ids, concept_inputs, order_at_test, words_of
from r2m.evaluation.val_score import ValScorer, val_references
from r2m.stage.context import StageContext


def validation_set(prepared: Path, references: Path, detections: Path, stoi: dict[str, int], threshold: float,
                   max_per_image: int, order: str = "by_score", dictionary: str = "openimages",
                   scorer: ValScorer | None = None, per_class: bool = False,
                   ) -> tuple[list[str], list[list[int]], dict[str, list[str]]]:
    """Ids, concept ids and PTB-tokenised references (``scorer.references``) of the ``val`` images
    that have references."""
    scorer = scorer or ValScorer(val_references(prepared, references))
    ids = scorer.ids
    words, _ = concept_inputs(ids, pq.read_table(detections / "detections.parquet"), threshold, max_per_image,
                              stoi, "empty", order, dictionary, per_class)
    return ids, [[stoi[w] for w in ws] for ws in words], scorer.references


def cider_selector(ctx: StageContext, device, itos: list[str]):
    stoi = {w: i for i, w in enumerate(itos)}
    conc, cp, fid = ctx.params.concepts, ctx.params.selection, ctx.params.fidelity
    prepared, references = Path(ctx.deps["prepared"]), Path(ctx.deps["references"])
    # select_on_test: the released code's eval_obj2sen.py scores every checkpoint on the test images (leakage)
    split = "test" if fid.select_on_test else "val"
    scorer = ValScorer(val_references(prepared, references, split), log=ctx.log)
    ids, concepts, _ = validation_set(prepared, references, Path(ctx.deps["concepts"]), stoi,
                                      conc.score_threshold, conc.max_per_image,
                                      order_at_test(fid.image_concepts), conc.dictionary, scorer,
                                      bool(fid.concept_per_class))
    if not ids:
        ctx.log.info("%s: no %s images with references: keeping the last checkpoint", ctx.stage.name, split)
        return None
    ctx.log.info("%s: selecting the checkpoint by CIDEr on %d %s images%s", ctx.stage.name, len(ids), split,
                 " (fidelity.select_on_test: the test images, leakage)" if fid.select_on_test else "")

    def select(model, step: int) -> float:
        was_training = model.training
        model.eval()
        try:
            toks = caption_ids(model, concepts, cp.beam, cp.max_len, cp.batch_size, device, decoding=fid.decoding,
                               ban_unk=fid.ban_unk, ban_specials=fid.ban_specials)
        finally:
            model.train(was_training)
        # the caption stage's text of each caption (captions.json), scored as `r2m evaluate` scores it
        return scorer.score({i: words_of(ts, itos) for i, ts in zip(ids, toks, strict=True)}, "cider")

    return select
