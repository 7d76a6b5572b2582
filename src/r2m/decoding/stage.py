"""The ``caption`` stage: beam-search captions for the images of ``params.caption.split``.

Every image of the split gets a caption. Concepts are the image's detections (score ≥
``concepts.score_threshold``, de-duplicated, at most ``concepts.max_per_image``) in the order
:func:`r2m.text.dictionary.image_concepts` returns them (no shuffling at test time); concept words
missing from the vocabulary are dropped. An image with no concept is captioned from the empty
concept set (``v = 0``), which yields the model's generic sentence. <pad> and <#start> are never
generated, nor is <UNK> unless ``fidelity.decoding`` is ``official`` (the released code's im2txt
beam search, :func:`r2m.decoding.beam.beam_search_im2txt`). With ``fidelity.image_concepts:
official`` the concepts come in the official test order (:func:`r2m.text.dictionary.image_concepts`).

Outputs: ``captions.json`` (COCO results ``[{"image_id", "caption"}]``) and ``attention.json``
(FM/RM weights per step for the first :data:`ATTENTION_IMAGES` images; structure in
docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from r2m.decoding.beam import DECODERS
from r2m.models import load_model
from r2m.models.r2m import END, PAD, START, UNK
from r2m.training.data import concept_order, image_concept_lists, load_itos, pad_lists
from r2m.utils.io import write_json
from r2m.utils.progress import progress

ATTENTION_IMAGES = 8
BANNED = (PAD, START, UNK)
ALLOWED_UNK = (PAD, START)


def attention_record(model, itos: list[str], concept_ids: list[int], tokens: list[int], device) -> dict[str, Any]:
    """FM/RM weights of the decoder re-run teacher-forced on one generated caption (ids incl. <#end>)."""
    inputs = torch.tensor([[START] + tokens[:-1]], device=device)
    c = torch.tensor([concept_ids], dtype=torch.long, device=device).view(1, -1)
    with torch.no_grad():
        out = model(c, torch.tensor([len(concept_ids)], device=device), inputs,
                    torch.tensor([len(tokens)], device=device), need_weights=True, reconstruct=False)
    steps = []
    for t, tok in enumerate(tokens):
        steps.append({
            "t": t,
            "input": itos[int(inputs[0, t])],
            "output": itos[tok],
            "fm": out["fm"][0, t].tolist() if out["fm"] is not None else None,
            "rm": out["rm"][0, t].tolist() if out["rm"] is not None else None,
        })
    return {"steps": steps}


def caption_ids(model, concept_ids: list[list[int]], beam: int, max_len: int, batch_size: int, device,
                desc: str | None = None, decoding: str = "paper") -> list[list[int]]:
    """Best beam per concept list: token ids up to (not including) <#end>. Batched.
    ``decoding``: ``fidelity.decoding`` (see :data:`r2m.decoding.beam.DECODERS`)."""
    if decoding not in DECODERS:
        raise ValueError(f"fidelity.decoding {decoding!r}: choose from {sorted(DECODERS)}")
    search, ban_unk = DECODERS[decoding]
    out: list[list[int]] = []
    steps = range(0, len(concept_ids), batch_size)
    for s in progress(steps, desc=desc) if desc else steps:
        concepts, lens = pad_lists(pa.array(concept_ids[s: s + batch_size], type=pa.list_(pa.int64())))
        with torch.no_grad():
            v = model.encode(torch.from_numpy(concepts).to(device), torch.from_numpy(lens).to(device))
            res = search(model, v, beam=beam, max_len=max_len, banned=BANNED if ban_unk else ALLOWED_UNK)
        for row, n in zip(res["tokens"][:, 0].tolist(), res["lengths"][:, 0].tolist(), strict=True):
            row = row[: int(n)]
            out.append(row[:-1] if row and row[-1] == END else row)
    return out


def run(ctx) -> None:
    cp, conc = ctx.params.caption, ctx.params.concepts
    device = ctx.runtime.torch_device()
    model, ckpt = load_model(ctx.deps["model"])
    model.to(device).eval()
    itos = load_itos(ctx.deps["vocab"])
    if len(itos) != model.cfg.vocab_size:
        raise ValueError(f"{ctx.deps['vocab']}: vocabulary has {len(itos)} words, the model {model.cfg.vocab_size}")
    stoi = {w: i for i, w in enumerate(itos)}
    images = pq.read_table(Path(ctx.deps["prepared"]) / "images.parquet", columns=["image_id", "split"]).to_pandas()
    ids = [str(i) for i in images.loc[images["split"] == cp.split, "image_id"]]
    det = pq.read_table(Path(ctx.deps["concepts"]) / "detections.parquet")
    fid = ctx.params.fidelity
    per_image = image_concept_lists(det, conc.score_threshold, conc.max_per_image,
                                    concept_order(fid.image_concepts, "test"), conc.dictionary)
    words = [[w for w in per_image.get(i, []) if w in stoi] for i in ids]
    ctx.log.info("caption: %d %s images (%d without concepts), beam %d, max_len %d", len(ids), cp.split,
                 sum(not w for w in words), cp.beam, cp.max_len)

    results: list[dict[str, str]] = []
    att_images: list[dict[str, Any]] = []
    chunks = [[stoi[w] for w in ws] for ws in words]
    best = caption_ids(model, chunks, cp.beam, cp.max_len, cp.batch_size, device, desc="caption",
                       decoding=fid.decoding)
    for i, toks in enumerate(best):
        results.append({"image_id": ids[i], "caption": " ".join(itos[t] for t in toks)})
        if len(att_images) < ATTENTION_IMAGES:
            rec = attention_record(model, itos, chunks[i], [*toks, END][: cp.max_len], device)
            att_images.append({"image_id": ids[i], "concepts": words[i], "caption": results[-1]["caption"], **rec})
    write_json(ctx.outs["captions"], results)
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
    ctx.log.info("caption: wrote %d captions (%d empty)", len(results),
                 int(np.sum([not r["caption"] for r in results])))
