"""L_rec (Eqs. 11, 13): squared L2 distance between the concept vector v and its reconstruction ṽ.

Two forms, selected by ``fidelity.rec_loss`` (see :data:`REC_LOSSES`):

* ``sum_normalized`` (the paper's ‖v − ṽ‖², ours): summed over the d dimensions, ṽ L2-normalised;
* ``mse_raw`` (the released code's ``tf.losses.mean_squared_error(v, ṽ)``): the *mean* over the d
  dimensions (and the batch) with ṽ as the reconstructor outputs it, unnormalised — about 1/d
  of the paper's weight at equal distances.

``similarity`` (``fidelity.similarity``) decides what the paper form sees: the L2-normalised ṽ
(``cosine``, ours) or the raw ṽ (``inner``, Eqs. 11 and 13 as written); the official form always
takes the raw ṽ.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor


def rec_loss(v: Tensor, v_tilde: Tensor) -> Tensor:
    """``‖v − ṽ‖²`` per example, mean over the batch. ``v``, ``v_tilde``: [B, d]."""
    return (v.float() - v_tilde.float()).pow(2).sum(-1).mean()


def rec_loss_mse(v: Tensor, v_tilde_raw: Tensor) -> Tensor:
    """Mean of ``(v − ṽ)²`` over all B·d entries (TF ``mean_squared_error`` with unit weights)."""
    return (v.float() - v_tilde_raw.float()).pow(2).mean()


# name -> (loss(v, ṽ), whether it takes the raw ṽ)
REC_LOSSES: dict[str, tuple[Callable[[Tensor, Tensor], Tensor], bool]] = {
    "sum_normalized": (rec_loss, False),
    "mse_raw": (rec_loss_mse, True),
}


def reconstruction(name: str, v: Tensor, v_tilde_raw: Tensor, similarity: str = "cosine") -> Tensor:
    """L_rec by name from the raw ṽ (normalised here for the forms that want it, unless
    ``similarity`` is ``inner``)."""
    if name not in REC_LOSSES:
        raise KeyError(f"unknown rec_loss {name!r}; known: {', '.join(REC_LOSSES)}")
    fn, raw = REC_LOSSES[name]
    return fn(v, v_tilde_raw if raw or not normalises(similarity) else F.normalize(v_tilde_raw, dim=-1))


# ``fidelity.similarity`` -> whether the paper forms L2-normalise ṽ
SIMILARITIES: dict[str, bool] = {"cosine": True, "inner": False}


def normalises(similarity: str) -> bool:
    if similarity not in SIMILARITIES:
        raise KeyError(f"unknown similarity {similarity!r}; known: {', '.join(SIMILARITIES)}")
    return SIMILARITIES[similarity]
