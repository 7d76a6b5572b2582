"""``evaluate_sup`` and ``mostfreq``: the supervised baselines' captions scored like R²M's by the
coco-caption scorers, and the "most frequent training caption" reference point. A skipped dataset
gets ``eval.json`` = ``{"skipped": reason}``. Kept apart from :mod:`r2m.supervised.caption` so that
these light stages start without importing torch.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from r2m.stage.context import StageContext
from r2m.supervised.skip import skip_reason
from r2m.utils.io import write_json


def evaluate(ctx: StageContext) -> None:
    reason = skip_reason(ctx.deps["sup_vocab"])
    if reason:
        write_json(ctx.outs["metrics"], {"skipped": reason})
        write_json(ctx.outs["per_image"], {"skipped": reason})
        if "stats" in ctx.outs:  # no rows: nothing was scored
            _empty_stats(ctx.outs["stats"], reason)
        ctx.log.info("evaluate_sup: %s", reason)
        return
    from r2m.evaluation.stage import run as evaluate_stage

    evaluate_stage(ctx)


def _empty_stats(path, reason: str) -> None:
    """A skipped evaluation's ``per_image.parquet``: no rows, the reason in its metadata."""
    from r2m.evaluation import per_image
    from r2m.evaluation.bootstrap import PerImage

    per_image.write(path, PerImage((), {}), {"skipped": reason})


def most_frequent_caption(sup_vocab: str | Path) -> tuple[str, int]:
    """The most frequent training caption (tokenised, lower-case; ties: alphabetical) and its count."""
    from collections import Counter

    import pyarrow.compute as pc

    from r2m.text.tokenize import tokenize

    t = pq.read_table(Path(sup_vocab) / "captions.parquet", columns=["split", "caption"])
    caps = t.filter(pc.equal(t["split"], "train"))["caption"].to_pylist()
    if not caps:
        raise ValueError(f"{sup_vocab}: no training captions")
    counts = Counter(" ".join(tokenize(c)) for c in caps)
    best = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return best


def mostfreq(ctx: StageContext) -> None:
    """DAG stage ``mostfreq``: the "most frequent training caption" reference point — every image of
    ``caption.split`` gets the same sentence — scored like the models (``eval.json``)."""
    reason = skip_reason(ctx.deps["sup_vocab"])
    if reason:
        write_json(ctx.outs["captions"], [])
        write_json(ctx.outs["metrics"], {"skipped": reason})
        if "stats" in ctx.outs:
            _empty_stats(ctx.outs["stats"], reason)
        ctx.log.info("mostfreq: %s", reason)
        return
    from r2m.evaluation.stage import evaluate_files, write_per_image

    sentence, count = most_frequent_caption(ctx.deps["sup_vocab"])
    images = pq.read_table(Path(ctx.deps["prepared"]) / "images.parquet", columns=["image_id", "split"]).to_pandas()
    ids = [str(i) for i in images.loc[images["split"] == ctx.params.caption.split, "image_id"]]
    write_json(ctx.outs["captions"], [{"image_id": i, "caption": sentence} for i in ids])
    ctx.log.info("mostfreq: %r (%d times among the training captions) for %d images", sentence, count, len(ids))
    res = evaluate_files(ctx.outs["captions"], Path(ctx.deps["references"]) / "references.json",
                         list(ctx.params.evaluate.scorers), workers=ctx.runtime.workers or None, logger=ctx.log)
    write_json(ctx.outs["metrics"], {**res["metrics"], "caption": sentence, "count": count, "split": res["split"],
                                     "n_images": len(res["images"]), "missing_images": len(res["missing"])})
    if "stats" in ctx.outs:  # the baselines table compares each model with this reference point, image by image
        write_per_image(ctx.outs["stats"], res, res["stats"], None, res["metrics"], ctx.outs["captions"],
                        Path(ctx.deps["references"]) / "references.json")
    ctx.save_params(Path(ctx.outs["metrics"]).parent, "eval.params.yaml")
