"""The sampling decoder next to greedy and beam (m-RNN generates captions by sampling
each word from P(w_n | w_1:n-1, I), seeds 001/003) — ``caption.decoder: sample`` with
``temperature`` and ``seed`` for the supervised baselines' ``caption_sup``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from r2m import params as P
from r2m.captioning.beam import beam_search, sample_search
from r2m.captioning.captioner import BANNED
from r2m.models.catalog import build_sup_model
from r2m.supervised.caption import SUP_DECODERS, decode_images
from r2m.text.vocab import PAD, START, UNK

VOCAB = 40


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = build_sup_model("mrnn", {"embed1": 16, "embed2": 16, "recurrent": 16, "multimodal": 32, "dropout": 0.0},
                        VOCAB, {"pooled": (12,)}).eval()
    with torch.no_grad():  # a peaked vocabulary: sampled captions differ from greedy only when hot
        for p in m.parameters():
            p.mul_(3.0)
    return m


@pytest.fixture(scope="module")
def v(model):
    torch.manual_seed(1)
    return model.encode({"pooled": torch.randn(16, 12)})


def _rows(res) -> list[list[int]]:
    return [row[: int(n)] for row, n in zip(res["tokens"][:, 0].tolist(), res["lengths"][:, 0].tolist(), strict=True)]


def test_temperature_to_zero_is_greedy(model, v) -> None:
    greedy = _rows(beam_search(model, v, beam=1, max_len=12, banned=BANNED))
    assert _rows(sample_search(model, v, max_len=12, banned=BANNED, temperature=0.0)) == greedy
    gen = torch.Generator().manual_seed(3)
    assert _rows(sample_search(model, v, max_len=12, banned=BANNED, temperature=1e-4, generator=gen)) == greedy


def test_a_fixed_seed_is_reproducible_and_a_high_temperature_differs(model, v) -> None:
    def sample(seed: int, t: float) -> list[list[int]]:
        return _rows(sample_search(model, v, max_len=12, banned=BANNED, temperature=t,
                                   generator=torch.Generator().manual_seed(seed)))

    assert sample(7, 1.0) == sample(7, 1.0)
    assert sample(7, 5.0) == sample(7, 5.0)
    greedy = _rows(beam_search(model, v, beam=1, max_len=12, banned=BANNED))
    hot = sample(7, 5.0)
    assert sum(a != b for a, b in zip(hot, greedy, strict=True)) >= len(greedy) // 2
    assert hot != sample(8, 5.0)
    flat = [t for row in hot for t in row]
    assert not set(flat) & {PAD, START, UNK}  # never drawn


def test_sample_scores_are_the_captions_log_probability(model, v) -> None:
    res = sample_search(model, v[:2], max_len=6, banned=BANNED, temperature=1.0,
                        generator=torch.Generator().manual_seed(0))
    for b, row in enumerate(_rows(res)):
        state, prev, total = model.decode_init(v[b: b + 1].detach()), torch.tensor([START]), 0.0
        for tok in row:
            h, state, _, _ = model.decode_step(state, prev)
            logits = model.logits(h).float()
            logits[:, list(BANNED)] = float("-inf")
            total += float(torch.log_softmax(logits, -1)[0, tok].detach())
            prev = torch.tensor([tok])
        assert res["scores"][b, 0].item() == pytest.approx(total, abs=1e-4)


class _Feats:
    def __init__(self, x: torch.Tensor) -> None:
        self.x = x
        self.row_of = {str(i): i for i in range(len(x))}

    def get(self, rows: np.ndarray) -> dict[str, torch.Tensor]:
        return {"pooled": self.x[torch.from_numpy(rows)]}


def test_caption_decoder_setting(model) -> None:
    assert set(SUP_DECODERS) == {"beam", "greedy", "sample"}
    torch.manual_seed(1)
    feats = _Feats(torch.randn(10, 12))
    ids = list(feats.row_of)

    def cp(**kw):
        return P.CaptionParams(max_len=12, batch_size=4, **kw)

    assert P.CaptionParams().decoder == "beam"  # the default run is unchanged
    greedy = decode_images(model, feats, ids, cp(decoder="greedy"), "cpu")
    assert decode_images(model, feats, ids, cp(decoder="sample", temperature=0.0), "cpu") == greedy
    a = decode_images(model, feats, ids, cp(decoder="sample", temperature=3.0, seed=5), "cpu")
    assert a == decode_images(model, feats, ids, cp(decoder="sample", temperature=3.0, seed=5), "cpu")
    assert a != greedy
    with pytest.raises(ValueError):
        P.CaptionParams(decoder="nucleus")
    with pytest.raises(ValueError, match="temperature"):
        sample_search(model, torch.zeros(1, 32), temperature=-1.0)
