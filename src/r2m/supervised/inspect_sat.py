"""``inspect_sup`` of Show, Attend and Tell (``sat``, ``sat_hard``; loaded by name by :mod:`r2m.supervised.inspect`):
per-word attention maps of a few test images (α upsampled to the image and smoothed, the paper's Figs. 2–3) as
PNGs (:mod:`r2m.supervised.attention_maps`), and — when the prepared dataset knows its objects' boxes
(``prepared/detections.jsonl``, as the synthetic ``tiny`` writes) — how often the attention for a generated
object word lands on that object, against chance (:mod:`r2m.evaluation.attention_hits`). ``sat_hard``'s maps:
α_t, the distribution its location s_t is drawn from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from r2m.stage.context import StageContext
from r2m.supervised.inspection import opened, split_of
from r2m.text.vocab import END

BOX_SCORE = 0.3  # prepared/detections.jsonl: true objects score >= 0.8, its false positives < 0.25


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


def inspect(ctx: StageContext, out_dir: Path) -> dict[str, Any]:
    with opened(ctx) as (model, feats, itos, device):
        return _attention(ctx, model, feats, itos, out_dir, device)


def _attention(ctx: StageContext, model, feats, itos: list[str], out_dir: Path, device) -> dict[str, Any]:
    import numpy as np
    import pyarrow.parquet as pq
    import torch
    from PIL import Image

    from r2m.captioning.captioner import caption_features
    from r2m.datasets.base import resolve_image_path
    from r2m.evaluation.attention_hits import attention_hit_rate
    from r2m.supervised.attention_maps import attention_maps_figure
    from r2m.text.singular import Singulariser

    prepared = Path(ctx.deps["prepared"])
    cp = ctx.params.caption
    ids = [i for i in split_of(prepared, cp.split) if i in feats.row_of]
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
