"""R²M losses (paper Eqs. 10–13) as small pure functions.

- :func:`xe_loss` (Eq. 10) and its reductions :func:`reduce_xe` — ``xe.py``
- :func:`rec_loss` (L_rec^S / L_rec^I) and :func:`rec_loss_mse` (official) — ``reconstruction.py``
- :func:`triplet_hardest` (L_M^I, Eq. 12) and :func:`rank_loss_official` — ``ranking.py``
- :func:`loss_s` (Eq. 11), :func:`loss_i` (Eq. 13) — ``objectives.py``

Import each from its module: this package imports none of them (a stage that trains with one loss does not
load the others, so editing one reruns only its readers).
"""
