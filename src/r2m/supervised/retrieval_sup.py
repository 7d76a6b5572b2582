"""Stage ``retrieval_sup``: image↔sentence retrieval of one supervised model on ``retrieval.split``, scored
by ``log P(sentence | image)`` (:mod:`r2m.supervised.retrieval`: the metrics, the prior over sampled images)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from r2m.stage.context import StageContext
from r2m.supervised.retrieval import retrieval_scores, sampled_prior, split_pairs, summary, sup_logp
from r2m.utils.io import write_json


def run(ctx: StageContext) -> None:
    """DAG stage ``retrieval_sup``: one supervised model on ``retrieval.split``."""
    from r2m.supervised.skip import skip_reason

    out = Path(ctx.outs["retrieval"])
    reason = skip_reason(ctx.deps["sup_vocab"])
    if reason:
        write_json(out, {"skipped": reason})
        ctx.log.info("retrieval_sup: %s", reason)
        return
    from r2m.decoding.captioner import load_checkpoint_model
    from r2m.supervised.data import model_features, teacher_forcing

    rp = ctx.params.retrieval
    device = ctx.runtime.torch_device()
    model, _, _ = load_checkpoint_model(ctx.deps["model"], device)
    feats = model_features(ctx.deps["model"], ctx.deps["features"], model.feature_kinds)
    images, t = split_pairs(Path(ctx.deps["sup_vocab"]), rp.split, feats.row_of)
    if not images:
        raise ValueError(f"{ctx.deps['sup_vocab']}: no {rp.split} image-sentence pairs with features")
    index = {i: k for k, i in enumerate(images)}
    sentence_image = np.array([index[str(i)] for i in t["image_id"].to_pylist()], dtype=np.int64)
    max_len = ctx.params.train_sup.for_model(ctx.model).max_len
    inputs, targets, lengths = teacher_forcing(t["ids"].combine_chunks(), max_len)
    rows = np.array([feats.row_of[i] for i in images], dtype=np.int64)
    logp = sup_logp(model, feats, rows, inputs, targets, lengths, rp.image_block, device)
    prior, prior_ids = None, None
    if rp.prior_images:
        prior_ids, prior = sampled_prior(model, feats, _split_images(ctx, "train"), rp.prior_images, rp.seed,
                                         inputs, targets, lengths, rp.image_block, device)
        if not prior_ids:
            raise ValueError(f"{ctx.deps['prepared']}: no train images with features to sample "
                             "retrieval.prior_images from (set retrieval.prior_images: 0 for the split's own images)")
    feats.close()
    res = retrieval_scores(logp, sentence_image, prior)
    res.update(model=ctx.model, dataset=ctx.dataset, split=rp.split,
               prior=(f"{len(prior_ids)} training images sampled with seed {rp.seed}" if prior_ids
                      else f"the {len(images)} {rp.split} images"),
               prior_image_ids=prior_ids,
               scoring="log P(sentence | image); sentence retrieval normalised by P(sentence)")
    write_json(out, res)
    ctx.save_params(out.parent, "retrieval.params.yaml")
    ctx.log.info("retrieval_sup: %s", summary(res))


def _split_images(ctx: StageContext, split: str) -> list[str]:
    import pyarrow.parquet as pq

    images = pq.read_table(Path(ctx.deps["prepared"]) / "images.parquet", columns=["image_id", "split"]).to_pandas()
    return [str(i) for i in images.loc[images["split"] == split, "image_id"]]
