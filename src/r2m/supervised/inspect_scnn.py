"""``inspect_sup`` of S-CNN-RNN (``scnn``; loaded by name by :mod:`r2m.supervised.inspect`): its concept head
as a multi-label classifier of the test images: per-class and per-image precision / recall / F1 of the top-3
concepts (the seed's protocol, :func:`r2m.evaluation.multilabel.topk_multilabel`: averages over all concepts /
all images, 0/0 = 0) against the concepts of each image's reference captions, beside a frequency baseline (the
3 concepts most frequent in the training labels, for every image)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from r2m.stage.context import StageContext
from r2m.supervised.inspection import opened, split_of

ML_PROTOCOL = ("top-3 labels per image; C-P/C-R averaged over all concepts, O-P/O-R over all test images, "
               "F1 = harmonic mean of the averaged P and R; 0/0 = 0 (seed 002, Sec. 4.2)")


def inspect(ctx: StageContext, out_dir: Path) -> dict[str, Any]:
    with opened(ctx) as (model, feats, _, device):
        return _multilabel(ctx, model, feats, device)


def _multilabel(ctx: StageContext, model, feats, device) -> dict[str, Any]:
    import numpy as np
    import pyarrow.parquet as pq
    import torch

    from r2m.datasets.base import REFERENCES
    from r2m.evaluation.inputs import load_references
    from r2m.evaluation.multilabel import topk_multilabel

    prepared = Path(ctx.deps["prepared"])
    split = ctx.params.caption.split
    refs = load_references(Path(ctx.deps["references"]) / REFERENCES)
    ids = [i for i in split_of(prepared, split) if i in feats.row_of and i in refs]
    model.bind_data({"image_id": [i for i in ids for _ in refs[i]], "caption": [c for i in ids for c in refs[i]]})
    truth = model.labels_of(ids)
    scores = []
    with torch.no_grad():
        for s in range(0, len(ids), 256):
            rows = np.array([feats.row_of[i] for i in ids[s: s + 256]], dtype=np.int64)
            scores.append(model.predict_concepts(feats.get(rows)["pooled"].to(device)).float().cpu())
    scores_t = torch.cat(scores) if scores else torch.zeros(0, model.cfg.num_concepts)
    captions = pq.read_table(Path(ctx.deps["sup_vocab"]) / "captions.parquet",
                             columns=["image_id", "split", "caption"]).to_pydict()
    rows = [n for n, sp in enumerate(captions["split"]) if sp == "train"]
    train = [captions["image_id"][n] for n in rows]
    model.bind_data({"image_id": train, "caption": [captions["caption"][n] for n in rows]})
    uniq = sorted(set(map(str, train)))
    freq = model.labels_of(uniq).mean(0) if uniq else torch.zeros(model.cfg.num_concepts)
    k = 3
    out = {"model": "scnn", "label": model.train_info()["label"], "images": len(ids),
           "concepts": model.cfg.num_concepts, "top_k": k, "protocol": ML_PROTOCOL,
           "multilabel": topk_multilabel(scores_t, truth, k),
           "frequency_baseline": topk_multilabel(freq.expand(len(ids), -1), truth, k),
           "labels_per_image": float(truth.sum(1).mean()) if len(ids) else None}
    ctx.log.info("inspect_sup scnn: concept head top-%d %s; frequency baseline %s", k, out["multilabel"],
                 out["frequency_baseline"])
    return out
