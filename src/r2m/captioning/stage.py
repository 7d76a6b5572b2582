"""The ``caption`` stage: beam-search captions for the images of ``params.caption.split``.

Every image of the split gets a caption. Concepts are the image's detections (score ≥
``concepts.score_threshold``, de-duplicated, at most ``concepts.max_per_image``) in the order
:func:`r2m.text.dictionary.image_concepts` returns them (no shuffling at test time); concept words
missing from the vocabulary are dropped. <pad> and <#start> are never generated, nor is <UNK>
while ``fidelity.ban_unk`` is true (ours; ``official`` allows it). ``fidelity.decoding`` picks the
search (``official``: the released code's im2txt beam search,
:func:`r2m.captioning.beam.beam_search_im2txt`). With ``fidelity.image_concepts: official`` the
concepts come in the official test order (:func:`r2m.text.dictionary.image_concepts`).

An image with no concept is captioned by ``caption.no_concepts``
(:data:`r2m.captioning.captioner.NO_CONCEPTS`): ``empty`` (the paper's behaviour: decode from the
empty concept set, ``v = 0``, which yields the model's one generic sentence), ``image`` (decode from
the image's projected feature v̂^I, which L_M trains to lie near ṽ; only for checkpoints of the image
stages, others fall back to ``empty`` with a warning) or ``top1`` (the image's best detection below
the threshold whose word is in the vocabulary; ``empty`` when it has none).

Outputs: ``captions.json`` (COCO results ``[{"image_id", "caption"}]``), ``attention.json``
(FM/RM weights per step of the best beam for the first :data:`ATTENTION_IMAGES` images: ``heads``,
``memory_slots``, ``fm_tokens``, ``rm_keys`` and per image ``steps`` of ``{"t", "input", "output", "fm", "rm"}``,
``fm[h][i][j]`` the weight of FM token i on token j (H × 2 × 2), ``rm[h][n][j]`` memory slot n on ``rm_keys[j]``
(H × N × (N+1)), rows summing to 1, null for an ablation without that memory) and ``caption_info.json`` (the concepts each image was captioned from and
where they came from, with counts per source; read by ``evaluate`` for concept recall).

The captioning itself is :mod:`r2m.captioning.captioner`; this module only reads the stage's inputs
and writes its outputs. ``r2m caption IMAGES…`` (image files of no dataset) is :mod:`r2m.caption_cli`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from r2m.captioning.captioner import (
    END,
    FeatureSource,
    attention_record,
    caption_detections,
    load_checkpoint_model,
    source_counts,
    words_of,
)
from r2m.datasets.base import split_ids
from r2m.stage.context import StageContext
from r2m.utils.io import write_json

ATTENTION_IMAGES = 8


def features_from_folder(folder: str | Path) -> FeatureSource:
    """A :data:`r2m.captioning.captioner.FeatureSource` reading a ``features`` stage folder's pooled vectors."""

    def read(ids: list[str]) -> dict[str, np.ndarray]:
        from r2m.vision.feature_store import load_rows

        return load_rows(folder, ids, "pooled")  # the rows asked for only (not all 123k of MSCOCO)

    return read


def selected_on_test(model_dir: str | Path) -> bool:
    """Whether the checkpoint in ``model_dir`` was chosen by its CIDEr on the test images
    (``fidelity.select_on_test`` in the params its training stage saved beside it): leakage, which every
    table row built on it says."""
    import yaml

    path = Path(model_dir) / "params.yaml"
    doc = yaml.safe_load(path.read_text(encoding="utf-8")) if path.exists() else None
    return bool(((doc or {}).get("fidelity") or {}).get("select_on_test", False))


def run(ctx: StageContext) -> None:
    cp, conc, fid = ctx.params.caption, ctx.params.concepts, ctx.params.fidelity
    ids = split_ids(ctx.deps["prepared"], cp.split)
    device = ctx.runtime.torch_device()
    model, ckpt, itos = load_checkpoint_model(ctx.deps["model"], device, ctx.deps["vocab"])
    det = pq.read_table(Path(ctx.deps["concepts"]) / "detections.parquet").to_pandas()
    res = caption_detections(
        model, ckpt, itos, ids, det, threshold=conc.score_threshold, max_per_image=conc.max_per_image,
        dictionary=conc.dictionary, no_concepts=cp.no_concepts, image_concepts=fid.image_concepts,
        concept_per_class=fid.concept_per_class,
        decoding=fid.decoding, ban_unk=fid.ban_unk, ban_specials=fid.ban_specials, beam=cp.beam, max_len=cp.max_len, batch_size=cp.batch_size, device=device,
        features=features_from_folder(Path(ctx.deps["features"])), log=ctx.log, desc="caption")
    counts = source_counts(res.source)
    ctx.log.info("caption: %d %s images (%d without concepts >= %.2f: no_concepts=%s -> %d top1, %d image, "
                 "%d empty), beam %d, max_len %d", len(ids), cp.split, len(ids) - counts["detections"],
                 conc.score_threshold, cp.no_concepts, counts["top1"], counts["image"], counts["empty"],
                 cp.beam, cp.max_len)

    results: list[dict[str, str]] = []
    att_images: list[dict[str, Any]] = []
    for i, toks in enumerate(res.tokens):
        results.append({"image_id": ids[i], "caption": words_of(toks, itos)})
        if len(att_images) < ATTENTION_IMAGES:
            rec = attention_record(model, itos, res.concept_ids[i], [*toks, END][: cp.max_len], device, res.v[i])
            att_images.append({"image_id": ids[i], "concepts": res.words[i], "caption": results[-1]["caption"], **rec})
    write_json(ctx.outs["captions"], results)
    write_json(ctx.outs["info"], {
        "dataset": ctx.dataset, "variant": ctx.variant, "ckpt": ctx.ckpt, "no_concepts": cp.no_concepts,
        "score_threshold": conc.score_threshold, "counts": counts,
        "selected_on_test": selected_on_test(ctx.deps["model"]),
        "images": [{"image_id": i, "concepts": w, "source": s}
                   for i, w, s in zip(ids, res.words, res.source, strict=True)],
    })
    ctx.save_params(ctx.outs["captions"].parent, "captions.params.yaml")
    cfg = model.cfg
    write_json(ctx.outs["attention"], {
        "dataset": ctx.dataset, "variant": ctx.variant, "ckpt": ctx.ckpt,
        "heads": cfg.heads, "memory_slots": cfg.memory_slots,
        "fm": cfg.fm, "decoder_memory": cfg.decoder_memory,
        "fm_tokens": ["v", "w_prev"],
        "rm_keys": [f"M{k}" for k in range(cfg.memory_slots)] + ["f"],
        "images": att_images,
    }, indent=None)
    ctx.log.info("caption: wrote %d captions (%d empty, %d distinct)", len(results),
                 int(np.sum([not r["caption"] for r in results])), len({r["caption"] for r in results}))
