"""L_M^I (Eq. 12): hinge triplet ranking between image vectors v̂^I and reconstructions ṽ^I.

Two forms, selected by ``fidelity.rank_loss`` (see :data:`RANK_LOSSES`):

* ``vsepp`` (the paper, ours): VSE++ "max violation" with the hardest in-batch negatives, the
  positive pair masked out, on the L2-normalised ṽ;
* ``official`` (the released code's ``crit``): the same hinge terms but no diagonal mask and the
  reduction axes swapped, on the raw ṽ (see :func:`rank_loss_official`).

``similarity`` (``fidelity.similarity``): ``cosine`` (ours) gives ``vsepp`` the L2-normalised ṽ,
``inner`` the raw ṽ (Eq. 12's inner product as written).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from r2m.losses.reconstruction import normalises


def triplet_hardest(img: Tensor, cap: Tensor, margin: float = 0.2) -> Tensor:
    """Hardest-negative triplet loss between matched rows of ``img`` (v̂^I) and ``cap`` (ṽ^I), [B, d].

    ``S = img @ cap.T`` (inner product). For pair i:
    ``[m − S_ii + max_{j≠i} S_ji]_+`` (hardest image for caption i) +
    ``[m − S_ii + max_{j≠i} S_ij]_+`` (hardest caption for image i); mean over the batch.
    A batch of one has no negatives and gives 0.
    """
    s = img.float() @ cap.float().t()
    B = s.shape[0]
    if B < 2:
        return s.sum() * 0.0
    pos = s.diagonal()
    off = s.masked_fill(torch.eye(B, dtype=torch.bool, device=s.device), float("-inf"))
    hardest_img = off.max(dim=0).values  # over images j for caption i (column i)
    hardest_cap = off.max(dim=1).values  # over captions j for image i (row i)
    return ((margin - pos + hardest_img).clamp(min=0) + (margin - pos + hardest_cap).clamp(min=0)).mean()


def rank_loss_official(img: Tensor, cap: Tensor, margin: float = 0.2) -> Tensor:
    """The released code's ranking loss, read from its ``crit(im, s)``.

    ``S = img @ cap.T``; ``a_ij = [m + S_ij − S_ii]_+`` and ``b_ij = [m + S_ij − S_jj]_+``
    (no entry masked, so the diagonal contributes ``m`` to both); ``a`` is reduced by a max over
    the *rows* i and ``b`` over the *columns* j (VSE++ does the opposite), then
    ``mean_k(max_i a_ik + max_j b_kj)``. Every term is ≥ m, so the loss never reaches 0.
    """
    s = img.float() @ cap.float().t()
    diag = s.diagonal()
    cost_s = (margin + s - diag.unsqueeze(1)).clamp(min=0)  # row i minus S_ii
    cost_im = (margin + s - diag.unsqueeze(0)).clamp(min=0)  # column j minus S_jj
    return (cost_s.max(dim=0).values + cost_im.max(dim=1).values).mean()


# name -> (loss(img, ṽ, margin), whether it takes the raw ṽ)
RANK_LOSSES: dict[str, tuple[Callable[[Tensor, Tensor, float], Tensor], bool]] = {
    "vsepp": (triplet_hardest, False),
    "official": (rank_loss_official, True),
}


def ranking(name: str, img: Tensor, v_tilde_raw: Tensor, margin: float = 0.2, similarity: str = "cosine") -> Tensor:
    """L_M^I by name from the raw ṽ (normalised here for the forms that want it, unless
    ``similarity`` is ``inner``)."""
    if name not in RANK_LOSSES:
        raise KeyError(f"unknown rank_loss {name!r}; known: {', '.join(RANK_LOSSES)}")
    fn, raw = RANK_LOSSES[name]
    return fn(img, v_tilde_raw if raw or not normalises(similarity) else F.normalize(v_tilde_raw, dim=-1), margin)
