"""L_rec (Eqs. 11, 13): squared L2 distance between the concept vector v and its reconstruction ṽ."""

from __future__ import annotations

from torch import Tensor


def rec_loss(v: Tensor, v_tilde: Tensor) -> Tensor:
    """``‖v − ṽ‖²`` per example, mean over the batch. ``v``, ``v_tilde``: [B, d]."""
    return (v.float() - v_tilde.float()).pow(2).sum(-1).mean()
