"""BLEU-1..4 as coco-caption computes it (``pycocoevalcap.bleu.bleu_scorer``, ``closest`` reference
length), with the n-gram counting done by array sorts.

Each image's statistics are integers: the hypothesis length, the reference length closest to it (the
shorter on a tie), and per order n the hypothesis's n-gram count (``guess``) and its n-grams clipped
by their largest count in any one reference (``correct``). They come from
:func:`r2m.evaluation.cider.count_ngrams` instead of a dictionary per sentence; the scores are then
computed from them with coco-caption's own formulas, one image at a time in Python floats, so they are
pycocoevalcap's to the last bit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from r2m.evaluation.cider import count_ngrams, groups

N_ORDER = 4
SMALL, TINY = 1e-9, 1e-15  # coco-caption's guards against 0/0


def bleu_stats(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> np.ndarray:
    """Per image: ``[testlen, reflen, guess_1..4, correct_1..4]`` (integers, shape ``(n, 10)``)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} reference sets")
    n_img = len(hypotheses)
    n_refs = np.asarray([len(r) for r in references], dtype=np.int64)
    if (n_refs == 0).any():
        raise ValueError("every image needs at least one reference")
    ref_sentences = [c for refs in references for c in refs]
    n_ref_rows = len(ref_sentences)
    row, gid, tf, order, n_words = count_ngrams([*ref_sentences, *hypotheses])
    n_gram = max(len(order), 1)
    tf = tf.astype(np.int64)
    ref_img = np.repeat(np.arange(n_img, dtype=np.int64), n_refs)
    is_ref = row < n_ref_rows

    # each (image, n-gram)'s largest count in one reference
    r_key = ref_img[row[is_ref]] * n_gram + gid[is_ref]
    keys, group, _, _ = groups(r_key)
    most = np.zeros(len(keys), dtype=np.int64)
    np.maximum.at(most, group, tf[is_ref])

    h_row = row[~is_ref] - n_ref_rows
    h_key = h_row * n_gram + gid[~is_ref]
    pos = np.minimum(np.searchsorted(keys, h_key), max(len(keys) - 1, 0))
    found = keys[pos] == h_key if len(keys) else np.zeros(len(h_key), dtype=bool)
    clipped = np.where(found, np.minimum(tf[~is_ref], most[pos] if len(keys) else 0), 0)
    correct = np.bincount(h_row * N_ORDER + order[gid[~is_ref]], weights=clipped,
                          minlength=n_img * N_ORDER).reshape(n_img, N_ORDER)

    testlen = n_words[n_ref_rows:]
    guess = np.maximum(testlen[:, None] - np.arange(N_ORDER)[None, :], 0)
    # closest reference length: the smallest (|l - testlen|, l)
    reflen = n_words[:n_ref_rows]
    span = int(reflen.max(initial=0)) + 1
    dist = np.abs(reflen - testlen[ref_img]) * span + reflen
    firsts = np.cumsum(n_refs) - n_refs
    closest = np.minimum.reduceat(dist, firsts) % span
    return np.column_stack([testlen, closest, guess, correct.astype(np.int64)]).astype(np.int64)


def _scores(testlen: int, reflen: int, guess: Sequence[int], correct: Sequence[int]) -> list[float]:
    """coco-caption's BLEU-1..4 of one set of statistics (one image's, or the corpus's sums)."""
    out, bleu = [], 1.0
    for k in range(N_ORDER):
        bleu *= (float(correct[k]) + TINY) / (float(guess[k]) + SMALL)
        out.append(bleu ** (1.0 / (k + 1)))
    ratio = (testlen + TINY) / (reflen + SMALL)
    if ratio < 1:
        out = [b * math.exp(1 - 1 / ratio) for b in out]
    return out


def bleu(hypotheses: Sequence[str], references: Sequence[Sequence[str]]
         ) -> tuple[list[float], list[list[float]], np.ndarray]:
    """Corpus BLEU-1..4, per-image BLEU-1..4 (``[order][image]``) and :func:`bleu_stats`."""
    stats = bleu_stats(hypotheses, references)
    rows = stats.tolist()  # Python ints: the formulas run on the same numbers as coco-caption's
    each = [_scores(r[0], r[1], r[2:6], r[6:10]) for r in rows]
    total = [sum(col) for col in zip(*rows, strict=True)] if rows else [0] * 10
    corpus = _scores(total[0], total[1], total[2:6], total[6:10])
    return corpus, [list(x) for x in zip(*each, strict=True)], stats
