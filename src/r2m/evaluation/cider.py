"""CIDEr-D as coco-caption computes it, vectorised with numpy.

Same definition as ``pycocoevalcap.cider.cider_scorer`` (n = 1..4, sigma = 6): document frequencies
counted over the reference sets of the scored corpus, tf-idf vectors per n-gram order, clipped
cosine similarity ``sum min(h, r) * r / (|h| |r|)``, a Gaussian penalty on the difference of the
*bigram* counts (coco-caption's ``length`` counts the order-2 n-grams), mean over orders, mean over
references, times 10. Only the summation order differs, so scores agree to ~1e-12.

The n-grams of every sentence are counted once (``Counter`` over ``zip``), mapped to integer ids,
and all (hypothesis, reference) similarities come from one sorted join of flat arrays instead of a
Python loop per pair.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

N_ORDER = 4
SIGMA = 6.0


class _Ngrams:
    """Flat arrays of (sentence, n-gram id, term frequency) for a list of sentences."""

    def __init__(self) -> None:
        self.ids: dict[tuple[str, ...], int] = {}
        self.order: list[int] = []

    def count(self, sentences: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        ids, order = self.ids, self.order
        rows: list[int] = []
        gids: list[int] = []
        tfs: list[int] = []
        bigrams = np.zeros(len(sentences), dtype=np.float64)
        for s, sentence in enumerate(sentences):
            words = sentence.split()
            for k in range(1, N_ORDER + 1):
                counts = Counter(zip(*(words[i:] for i in range(k)), strict=False))
                for gram, tf in counts.items():
                    g = ids.get(gram)
                    if g is None:
                        g = ids[gram] = len(order)
                        order.append(k - 1)
                    rows.append(s)
                    gids.append(g)
                    tfs.append(tf)
            bigrams[s] = max(len(words) - 1, 0)
        return (np.asarray(rows, dtype=np.int64), np.asarray(gids, dtype=np.int64),
                np.asarray(tfs, dtype=np.float64), bigrams)


def cider_d(hypotheses: Sequence[str], references: Sequence[Sequence[str]],
            sigma: float = SIGMA) -> tuple[float, list[float]]:
    """Corpus CIDEr-D and per-image scores for tokenised ``hypotheses[i]`` against ``references[i]``."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} reference sets")
    n_img = len(hypotheses)
    if n_img == 0:
        raise ValueError("CIDEr needs at least one image")
    n_refs = np.asarray([len(r) for r in references], dtype=np.int64)
    if (n_refs == 0).any():
        raise ValueError("every image needs at least one reference")
    grams = _Ngrams()
    r_row, r_gid, r_tf, r_len = grams.count([c for refs in references for c in refs])
    h_row, h_gid, h_tf, h_len = grams.count(hypotheses)
    n_gram = len(grams.order)
    order = np.asarray(grams.order, dtype=np.int64)
    ref_img = np.repeat(np.arange(n_img, dtype=np.int64), n_refs)

    # document frequency: number of images whose reference set contains the n-gram
    img_keys = np.unique(ref_img[r_row] * n_gram + r_gid)
    df = np.bincount(img_keys % n_gram, minlength=n_gram).astype(np.float64)
    weight = np.log(float(n_img)) - np.log(np.maximum(1.0, df))

    def vectors(row, gid, tf, n_rows):
        val = tf * weight[gid]
        slot = row * N_ORDER + order[gid]
        sq = np.bincount(slot, weights=val * val, minlength=n_rows * N_ORDER).astype(np.float64)  # empty input: int
        norm = np.sqrt(sq).reshape(n_rows, N_ORDER)
        return val, norm

    r_val, r_norm = vectors(r_row, r_gid, r_tf, len(r_len))
    h_val, h_norm = vectors(h_row, h_gid, h_tf, n_img)

    # join every reference n-gram with the same n-gram of its image's hypothesis
    h_key = h_row * n_gram + h_gid
    sort = np.argsort(h_key, kind="stable")
    h_key, h_val_sorted = h_key[sort], h_val[sort]
    r_key = ref_img[r_row] * n_gram + r_gid
    pos = np.minimum(np.searchsorted(h_key, r_key), max(len(h_key) - 1, 0))
    hit = h_key[pos] == r_key if len(h_key) else np.zeros(len(r_key), dtype=bool)
    contrib = np.minimum(h_val_sorted[pos[hit]], r_val[hit]) * r_val[hit]
    n_ref_rows = len(r_len)
    sim = np.bincount(r_row[hit] * N_ORDER + order[r_gid[hit]], weights=contrib,
                      minlength=n_ref_rows * N_ORDER).astype(np.float64).reshape(n_ref_rows, N_ORDER)
    denom = h_norm[ref_img] * r_norm
    nz = denom != 0
    sim[nz] /= denom[nz]
    delta = h_len[ref_img] - r_len
    sim *= np.e ** (-(delta**2) / (2 * sigma**2))[:, None]

    per_image = np.bincount(ref_img, weights=sim.mean(axis=1), minlength=n_img) / n_refs * 10.0
    return float(np.mean(per_image)), [float(x) for x in per_image]
