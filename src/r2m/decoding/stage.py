"""The ``caption`` stage: beam-search captions for the images of ``params.caption.split``.

Every image of the split gets a caption. Concepts are the image's detections (score ≥
``concepts.score_threshold``, de-duplicated, at most ``concepts.max_per_image``) in the order
:func:`r2m.text.dictionary.image_concepts` returns them (no shuffling at test time); concept words
missing from the vocabulary are dropped. <pad> and <#start> are never generated, nor is <UNK>
unless ``fidelity.decoding`` is ``official`` (the released code's im2txt beam search,
:func:`r2m.decoding.beam.beam_search_im2txt`). With ``fidelity.image_concepts: official`` the
concepts come in the official test order (:func:`r2m.text.dictionary.image_concepts`).

An image with no concept is captioned by ``caption.no_concepts`` (:data:`NO_CONCEPTS`):
``empty`` (the paper's behaviour: decode from the empty concept set, ``v = 0``, which yields the
model's one generic sentence), ``image`` (decode from the image's projected feature v̂^I, which L_M
trains to lie near ṽ; only for checkpoints of the image stages, others fall back to ``empty``
with a warning) or ``top1`` (the image's best detection below the threshold whose word is in the
vocabulary; ``empty`` when it has none).

Outputs: ``captions.json`` (COCO results ``[{"image_id", "caption"}]``), ``attention.json``
(FM/RM weights per step for the first :data:`ATTENTION_IMAGES` images; structure in
docs/ARCHITECTURE.md) and ``caption_info.json`` (the concepts each image was captioned from and
where they came from, with counts per source; read by ``evaluate`` for concept recall).

Without ``--dataset/--variant/--ckpt``, ``r2m caption IMAGES… [--model FOLDER]`` captions image
files that belong to no dataset (:mod:`r2m.decoding.standalone`).
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
from r2m.text.dictionary import concept_order, image_concept_lists
from r2m.text.vocab import END, PAD, START, UNK, load_itos, pad_lists
from r2m.utils.io import write_json
from r2m.utils.progress import progress

ATTENTION_IMAGES = 8
BANNED = (PAD, START, UNK)
ALLOWED_UNK = (PAD, START)
NO_CONCEPTS = ("empty", "image", "top1")
IMAGE_STAGES = ("train_m", "train_i")


def attention_record(model, itos: list[str], concept_ids: list[int], tokens: list[int], device,
                     v: torch.Tensor | None = None) -> dict[str, Any]:
    """FM/RM weights of the decoder re-run teacher-forced on one generated caption (ids incl. <#end>),
    from the concepts' ``v`` (or the given ``v`` [d], e.g. an image's v̂^I)."""
    inputs = torch.tensor([[START] + tokens[:-1]], device=device)
    c = torch.tensor([concept_ids], dtype=torch.long, device=device).view(1, -1)
    with torch.no_grad():
        if v is None:
            v = model.encode(c, torch.tensor([len(concept_ids)], device=device))
        f, fm = model.fusion(model.fusion.prepare(v.view(1, -1).to(device)), model.embed(inputs), True)
        _, rm = model.run_memory(model.decoder, f, True)
    steps = []
    for t, tok in enumerate(tokens):
        steps.append({
            "t": t,
            "input": itos[int(inputs[0, t])],
            "output": itos[tok],
            "fm": fm[0, t].tolist() if fm is not None else None,
            "rm": rm[0, t].tolist() if rm is not None else None,
        })
    return {"steps": steps}


def encode_all(model, concept_ids: list[list[int]], batch_size: int, device,
               image_vectors: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
    """v [N, d] for every concept list (``v = 0`` for an empty one); rows named in
    ``image_vectors`` take that vector (an image's v̂^I) instead."""
    vs = []
    for s in range(0, len(concept_ids), batch_size):
        concepts, lens = pad_lists(pa.array(concept_ids[s: s + batch_size], type=pa.list_(pa.int64())))
        with torch.no_grad():
            vs.append(model.encode(torch.from_numpy(concepts).to(device), torch.from_numpy(lens).to(device)))
    d = model.cfg.d
    v = torch.cat(vs) if vs else torch.zeros(0, d, device=device)
    for row, vec in (image_vectors or {}).items():
        v[row] = vec.to(v.device, v.dtype)
    return v


def caption_vectors(model, v: torch.Tensor, beam: int, max_len: int, batch_size: int,
                    desc: str | None = None, decoding: str = "paper") -> list[list[int]]:
    """Best beam per concept vector: token ids up to (not including) <#end>. Batched.
    ``decoding``: ``fidelity.decoding`` (see :data:`r2m.decoding.beam.DECODERS`)."""
    if decoding not in DECODERS:
        raise ValueError(f"fidelity.decoding {decoding!r}: choose from {sorted(DECODERS)}")
    search, ban_unk = DECODERS[decoding]
    out: list[list[int]] = []
    steps = range(0, len(v), batch_size)
    for s in progress(steps, desc=desc) if desc else steps:
        with torch.no_grad():
            res = search(model, v[s: s + batch_size], beam=beam, max_len=max_len,
                         banned=BANNED if ban_unk else ALLOWED_UNK)
        for row, n in zip(res["tokens"][:, 0].tolist(), res["lengths"][:, 0].tolist(), strict=True):
            row = row[: int(n)]
            out.append(row[:-1] if row and row[-1] == END else row)
    return out


def caption_ids(model, concept_ids: list[list[int]], beam: int, max_len: int, batch_size: int, device,
                desc: str | None = None, decoding: str = "paper") -> list[list[int]]:
    """Best beam per concept list: token ids up to (not including) <#end>. Batched.
    ``decoding``: ``fidelity.decoding`` (see :data:`r2m.decoding.beam.DECODERS`)."""
    v = encode_all(model, concept_ids, batch_size, device)
    return caption_vectors(model, v, beam, max_len, batch_size, desc, decoding)


def concept_inputs(ids: list[str], det: Any, threshold: float, max_per_image: int, stoi: dict[str, int],
                   mode: str, order: str = "by_score", dictionary: str = "openimages",
                   ) -> tuple[list[list[str]], list[str]]:
    """Concept words per image and their source: ``detections``, ``top1`` (``mode == "top1"``: the
    best detection below the threshold with a vocabulary word), ``image`` (``mode == "image"``: to be
    decoded from v̂^I) or ``empty``. ``order``: :func:`r2m.text.dictionary.concept_order`."""
    if mode not in NO_CONCEPTS:
        raise ValueError(f"caption.no_concepts: {mode!r} is not one of {', '.join(NO_CONCEPTS)}")
    per_image = image_concept_lists(det, threshold, max_per_image, order, dictionary)
    words = [[w for w in per_image.get(i, []) if w in stoi] for i in ids]
    source = ["detections" if w else "empty" for w in words]
    if mode == "top1" and not all(words):
        below = image_concept_lists(det, 0.0, 10**6)
        for n, i in enumerate(ids):
            if not words[n]:
                best = next((w for w in below.get(i, []) if w in stoi), None)
                if best is not None:
                    words[n], source[n] = [best], "top1"
    elif mode == "image":
        source = ["image" if s == "empty" else s for s in source]
    return words, source


def image_vectors(model, ckpt: dict[str, Any], rows: dict[int, str], features_dir: Path | None,
                  log: Any, feats: dict[str, np.ndarray] | None = None) -> dict[int, torch.Tensor]:
    """v̂^I for the given rows (row -> image id) from pooled features (a features folder, or
    ``feats``: image id -> pooled vector); {} with a warning when the checkpoint has no trained
    image projection or an image has no features."""
    if not rows:
        return {}
    if not model.cfg.image_dim or ckpt.get("stage") not in IMAGE_STAGES:
        log.warning("caption: no_concepts=image needs a checkpoint of %s (this one is %s); %d image(s) "
                    "are captioned from v = 0", "/".join(IMAGE_STAGES), ckpt.get("stage"), len(rows))
        return {}
    if feats is None:
        from r2m.vision.features import load_features

        arr, index = load_features(features_dir, "pooled")
        where = dict(zip(index["image_id"].astype(str), index["row"], strict=True))
        feats = {i: arr[where[i]] for i in rows.values() if i in where}
    missing = [i for i in rows.values() if i not in feats]
    if missing:
        log.warning("caption: %d image(s) without pooled features are captioned from v = 0, e.g. %s",
                    len(missing), missing[:3])
    device = next(model.parameters()).device
    todo = [(r, i) for r, i in rows.items() if i in feats]
    if not todo:
        return {}
    x = torch.from_numpy(np.stack([np.asarray(feats[i], dtype=np.float32) for _, i in todo])).to(device)
    with torch.no_grad():
        v = model.project_image(x)
    return {r: v[n] for n, (r, _) in enumerate(todo)}


def source_counts(source: list[str]) -> dict[str, int]:
    return {k: source.count(k) for k in ("detections", "top1", "image", "empty")}


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
    det = pq.read_table(Path(ctx.deps["concepts"]) / "detections.parquet").to_pandas()
    fid = ctx.params.fidelity
    words, source = concept_inputs(ids, det, conc.score_threshold, conc.max_per_image, stoi, cp.no_concepts,
                                   concept_order(fid.image_concepts, "test"), conc.dictionary)
    vecs = image_vectors(model, ckpt, {n: i for n, i in enumerate(ids) if source[n] == "image"},
                         Path(ctx.deps["features"]), ctx.log)
    source = [("image" if n in vecs else "empty") if s == "image" else s for n, s in enumerate(source)]
    counts = source_counts(source)
    ctx.log.info("caption: %d %s images (%d without concepts >= %.2f: no_concepts=%s -> %d top1, %d image, "
                 "%d empty), beam %d, max_len %d", len(ids), cp.split, len(ids) - counts["detections"],
                 conc.score_threshold, cp.no_concepts, counts["top1"], counts["image"], counts["empty"],
                 cp.beam, cp.max_len)

    results: list[dict[str, str]] = []
    att_images: list[dict[str, Any]] = []
    chunks = [[stoi[w] for w in ws] for ws in words]
    v = encode_all(model, chunks, cp.batch_size, device, vecs)
    best = caption_vectors(model, v, cp.beam, cp.max_len, cp.batch_size, desc="caption", decoding=fid.decoding)
    for i, toks in enumerate(best):
        results.append({"image_id": ids[i], "caption": " ".join(itos[t] for t in toks)})
        if len(att_images) < ATTENTION_IMAGES:
            rec = attention_record(model, itos, chunks[i], [*toks, END][: cp.max_len], device, v[i])
            att_images.append({"image_id": ids[i], "concepts": words[i], "caption": results[-1]["caption"], **rec})
    write_json(ctx.outs["captions"], results)
    write_json(ctx.outs["info"], {
        "dataset": ctx.dataset, "variant": ctx.variant, "ckpt": ctx.ckpt, "no_concepts": cp.no_concepts,
        "score_threshold": conc.score_threshold, "counts": counts,
        "images": [{"image_id": i, "concepts": w, "source": s} for i, w, s in zip(ids, words, source, strict=True)],
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


def add_arguments(parser) -> None:
    from r2m.decoding.standalone import add_arguments as add

    add(parser)


def standalone(args) -> int:
    from r2m.decoding.standalone import main

    return main(args)
