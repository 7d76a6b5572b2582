"""R²M losses (paper Eqs. 10–13) as small pure functions.

- :func:`xe_loss` (Eq. 10) and its reductions :func:`reduce_xe` — ``xe.py``
- :func:`rec_loss` (L_rec^S / L_rec^I) and :func:`rec_loss_mse` (official) — ``reconstruction.py``
- :func:`triplet_hardest` (L_M^I, Eq. 12) and :func:`rank_loss_official` — ``ranking.py``
- :func:`loss_s` (Eq. 11), :func:`loss_i` (Eq. 13) — ``objectives.py``
"""

from r2m.losses.objectives import loss_i, loss_s
from r2m.losses.ranking import RANK_LOSSES, rank_loss_official, ranking, triplet_hardest
from r2m.losses.reconstruction import REC_LOSSES, SIMILARITIES, rec_loss, rec_loss_mse, reconstruction
from r2m.losses.xe import XE_REDUCTIONS, linear_xe_loss, reduce_xe, xe_loss

__all__ = ["RANK_LOSSES", "REC_LOSSES", "SIMILARITIES", "XE_REDUCTIONS", "linear_xe_loss", "loss_i", "loss_s",
           "rank_loss_official", "ranking", "rec_loss", "rec_loss_mse", "reconstruction", "reduce_xe",
           "triplet_hardest", "xe_loss"]
