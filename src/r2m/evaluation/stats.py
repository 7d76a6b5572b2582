"""The names of the per-image sufficient statistics: what :mod:`r2m.evaluation.coco`'s BLEU and METEOR scorers
return per image and :mod:`r2m.evaluation.bootstrap` recomputes the corpus metric of any multiset of images from.

A module of their own, importing nothing: the tables and figures, which read the statistics (``bootstrap``),
do not load the scorers that compute them.
"""

from __future__ import annotations

# BLEU's per-image statistics (coco-caption's ``closest`` reference length) and METEOR's 23 numbers
BLEU_STATS = ("bleu_testlen", "bleu_reflen", *(f"bleu_guess_{n}" for n in range(1, 5)),
              *(f"bleu_correct_{n}" for n in range(1, 5)))
METEOR_N_STATS = 23
METEOR_STATS = tuple(f"meteor_{k:02d}" for k in range(METEOR_N_STATS))
