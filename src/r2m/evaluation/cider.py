"""CIDEr-D as coco-caption computes it, vectorised with numpy.

Same definition as ``pycocoevalcap.cider.cider_scorer`` (n = 1..4, sigma = 6): document frequencies
counted over the reference sets of the scored corpus, tf-idf vectors per n-gram order, clipped
cosine similarity ``sum min(h, r) * r / (|h| |r|)``, a Gaussian penalty on the difference of the
*bigram* counts (coco-caption's ``length`` counts the order-2 n-grams), mean over orders, mean over
references, times 10. Every sum is taken in coco-caption's order (the hypothesis's n-grams in their
order, references in theirs), so the scores are pycocoevalcap's to the last bit.

The n-grams of every sentence are counted once with array sorts (no Python loop over n-grams), and
all (hypothesis, reference) similarities come from one sorted join of flat arrays instead of a
Python loop per pair.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

N_ORDER = 4
SIGMA = 6.0


def groups(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Distinct ``values`` by one stable sort: (distinct values ascending, each value's group number,
    the index of each group's first occurrence, each group's size)."""
    if len(values) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, empty
    sort = np.argsort(values, kind="stable")
    ordered = values[sort]
    new = np.empty(len(values), dtype=bool)
    new[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    group = np.empty(len(values), dtype=np.int64)
    group[sort] = np.cumsum(new) - 1
    starts = np.flatnonzero(new)
    return ordered[starts], group, sort[starts], np.diff(starts, append=len(values))


def count_ngrams(sentences: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The n-grams (n = 1..4) of every sentence with their term frequencies, as flat arrays
    ``(sentence, n-gram id, tf)`` in coco-caption's order (a sentence's unigrams, then its bigrams…,
    each order by first occurrence), plus each n-gram id's order - 1 and each sentence's word count.
    (BLEU's and CIDEr's ``precook`` count the same n-grams in the same order.)

    An n-gram's id comes from its (n-1)-gram prefix's id and its last word's id, made dense again at
    every order, so the keys stay small at any vocabulary size."""
    split = [s.split() for s in sentences]
    lens = np.fromiter(map(len, split), dtype=np.int64, count=len(split))
    vocab: dict[str, int] = {}
    words = np.fromiter((vocab.setdefault(w, len(vocab)) for ws in split for w in ws), dtype=np.int64,
                        count=int(lens.sum()))
    n_words = max(len(vocab), 1)
    sent = np.repeat(np.arange(len(split), dtype=np.int64), lens)
    left = np.repeat(np.cumsum(lens), lens) - np.arange(len(words), dtype=np.int64)  # words from here to the end
    rows, gids, tfs, firsts, orders, gram_order = [], [], [], [], [], []
    key, offset = words, 0
    for k in range(1, N_ORDER + 1):
        at = np.flatnonzero(left >= k)  # positions where a k-gram starts
        if k == 1:
            n_keys = n_words
        else:
            distinct, dense, _, _ = groups(key[at] * n_words + words[at + k - 1])
            key = np.full(len(words), -1, dtype=np.int64)
            key[at] = dense
            n_keys = len(distinct)
        pairs, _, first, size = groups(sent[at] * n_keys + key[at])
        rows.append(pairs // n_keys)
        gids.append(pairs % n_keys + offset)
        tfs.append(size)
        firsts.append(at[first])
        orders.append(np.full(len(pairs), k - 1, dtype=np.int64))
        gram_order.append(np.full(n_keys, k - 1, dtype=np.int64))
        offset += n_keys
    row, gid, tf, first_at, order_k = (np.concatenate(x) for x in (rows, gids, tfs, firsts, orders))
    walk = np.lexsort((first_at, order_k, row))
    return row[walk], gid[walk], tf[walk].astype(np.float64), np.concatenate(gram_order), lens


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
    ref_sentences = [c for refs in references for c in refs]
    row, gid, tf, order, n_words = count_ngrams([*ref_sentences, *hypotheses])  # one id per n-gram for both
    lengths = np.maximum(n_words - 1, 0).astype(np.float64)  # coco-caption's length: the bigram count
    n_ref_rows, n_gram = len(ref_sentences), len(order)
    is_ref = row < n_ref_rows
    r_row, r_gid, r_tf, r_len = row[is_ref], gid[is_ref], tf[is_ref], lengths[:n_ref_rows]
    h_row, h_gid, h_tf, h_len = row[~is_ref] - n_ref_rows, gid[~is_ref], tf[~is_ref], lengths[n_ref_rows:]
    ref_img = np.repeat(np.arange(n_img, dtype=np.int64), n_refs)

    # document frequency: number of images whose reference set contains the n-gram
    img_keys, _, _, _ = groups(ref_img[r_row] * n_gram + r_gid)
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
    h_key_sorted = h_key[sort]
    r_key = ref_img[r_row] * n_gram + r_gid
    pos = np.minimum(np.searchsorted(h_key_sorted, r_key), max(len(h_key) - 1, 0))
    hit = h_key_sorted[pos] == r_key if len(h_key) else np.zeros(len(r_key), dtype=bool)
    h_at = sort[pos[hit]]  # the hypothesis entry each hit joins
    r_at = np.flatnonzero(hit)
    # coco-caption sums min(h, r) * r over the hypothesis's n-grams in their order: the same order here
    # (np.bincount adds its weights one after another), so the sums are the same to the last bit
    walk = np.lexsort((h_at, r_row[r_at]))
    h_at, r_at = h_at[walk], r_at[walk]
    contrib = np.minimum(h_val[h_at], r_val[r_at]) * r_val[r_at]
    sim = np.bincount(r_row[r_at] * N_ORDER + order[r_gid[r_at]], weights=contrib,
                      minlength=n_ref_rows * N_ORDER).astype(np.float64).reshape(n_ref_rows, N_ORDER)
    h_norm_at = h_norm[ref_img]
    nz = (h_norm_at != 0) & (r_norm != 0)
    sim[nz] /= (h_norm_at * r_norm)[nz]
    delta = h_len[ref_img] - r_len
    # the Gaussian length penalty as coco-caption writes it, in Python floats, once per distinct delta
    values, which = np.unique(delta, return_inverse=True)
    penalty = np.array([np.e ** (-(float(d) ** 2) / (2 * sigma**2)) for d in values.tolist()], dtype=np.float64)
    sim *= penalty[which.reshape(-1)][:, None]

    # per order, the references' similarities summed in reference order; then coco-caption's mean of the
    # four orders (np.mean of each image's 1-d vector), / references, * 10; and the mean over images
    summed = np.stack([np.bincount(ref_img, weights=sim[:, k], minlength=n_img) for k in range(N_ORDER)], axis=1)
    per_image = np.array([np.mean(row) for row in summed], dtype=np.float64) / n_refs * 10.0
    return float(np.mean(per_image)), [float(x) for x in per_image]
