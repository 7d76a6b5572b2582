"""ROUGE-L as coco-caption computes it (``pycocoevalcap.rouge.Rouge``, beta = 1.2), with the longest
common subsequence found by a bit-parallel algorithm instead of a Python table.

Per image: the candidate and each reference split at single spaces (as coco-caption splits them), the
LCS length of each pair, precision ``lcs / len(candidate)`` and recall ``lcs / len(reference)``, their
maxima over the references, and the F-measure ``(1 + b²) P R / (R + b² P)`` (0 when either is 0); the
corpus score is the mean over images. The LCS length is an integer, found exactly by the bit-vector
recurrence of Allison and Dix (1986) (one bit per word of the candidate; a row of the dynamic-programming
table per reference word, in a few integer operations); the floating-point steps are coco-caption's own,
so the scores are pycocoevalcap's to the last bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BETA = 1.2


def lcs_length(masks: dict[str, int], n: int, words: Sequence[str]) -> int:
    """Length of the longest common subsequence of a sequence of ``n`` words, given as ``masks``
    (word -> bit mask of its positions), and ``words``."""
    full = (1 << n) - 1
    v = full
    for w in words:
        u = v & masks.get(w, 0)
        v = ((v + u) | (v - u)) & full
    return n - bin(v).count("1")


def _masks(words: Sequence[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i, w in enumerate(words):
        out[w] = out.get(w, 0) | (1 << i)
    return out


def rouge_l(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> tuple[float, list[float]]:
    """Corpus ROUGE-L and per-image scores of ``hypotheses[i]`` against ``references[i]``."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} reference sets")
    beta2 = BETA**2
    scores = []
    for hyp, refs in zip(hypotheses, references, strict=True):
        if not refs:
            raise ValueError("every image needs at least one reference")
        cand = hyp.split(" ")
        masks, n = _masks(cand), len(cand)
        prec, rec = [], []
        for ref in refs:
            words = ref.split(" ")
            lcs = lcs_length(masks, n, words)
            prec.append(lcs / float(n))
            rec.append(lcs / float(len(words)))
        p, r = max(prec), max(rec)
        scores.append(((1 + beta2) * p * r) / float(r + beta2 * p) if p != 0 and r != 0 else 0.0)
    return float(np.mean(np.array(scores))), scores
