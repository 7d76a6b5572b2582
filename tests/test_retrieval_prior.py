"""m-RNN's sentence-retrieval normalisation P(D) = Σ_{I'} P(D | I') P(I') over sampled
images I′ (seed 003): ``retrieval.prior_images`` training images drawn with ``retrieval.seed`` —
the prior is computed over exactly those images, and the draw is reproducible."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from r2m import params as P
from r2m.supervised.retrieval import log_prior, prior_image_ids, retrieval_scores, sampled_prior


def test_the_default_samples_training_images() -> None:
    rp = P.RetrievalParams()
    assert rp.prior_images == 1000 and rp.seed == 0
    assert P.RetrievalParams(prior_images=0).prior_images == 0  # the split's own images, as an explicit option


def test_prior_image_ids_are_reproducible_subsets() -> None:
    pool = [f"img{i}" for i in range(50)]
    a = prior_image_ids(pool, 10, seed=3)
    assert a == prior_image_ids(pool, 10, seed=3)
    assert len(a) == len(set(a)) == 10 and set(a) <= set(pool)
    assert a == sorted(a, key=pool.index)  # pool order
    assert a != prior_image_ids(pool, 10, seed=4)
    assert prior_image_ids(pool, 500, seed=0) == pool  # more than the pool: all of it
    with pytest.raises(ValueError):
        prior_image_ids(pool, 0, seed=0)


class _Model:
    """log P(sentence s | image) = -(feature value) * (s + 1): known by hand."""

    def encode(self, f):
        return f["pooled"]

    def score_block(self, v, inputs, targets, lengths):
        return -(v[:, :1] * torch.arange(1, inputs.shape[0] + 1, dtype=v.dtype))


class _Feats:
    def __init__(self, values: dict[str, float]) -> None:
        self.ids = list(values)
        self.row_of = {i: k for k, i in enumerate(self.ids)}
        self.x = torch.tensor([[values[i]] for i in self.ids], dtype=torch.float64)

    def get(self, rows):
        return {"pooled": self.x[torch.from_numpy(np.asarray(rows))]}


def test_the_prior_is_the_mean_over_exactly_the_sampled_images() -> None:
    train = {"t0": 0.5, "t1": 1.0, "t2": 2.0, "t3": 4.0, "t4": 8.0}
    feats = _Feats({**train, "q0": 0.1, "q1": 0.3})
    S = 3
    inputs = torch.zeros(S, 4, dtype=torch.long)
    pool = list(train) + ["no_features"]
    ids, prior = sampled_prior(_Model(), feats, pool, 2, 11, inputs, inputs, torch.ones(S), block=1, device="cpu")
    assert ids == prior_image_ids(list(train), 2, 11) and len(ids) == 2
    ids2, prior2 = sampled_prior(_Model(), feats, pool, 2, 11, inputs, inputs, torch.ones(S), block=1, device="cpu")
    assert ids2 == ids and np.array_equal(prior, prior2)
    # by hand: log P(s) = log ((exp(-a (s+1)) + exp(-b (s+1))) / 2) for the two sampled values a, b
    a, b = (train[i] for i in ids)
    hand = np.array([np.log((np.exp(-a * (s + 1)) + np.exp(-b * (s + 1))) / 2) for s in range(S)])
    np.testing.assert_allclose(log_prior(prior), hand, rtol=1e-12)
    # the sentence scores are normalised by that prior, not by the queried images
    logp = np.array([[-0.1 * (s + 1) for s in range(S)], [-0.3 * (s + 1) for s in range(S)]])
    res_sampled = retrieval_scores(logp, np.array([0, 1, 1]), prior)
    norm = logp - hand[None, :]
    ranks = 1 + ((norm >= np.where([[1, 0, 0], [0, 1, 1]], norm, -np.inf).max(1, keepdims=True))
                 & ~np.array([[1, 0, 0], [0, 1, 1]], dtype=bool)).sum(1)
    assert res_sampled["sentence_retrieval"]["R@1"] == pytest.approx(100.0 * np.mean(ranks <= 1))
