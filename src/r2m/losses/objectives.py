"""The stage objectives: L_S (Eq. 11) and L_I (Eq. 13). Each returns ``(total, components)``.

``v_tilde`` is the reconstruction as the model's ``v_tilde_raw`` gives it (unnormalised); each loss
form normalises it or not (``rec`` / ``rank`` name the forms, see ``fidelity.rec_loss`` /
``fidelity.rank_loss``). The defaults are the paper's forms.
"""

from __future__ import annotations

from torch import Tensor

from r2m.losses.reconstruction import reconstruction


def loss_s(xe: Tensor, v: Tensor, v_tilde: Tensor, beta: float,
           rec: str = "sum_normalized", similarity: str = "cosine") -> tuple[Tensor, dict[str, Tensor]]:
    """L_S = L_XE + β · L_rec(v^S, ṽ^S), from L_XE computed by :func:`xe_loss` or :func:`linear_xe_loss`."""
    r = reconstruction(rec, v, v_tilde, similarity)
    return xe + beta * r, {"xe": xe, "rec": r}


def loss_i(img: Tensor, v: Tensor, v_tilde: Tensor, gamma: float, margin: float = 0.2,
           rec: str = "sum_normalized", rank: str = "vsepp",
           similarity: str = "cosine") -> tuple[Tensor, dict[str, Tensor]]:
    """L_I = L_M^I(v̂^I, ṽ^I) + γ · L_rec(v^I, ṽ^I) (γ = 0 gives the stage-3 objective L_M^I)."""
    from r2m.losses.ranking import ranking  # here: the text stages (L_S) never load the ranking loss

    m, r = ranking(rank, img, v_tilde, margin, similarity), reconstruction(rec, v, v_tilde, similarity)
    return m + gamma * r, {"rank": m, "rec": r}
