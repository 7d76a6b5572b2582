"""The captioning library: from a checkpoint and an image's concepts to a caption and its attention.

One place for what the DAG's ``caption`` stage (:mod:`r2m.captioning.stage`), ``r2m caption IMAGES``
(:class:`r2m.captioning.photos.Captioner`, driven by :mod:`r2m.caption_cli`), R²M's checkpoint selection
(:mod:`r2m.training.selection`) and the supervised baselines' decoding (:mod:`r2m.supervised.caption`)
share:

* :func:`load_checkpoint_model` — a model (R²M or a baseline) + its vocabulary, checked to fit;
* :func:`concept_inputs` — image → concept words by the fidelity order, with the ``no_concepts``
  fallbacks (:data:`NO_CONCEPTS`), and :func:`image_vectors` (v̂^I for ``no_concepts: image``);
* :func:`encode_all` — concept lists → v; :func:`caption_vectors` / :func:`caption_ids` — best
  beam per row (:data:`r2m.captioning.beam.DECODERS` by ``fidelity.decoding``); :func:`best_tokens`
  — one batch through a search, cut at <#end>;
* :func:`attention_record` — FM/RM weights of one generated caption.

Nothing here writes stage outputs; this module imports nothing above ``captioning``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from r2m.captioning.beam import DECODERS
from r2m.text.dictionary import concept_order, image_concept_lists
from r2m.text.vocab import END, PAD, START, UNK, load_itos, pad_lists
from r2m.utils.progress import progress

SPECIALS = (PAD, START)  # never a target in training: banned unless fidelity.ban_specials is false
BANNED = (*SPECIALS, UNK)  # everything the paper profile's decoders never generate
NO_CONCEPTS = ("empty", "image", "top1")
IMAGE_STAGES = ("train_m", "train_i")
SOURCES = ("detections", "top1", "image", "empty")
log = logging.getLogger("r2m")

# image id -> pooled feature vector, for the ids asked (missing ids are simply absent)
FeatureSource = Callable[[list[str]], dict[str, np.ndarray]]


# ---------------------------------------------------------------------------- model + vocabulary
def check_vocab(model, itos: Sequence[str], where: str | Path, what: str = "vocabulary") -> None:
    """A vocabulary must have exactly the model's number of words."""
    if len(itos) != model.cfg.vocab_size:
        raise ValueError(f"{where}: {what} has {len(itos)} words, the model {model.cfg.vocab_size}")


def load_checkpoint_model(model_dir: str | Path, device: Any, vocab: str | Path | Sequence[str] | None = None,
                          where: str | Path | None = None, what: str = "vocabulary",
                          ) -> tuple[Any, dict[str, Any], list[str] | None]:
    """``(model, checkpoint dict, itos)``: the model of ``model_dir`` (R²M or a baseline) on
    ``device`` in eval mode, with its vocabulary (a vocabulary folder, or the word list itself;
    ``None``: no vocabulary) checked to fit; errors name ``where`` (default: the vocabulary folder)."""
    from r2m.models.catalog import load_model

    model, ckpt = load_model(model_dir)
    model.to(device).eval()
    if vocab is None:
        return model, ckpt, None
    itos = load_itos(vocab) if isinstance(vocab, (str, Path)) else list(vocab)
    check_vocab(model, itos, where if where is not None else vocab, what)
    return model, ckpt, itos


# ---------------------------------------------------------------------------- concepts
def concept_inputs(ids: list[str], det: Any, threshold: float, max_per_image: int, stoi: dict[str, int],
                   mode: str, order: str = "by_score", dictionary: str = "openimages",
                   per_class: bool = False) -> tuple[list[list[str]], list[str]]:
    """Concept words per image and their source: ``detections``, ``top1`` (``mode == "top1"``: the
    best detection below the threshold with a vocabulary word), ``image`` (``mode == "image"``: to be
    decoded from v̂^I) or ``empty``. ``order``: :func:`r2m.text.dictionary.concept_order`; ``per_class``:
    ``fidelity.concept_per_class`` (:func:`r2m.text.dictionary.image_concepts`)."""
    if mode not in NO_CONCEPTS:
        raise ValueError(f"caption.no_concepts: {mode!r} is not one of {', '.join(NO_CONCEPTS)}")
    per_image = image_concept_lists(det, threshold, max_per_image, order, dictionary, per_class)
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


def order_at_test(fidelity_image_concepts: str | None) -> str:
    """The concept order at test time for ``fidelity.image_concepts`` (``None``: by score)."""
    return concept_order(fidelity_image_concepts or "by_score", "test")


def image_vectors(model, ckpt: dict[str, Any], rows: dict[int, str], features: FeatureSource,
                  log: Any = log) -> dict[int, torch.Tensor]:
    """v̂^I for the given rows (row -> image id) from pooled features (``features(ids)`` is asked
    only when they are needed); {} with a warning when the checkpoint has no trained image
    projection or an image has no features."""
    if not rows:
        return {}
    if not model.cfg.image_dim or ckpt.get("stage") not in IMAGE_STAGES:
        log.warning("caption: no_concepts=image needs a checkpoint of %s (this one is %s); %d image(s) "
                    "are captioned from v = 0", "/".join(IMAGE_STAGES), ckpt.get("stage"), len(rows))
        return {}
    feats = features(list(rows.values()))
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


def resolve_sources(source: list[str], vecs: dict[int, torch.Tensor]) -> list[str]:
    """``image`` rows without a v̂^I become ``empty``."""
    return [("image" if n in vecs else "empty") if s == "image" else s for n, s in enumerate(source)]


def source_counts(source: list[str]) -> dict[str, int]:
    return {k: source.count(k) for k in SOURCES}


# ---------------------------------------------------------------------------- encode + decode
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


def searcher(decoding: str = "paper", ban_unk: bool | None = None,
             ban_specials: bool | None = None) -> tuple[Callable[..., dict[str, torch.Tensor]], tuple[int, ...]]:
    """The search function of ``fidelity.decoding`` and the token ids it never generates: <pad> and
    <#start> unless ``ban_specials`` (``fidelity.ban_specials``) is false, <UNK> when ``ban_unk``
    (``fidelity.ban_unk``); None = the decoder's own default (``paper`` bans all three, the released
    code's ``official`` none)."""
    if decoding not in DECODERS:
        raise ValueError(f"fidelity.decoding {decoding!r}: choose from {sorted(DECODERS)}")
    search, default_ban = DECODERS[decoding]
    specials = SPECIALS if (default_ban if ban_specials is None else ban_specials) else ()
    return search, specials + ((UNK,) if (default_ban if ban_unk is None else ban_unk) else ())


def best_tokens(model, encoded: Any, beam: int, max_len: int, decoding: str = "paper",
                ban_unk: bool | None = None, ban_specials: bool | None = None) -> list[list[int]]:
    """Best beam per row of one encoded batch: token ids up to (not including) <#end>."""
    search, banned = searcher(decoding, ban_unk, ban_specials)
    with torch.no_grad():
        return first_tokens(search(model, encoded, beam=beam, max_len=max_len, banned=banned))


def first_tokens(res: dict[str, Any]) -> list[list[int]]:
    """The first hypothesis per row of a search result (``tokens`` [B, K, T], ``lengths`` [B, K]):
    token ids up to (not including) <#end>."""
    out = []
    for row, n in zip(res["tokens"][:, 0].tolist(), res["lengths"][:, 0].tolist(), strict=True):
        row = row[: int(n)]
        out.append(row[:-1] if row and row[-1] == END else row)
    return out


@torch.no_grad()
def caption_features(model, feats: Any, image_ids: Sequence[str], beam: int, max_len: int, batch_size: int,
                     device: Any, desc: str = "caption_sup",
                     decode: Callable[[Any, Any], list[list[int]]] | None = None) -> list[list[int]]:
    """A supervised captioner's best beam per image (``paper`` decoding; ``decode(model, encoded)``
    instead, when given): token ids up to (not including) <#end>, batched. ``feats`` gives feature
    rows by image id (``row_of``) and the per-kind tensors of some rows (``get``), as
    :class:`r2m.supervised.data.Features`."""
    if decode is None:
        def decode(model, encoded):
            return best_tokens(model, encoded, beam, max_len, "paper")
    out: list[list[int]] = []
    for s in progress(range(0, len(image_ids), batch_size), desc=desc):
        rows = np.array([feats.row_of[i] for i in image_ids[s: s + batch_size]], dtype=np.int64)
        f = {k: v.to(device) for k, v in feats.get(rows).items()}
        out += decode(model, model.encode(f))
    return out


def caption_vectors(model, v: torch.Tensor, beam: int, max_len: int, batch_size: int,
                    desc: str | None = None, decoding: str = "paper", ban_unk: bool | None = None,
                    ban_specials: bool | None = None) -> list[list[int]]:
    """Best beam per concept vector: token ids up to (not including) <#end>. Batched.
    ``decoding``: ``fidelity.decoding`` (see :data:`r2m.captioning.beam.DECODERS`)."""
    searcher(decoding)  # an unknown name fails before any work
    out: list[list[int]] = []
    steps = range(0, len(v), batch_size)
    for s in progress(steps, desc=desc) if desc else steps:
        out += best_tokens(model, v[s: s + batch_size], beam, max_len, decoding, ban_unk, ban_specials)
    return out


def caption_ids(model, concept_ids: list[list[int]], beam: int, max_len: int, batch_size: int, device,
                desc: str | None = None, decoding: str = "paper", ban_unk: bool | None = None,
                ban_specials: bool | None = None) -> list[list[int]]:
    """Best beam per concept list: token ids up to (not including) <#end>. Batched.
    ``decoding``: ``fidelity.decoding`` (see :data:`r2m.captioning.beam.DECODERS`)."""
    v = encode_all(model, concept_ids, batch_size, device)
    return caption_vectors(model, v, beam, max_len, batch_size, desc, decoding, ban_unk, ban_specials)


def words_of(tokens: list[int], itos: Sequence[str]) -> str:
    """A caption's token ids (without <#end>) as its text."""
    return " ".join(itos[t] for t in tokens)


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


# ---------------------------------------------------------------------------- images -> captions
@dataclass
class Captioned:
    """The captions of a list of images, with what each was decoded from."""

    ids: list[str]
    words: list[list[str]]  # concept words per image
    source: list[str]  # where they came from (:data:`SOURCES`)
    concept_ids: list[list[int]]
    v: torch.Tensor  # [N, d] the vectors decoded from
    tokens: list[list[int]]  # best caption per image, without <#end>


def caption_detections(model, ckpt: dict[str, Any], itos: list[str], ids: list[str], det: Any, *,
                       threshold: float, max_per_image: int, dictionary: str, no_concepts: str,
                       image_concepts: str | None, decoding: str | None, beam: int, max_len: int,
                       batch_size: int, device, features: FeatureSource, log: Any = log,
                       desc: str | None = None, ban_unk: bool | None = None,
                       ban_specials: bool | None = None, concept_per_class: bool | None = None) -> Captioned:
    """Caption images from their detections: concept inputs (with the ``no_concepts`` fallback),
    v (or v̂^I), beam search. ``image_concepts``/``concept_per_class``/``decoding``/``ban_unk``: the
    ``fidelity`` items."""
    stoi = {w: i for i, w in enumerate(itos)}
    words, source = concept_inputs(ids, det, threshold, max_per_image, stoi, no_concepts,
                                   order_at_test(image_concepts), dictionary, bool(concept_per_class))
    vecs = image_vectors(model, ckpt, {n: i for n, i in enumerate(ids) if source[n] == "image"}, features, log)
    source = resolve_sources(source, vecs)
    chunks = [[stoi[w] for w in ws] for ws in words]
    v = encode_all(model, chunks, batch_size, device, vecs)
    best = caption_vectors(model, v, beam, max_len, batch_size, desc=desc, decoding=decoding or "paper",
                           ban_unk=ban_unk, ban_specials=ban_specials)
    return Captioned(ids, words, source, chunks, v, best)
