"""``caption_sup``: captions of a supervised model for the ``caption.split`` images (scored by
``evaluate_sup``, :mod:`r2m.supervised.scores`). A skipped dataset gets ``captions.json`` = ``[]``.

``caption.decoder`` (:data:`SUP_DECODERS`) picks how a caption is made: ``beam`` (default; the same
batched beam search as R²M, :func:`r2m.captioning.captioner.best_tokens` with ``paper`` decoding and
width ``caption.beam``), ``greedy`` (the most probable word each step: width 1, as m-RNN's greedy
inference, seed 001) or ``sample`` (each word drawn from the softmax at ``caption.temperature``,
the draws seeded by ``caption.seed``: :func:`r2m.captioning.beam.sample_search`). R²M's ``caption``
stage decodes by ``fidelity.decoding`` and does not read ``caption.decoder``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from r2m.stage.context import StageContext
from r2m.supervised.skip import skip_reason
from r2m.utils.io import write_json

# torch and the decoders are imported by the functions that caption: a skipped baseline starts without them


def _sampled_tokens(model, feats: Any, image_ids: Sequence[str], cp: Any, device: Any) -> list[list[int]]:
    """One sampled caption per image (``caption.temperature``, draws seeded by ``caption.seed`` on
    ``device``): token ids up to (not including) <#end>, batched by ``caption.batch_size``."""
    import torch

    from r2m.captioning.beam import sample_search
    from r2m.captioning.captioner import BANNED, caption_features, first_tokens

    gen = torch.Generator(device=torch.device(device)).manual_seed(int(cp.seed))

    def draw(model, encoded) -> list[list[int]]:
        return first_tokens(sample_search(model, encoded, max_len=cp.max_len, banned=BANNED,
                                          temperature=cp.temperature, generator=gen))

    return caption_features(model, feats, image_ids, 1, cp.max_len, cp.batch_size, device, decode=draw)


# ``caption.decoder`` -> (model, features, image ids, caption params, device) -> token ids per image
def _searched_tokens(model, feats: Any, image_ids: Sequence[str], beam: int, cp: Any, device: Any) -> list[list[int]]:
    """The best of a beam search of width ``beam`` per image (width 1: greedy)."""
    from r2m.captioning.captioner import caption_features

    return caption_features(model, feats, image_ids, beam, cp.max_len, cp.batch_size, device, desc="caption_sup")


SUP_DECODERS: dict[str, Callable[..., list[list[int]]]] = {
    "beam": lambda model, feats, ids, cp, device: _searched_tokens(model, feats, ids, cp.beam, cp, device),
    "greedy": lambda model, feats, ids, cp, device: _searched_tokens(model, feats, ids, 1, cp, device),
    "sample": _sampled_tokens,
}


def decode_images(model, feats: Any, image_ids: Sequence[str], cp: Any, device: Any) -> list[list[int]]:
    """Token ids (up to <#end>) per image by ``caption.decoder`` (:data:`SUP_DECODERS`)."""
    if cp.decoder not in SUP_DECODERS:
        raise ValueError(f"caption.decoder {cp.decoder!r}: choose from {sorted(SUP_DECODERS)}")
    return SUP_DECODERS[cp.decoder](model, feats, list(image_ids), cp, device)


def run(ctx: StageContext) -> None:
    reason = skip_reason(ctx.deps["sup_vocab"])
    if reason:
        write_json(ctx.outs["captions"], [])
        ctx.log.info("caption_sup: %s", reason)
        return
    from r2m.captioning.captioner import load_checkpoint_model, words_of
    from r2m.datasets.base import split_ids
    from r2m.supervised.data import model_features

    cp = ctx.params.caption
    ids = split_ids(ctx.deps["prepared"], cp.split)
    device = ctx.runtime.torch_device()
    model, _, itos = load_checkpoint_model(ctx.deps["model"], device, ctx.deps["sup_vocab"])
    feats = model_features(ctx.deps["model"], ctx.deps["features"], model.feature_kinds)
    missing = [i for i in ids if i not in feats.row_of]
    ids = [i for i in ids if i in feats.row_of]
    if missing:
        ctx.log.warning("caption_sup: %d %s images have no features (unreadable?) and get no caption",
                        len(missing), cp.split)
    best = decode_images(model, feats, ids, cp, device)
    feats.close()
    results = [{"image_id": i, "caption": words_of(toks, itos)} for i, toks in zip(ids, best, strict=True)]
    write_json(ctx.outs["captions"], results)
    ctx.save_params(Path(ctx.outs["captions"]).parent, "captions.params.yaml")
    ctx.log.info("caption_sup: %d captions for %s (%s), e.g. %r", len(results), cp.split, ctx.model,
                 results[0]["caption"] if results else "")
