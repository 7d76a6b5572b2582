"""The stage objectives: L_S (Eq. 11) and L_I (Eq. 13). Each returns ``(total, components)``."""

from __future__ import annotations

from torch import Tensor

from r2m.losses.ranking import triplet_hardest
from r2m.losses.reconstruction import rec_loss


def loss_s(xe: Tensor, v: Tensor, v_tilde: Tensor, beta: float) -> tuple[Tensor, dict[str, Tensor]]:
    """L_S = L_XE + β · ‖v^S − ṽ^S‖², from L_XE computed by :func:`xe_loss` or :func:`linear_xe_loss`."""
    rec = rec_loss(v, v_tilde)
    return xe + beta * rec, {"xe": xe, "rec": rec}


def loss_i(img: Tensor, v: Tensor, v_tilde: Tensor, gamma: float,
           margin: float = 0.2) -> tuple[Tensor, dict[str, Tensor]]:
    """L_I = L_M^I(v̂^I, ṽ^I) + γ · ‖v^I − ṽ^I‖² (γ = 0 gives the stage-3 objective L_M^I)."""
    rank, rec = triplet_hardest(img, v_tilde, margin), rec_loss(v, v_tilde)
    return rank + gamma * rec, {"rank": rank, "rec": rec}
