"""``inspect_sup``: what a supervised model can show beyond its captions, per model (a registry).

* ``sat``, ``sat_hard`` (Show, Attend and Tell, soft / hard attention): per-word attention maps of
  a few test images (α upsampled to the image and smoothed, the paper's Figs. 2–3) as PNGs,
  and — when the prepared dataset knows its objects' boxes (``prepared/detections.jsonl``, as the synthetic ``tiny`` writes) — how often
  the attention for a generated object word lands on that object, against chance
  (:mod:`r2m.evaluation.attention_hits`).
* ``scnn`` (S-CNN-RNN): its concept head as a multi-label classifier of the test images: per-class
  and per-image precision / recall / F1 of the top-3 concepts (the seed's protocol,
  :func:`r2m.evaluation.multilabel.topk_multilabel`: averages over all concepts / all images, 0/0 = 0) against the
  concepts of each image's reference captions, beside a frequency baseline (the 3 concepts most
  frequent in the training labels, for every image).
* any other model: ``{"skipped": ...}``.

Output folder ``results/<D>/<model>/s<seed>/train_sup/inspect/``: ``inspect.json`` (+ the figures).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from r2m.text.vocab import END
from r2m.utils.io import write_json
from r2m.utils.registry import Registry

# numpy, pyarrow and torch are imported by the inspectors: a model with nothing to inspect (or a
# skipped baseline) starts without them

INSPECTORS: Registry[Callable[..., dict[str, Any]]] = Registry("model inspector")
BOX_SCORE = 0.3  # prepared/detections.jsonl: true objects score >= 0.8, its false positives < 0.25
ML_PROTOCOL = ("top-3 labels per image; C-P/C-R averaged over all concepts, O-P/O-R over all test images, "
               "F1 = harmonic mean of the averaged P and R; 0/0 = 0 (seed 002, Sec. 4.2)")


def _split_ids(prepared: Path, split: str) -> list[str]:
    import pyarrow.parquet as pq

    images = pq.read_table(prepared / "images.parquet", columns=["image_id", "split"]).to_pandas()
    return [str(i) for i in images.loc[images["split"] == split, "image_id"]]


def ground_truth_boxes(prepared: Path) -> dict[str, dict[str, list[list[float]]]] | None:
    """image id -> dictionary word -> boxes, from ``prepared/detections.jsonl`` (None if absent)."""
    path = prepared / "detections.jsonl"
    if not path.exists():
        return None
    from r2m.text.dictionary import Singulariser, class_word

    sing = Singulariser()
    out: dict[str, dict[str, list[list[float]]]] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                if float(r["score"]) < BOX_SCORE or not r.get("box"):
                    continue
                out.setdefault(str(r["image_id"]), {}).setdefault(class_word(r["label"], sing), []).append(
                    [float(x) for x in r["box"]])
            except (ValueError, KeyError, TypeError) as err:
                raise ValueError(f"{path}:{n}: bad detection record ({err})") from None
    return out


@INSPECTORS.register("sat_hard")  # its maps: α_t, the distribution its location s_t is drawn from
@INSPECTORS.register("sat")
def inspect_sat(ctx, model, feats, itos: list[str], out_dir: Path, device) -> dict[str, Any]:
    import numpy as np
    import pyarrow.parquet as pq
    import torch
    from PIL import Image

    from r2m.datasets.base import resolve_image_path
    from r2m.decoding.captioner import caption_features
    from r2m.evaluation.attention_hits import attention_hit_rate
    from r2m.supervised.attention_maps import attention_maps_figure
    from r2m.text.singular import Singulariser

    prepared = Path(ctx.deps["prepared"])
    cp = ctx.params.caption
    ids = [i for i in _split_ids(prepared, cp.split) if i in feats.row_of]
    toks = caption_features(model, feats, ids, cp.beam, cp.max_len, cp.batch_size, device)
    paths = pq.read_table(prepared / "images.parquet", columns=["image_id", "path"]).to_pandas()
    path_of = dict(zip(paths["image_id"].astype(str), paths["path"], strict=True))
    grid_hw = tuple(feats.shapes["grid"][:2])
    boxes = ground_truth_boxes(prepared)
    sing = Singulariser()
    records, figures = [], []
    n_fig = ctx.params.report.figure_images
    for s in range(0, len(ids), cp.batch_size):
        chunk = ids[s: s + cp.batch_size]
        rows = np.array([feats.row_of[i] for i in chunk], dtype=np.int64)
        a = model.encode({k: v.to(device) for k, v in feats.get(rows).items()})
        seqs = [t + [END] for t in toks[s: s + len(chunk)]]  # with <#end>: its attention is shown too
        T = max(len(q) for q in seqs)
        tok = torch.zeros(len(chunk), T, dtype=torch.long, device=device)
        for r, q in enumerate(seqs):
            tok[r, : len(q)] = torch.tensor(q)
        alphas = model.attention_of(a, tok).float().cpu().numpy().reshape(len(chunk), T, *grid_hw)
        for r, iid in enumerate(chunk):
            words = [itos[t] for t in seqs[r]]
            al = alphas[r, : len(words)]
            img = None
            if boxes is not None or len(figures) < n_fig:
                with Image.open(resolve_image_path(prepared, path_of[iid])) as im:
                    img = np.asarray(im.convert("RGB"))
            if boxes is not None:
                records.append((words[:-1], al[:-1], boxes.get(iid, {}), (img.shape[1], img.shape[0])))
            if len(figures) < n_fig:
                name = f"attention_{len(figures):03d}.png"  # not the id: ids are data (e.g. "a/b")
                fig = attention_maps_figure(img, words, al, title=f"image {iid}")
                fig.savefig(out_dir / name, dpi=90)
                figures.append({"image_id": iid, "file": name, "caption": " ".join(words[:-1])})
    out: dict[str, Any] = {"model": model.name, "grid": list(grid_hw), "images": len(ids), "figures": figures}
    if boxes is None:
        out["attention_hits"] = {"skipped": f"{prepared}/detections.jsonl absent: no ground-truth boxes"}
    else:
        vocab_words = {w for w in itos[4:]}
        w2o = {w: sing.singular(w) for w in vocab_words}
        out["attention_hits"] = attention_hit_rate(records, w2o)
        ctx.log.info("inspect_sup %s: attention on the named object %s", model.name, out["attention_hits"])
    return out


@INSPECTORS.register("scnn")
def inspect_scnn(ctx, model, feats, itos: list[str], out_dir: Path, device) -> dict[str, Any]:
    import numpy as np
    import pyarrow.parquet as pq
    import torch

    from r2m.datasets.base import REFERENCES
    from r2m.evaluation.inputs import load_references
    from r2m.evaluation.multilabel import topk_multilabel

    prepared = Path(ctx.deps["prepared"])
    split = ctx.params.caption.split
    refs = load_references(Path(ctx.deps["references"]) / REFERENCES)
    ids = [i for i in _split_ids(prepared, split) if i in feats.row_of and i in refs]
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
    train = [i for i, sp in zip(captions["image_id"], captions["split"], strict=True) if sp == "train"]
    model.bind_data({"image_id": [i for i, sp in zip(captions["image_id"], captions["split"], strict=True)
                                  if sp == "train"],
                     "caption": [c for c, sp in zip(captions["caption"], captions["split"], strict=True)
                                 if sp == "train"]})
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


def run(ctx) -> None:
    from r2m.supervised.skip import skip_reason

    out_dir = Path(ctx.outs["inspect"])
    out_dir.mkdir(parents=True, exist_ok=True)
    reason = skip_reason(ctx.deps["sup_vocab"])
    if reason or ctx.model not in INSPECTORS:
        result = {"model": ctx.model, "skipped": reason or f"nothing to inspect for {ctx.model}"}
    else:
        from r2m.decoding.captioner import load_checkpoint_model
        from r2m.supervised.data import model_features

        device = ctx.runtime.torch_device()
        model, _, itos = load_checkpoint_model(ctx.deps["model"], device, ctx.deps["sup_vocab"])
        feats = model_features(ctx.deps["model"], ctx.deps["features"], model.feature_kinds)
        try:
            result = INSPECTORS.get(ctx.model)(ctx, model, feats, itos, out_dir, device)
        finally:
            feats.close()
    write_json(out_dir / "inspect.json", result)
