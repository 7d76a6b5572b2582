"""Checkpoint selection by validation CIDEr (the paper selects its checkpoints this way).

``cider_selector(ctx, model_device)`` returns a :data:`r2m.training.loop.Selector` that captions
the dataset's ``val`` images (beam search with the ``caption`` params, concepts as at test time)
and scores them with CIDEr-D against their references. CIDEr runs on coco-caption's scorer with the
project tokeniser (no Java), so it is cheap enough to call at every ``eval_every`` step; the
reported test metrics still come from the ``evaluate`` stage. Concepts and decoding are the
captioning library's (:mod:`r2m.decoding.captioner`), as in the ``caption`` stage. When the dataset has no ``val``
images with references (e.g. ``demo``), there is nothing to select by and the last checkpoint is
kept.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from r2m.decoding.captioner import caption_ids, concept_inputs, order_at_test, words_of
from r2m.evaluation.inputs import load_references
from r2m.text.tokenize import tokenize


def validation_set(prepared: Path, detections: Path, stoi: dict[str, int], threshold: float,
                   max_per_image: int, order: str = "by_score",
                   dictionary: str = "openimages") -> tuple[list[str], list[list[int]], dict[str, list[str]]]:
    """Ids, concept ids and tokenised references of the ``val`` images that have references."""
    images = pq.read_table(prepared / "images.parquet", columns=["image_id", "split"]).to_pandas()
    val_ids = {str(i) for i in images.loc[images["split"] == "val", "image_id"]}
    refs = {iid: [" ".join(tokenize(c)) for c in caps]
            for iid, caps in load_references(prepared / "references.json").items() if iid in val_ids}
    ids = sorted(refs)
    words, _ = concept_inputs(ids, pq.read_table(detections / "detections.parquet"), threshold, max_per_image,
                              stoi, "empty", order, dictionary)
    return ids, [[stoi[w] for w in ws] for ws in words], refs


def cider_selector(ctx, device, itos: list[str]):
    from pycocoevalcap.cider.cider import Cider

    stoi = {w: i for i, w in enumerate(itos)}
    conc, cp, fid = ctx.params.concepts, ctx.params.caption, ctx.params.fidelity
    ids, concepts, refs = validation_set(Path(ctx.deps["prepared"]), Path(ctx.deps["concepts"]), stoi,
                                         conc.score_threshold, conc.max_per_image,
                                         order_at_test(fid.image_concepts), conc.dictionary)
    if not ids:
        ctx.log.info("%s: no val images with references: keeping the last checkpoint", ctx.stage.name)
        return None
    ctx.log.info("%s: selecting the checkpoint by CIDEr on %d val images", ctx.stage.name, len(ids))

    def select(model, step: int) -> float:
        was_training = model.training
        model.eval()
        try:
            toks = caption_ids(model, concepts, cp.beam, cp.max_len, cp.batch_size, device, decoding=fid.decoding,
                               ban_unk=fid.ban_unk)
        finally:
            model.train(was_training)
        res = {i: [words_of(ts, itos) or "<empty>"] for i, ts in zip(ids, toks, strict=True)}
        score, _ = Cider().compute_score({i: refs[i] for i in ids}, res)
        return float(score)

    return select
