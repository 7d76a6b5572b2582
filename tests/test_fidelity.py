"""The ``fidelity`` switch: each item, paper vs official, checked against its definition.

The official forms are read from the authors' released code (songpipi/R2M, UC-GAN's preprocessing);
each test would fail if the item behaved the other way.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
import torch.nn.functional as F

from r2m import params as P
from r2m.captioning.beam import beam_search, beam_search_im2txt
from r2m.losses.ranking import rank_loss_official, ranking, triplet_hardest
from r2m.losses.reconstruction import reconstruction
from r2m.models.r2m import R2M, R2MConfig
from r2m.text.corpus import FilterConfig, drop_reason
from r2m.text.dictionary import image_concepts, load_dictionary
from r2m.text.stages import encode_batch, singular_targets
from r2m.text.tokenize import tokenize
from r2m.text.tokenize_official import tokenize_keep_punct
from r2m.text.vocab import END, PAD, START, UNK, build_vocab, read_word_list, unk_ratio

torch.set_num_threads(1)


# --------------------------------------------------------------------------- params
def _raw(**catalog_extra):
    return {"datasets": ["a"], "catalog": {"a": {"kind": "demo", **catalog_extra},
                                           "b": {"kind": "coco_shutterstock"}}}


def test_profiles_resolve_every_item_and_benchmarks_default_to_official() -> None:
    p = P.validate(_raw())
    a, b = P.for_dataset(p, "a"), P.for_dataset(p, "b")
    for key, (paper, official) in P.PROFILES.items():
        section, item = key.split(".")
        assert getattr(getattr(a, section), item) == paper, key
        assert getattr(getattr(b, section), item) == official, key
    # an explicit profile and a pinned item
    raw = _raw(fidelity="official", overrides={"fidelity": {"rank_loss": "vsepp"}})
    a = P.for_dataset(P.validate(raw), "a")
    assert a.fidelity.rank_loss == "vsepp" and a.fidelity.rec_loss == "mse_raw" and a.model.image_proj == "frozen_random"
    raw["fidelity"] = {"init": "pytorch"}
    assert P.for_dataset(P.validate(raw), "a").fidelity.init == "pytorch"
    with pytest.raises(P.ParamsError, match="fidelity"):
        P.validate({**_raw(), "fidelity": {"rank_loss": "nope"}})


def test_stage_params_carry_resolved_items_and_not_the_profile_name() -> None:
    from r2m.stage.registry import STAGES

    stages = {s.name: s for s in STAGES}
    p = P.validate(_raw(fidelity="official"))
    data = stages["build_vocab"].resolved(p, {"dataset": "a"})
    assert data["fidelity"] == {"vocab_counts": "all", "vocab_filter": "glove", "singularise_targets": True,
                                "count_specials": True, "plurals": "official"}
    # train_i reads its catalog entry (gamma) but not the profile's name, only the resolved items
    ti = stages["train_i"].resolved(p, {"dataset": "a", "variant": "r2m", "seed": str(0)})
    assert ti["fidelity"]["rank_loss"] == "official" and "fidelity" not in ti["catalog"]
    tm = stages["train_m"].resolved(p, {"dataset": "a", "variant": "r2m", "seed": str(0)})
    assert tm["fidelity"]["rank_loss"] == "official" and "catalog" not in tm


# --------------------------------------------------------------------------- initialisation
@torch.no_grad()
def test_official_init_ranges_and_forget_bias() -> None:
    torch.manual_seed(0)
    d, V = 32, 200
    off = R2M(R2MConfig.for_variant("dr_lstm", vocab_size=V, d=d, d_k=16, init="official"))
    ours = R2M(R2MConfig.for_variant("dr_lstm", vocab_size=V, d=d, d_k=16, init="pytorch"))
    w = off.embed.weight[1:]
    assert w.abs().max() <= 0.08 and w.std().item() == pytest.approx(0.08 / math.sqrt(3), rel=0.1)
    assert off.out.weight.abs().max() <= 0.08
    assert ours.embed.weight.std().item() == pytest.approx(1.0, rel=0.1)  # PyTorch N(0, 1)
    b_ih, b_hh = off.encoder.bias_ih_l0, off.encoder.bias_hh_l0
    assert torch.equal(b_ih[d: 2 * d], torch.ones(d)) and b_ih[:d].abs().sum() == 0 and b_ih[2 * d:].abs().sum() == 0
    assert b_hh.abs().sum() == 0
    assert not torch.equal(ours.encoder.bias_ih_l0[d: 2 * d], torch.ones(d))
    lstm = off.decoder.ih.bias  # the LSTM ablation cell
    assert torch.equal(lstm[d: 2 * d], torch.ones(d)) and lstm[:d].abs().sum() == 0


# --------------------------------------------------------------------------- L_rec
def test_rec_loss_forms() -> None:
    torch.manual_seed(1)
    v = F.normalize(torch.randn(4, 8), dim=-1)
    raw = 3.0 * v  # same direction, 3x the norm
    assert reconstruction("sum_normalized", v, raw).item() == pytest.approx(0.0, abs=1e-6)
    # official: TF mean_squared_error = mean over all B*d entries of the raw difference
    assert reconstruction("mse_raw", v, raw).item() == pytest.approx(((2 * v) ** 2).mean().item(), rel=1e-6)
    assert reconstruction("mse_raw", v, raw).item() == pytest.approx(4.0 / 8, rel=1e-5)
    other = torch.randn(4, 8)
    want = ((v - F.normalize(other, dim=-1)) ** 2).sum(-1).mean()
    assert reconstruction("sum_normalized", v, other).item() == pytest.approx(want.item(), rel=1e-6)


# --------------------------------------------------------------------------- L_M
def _crit_transcribed(im: np.ndarray, s: np.ndarray, margin: float = 0.2) -> float:
    """The authors' crit(im, s) written out element by element."""
    B = im.shape[0]
    scores = im @ s.T
    cost_s = np.zeros((B, B))
    cost_im = np.zeros((B, B))
    for i in range(B):
        for j in range(B):
            cost_s[i, j] = min(max(margin + scores[i, j] - scores[i, i], 0.0), 10000.0)  # d1 = diag per row
            cost_im[i, j] = min(max(margin + scores[i, j] - scores[j, j], 0.0), 10000.0)  # d2 = diag per column
    loss_m = cost_s.max(axis=0) + cost_im.max(axis=1)
    return float(loss_m.mean())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_official_rank_loss_equals_the_authors_formula(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    img = F.normalize(torch.randn(6, 8, generator=g), dim=-1)
    raw = 2.5 * torch.randn(6, 8, generator=g)  # unnormalised, as the official code feeds it
    got = ranking("official", img, raw, 0.2).item()
    assert got == pytest.approx(_crit_transcribed(img.numpy(), raw.numpy(), 0.2), rel=1e-5)
    assert got == pytest.approx(rank_loss_official(img, raw).item())
    assert got >= 2 * 0.2 - 1e-6  # the unmasked diagonal: every term is at least the margin
    # the paper's form masks the diagonal and normalises v~: a different value
    paper = ranking("vsepp", img, raw, 0.2).item()
    assert paper == pytest.approx(triplet_hardest(img, F.normalize(raw, dim=-1)).item())
    assert abs(paper - got) > 1e-3
    e = torch.eye(4)
    assert ranking("vsepp", e, e).item() == 0.0 and ranking("official", e, e).item() == pytest.approx(0.4)


# --------------------------------------------------------------------------- dropout
def test_dropout_scope() -> None:
    torch.manual_seed(0)
    h = torch.randn(5, 16)
    ours = R2M(R2MConfig(vocab_size=30, d=16, d_k=8, dropout=0.5, dropout_scope="encoder_output")).train()
    off = R2M(R2MConfig(vocab_size=30, d=16, d_k=8, dropout=0.5, dropout_scope="encoder")).train()
    assert not torch.equal(ours.logits(h), ours.logits(h))  # stochastic before W_d
    assert torch.equal(off.logits(h), off.logits(h))  # none in the decoder
    c, cl = torch.tensor([[4, 5, 6]]), torch.tensor([3])
    assert not torch.equal(off.encode(c, cl), off.encode(c, cl))  # the encoder still drops
    lstm = R2M(R2MConfig.for_variant("d_lstm", vocab_size=30, d=16, d_k=8, dropout=0.5, dropout_scope="encoder"))
    assert isinstance(lstm.decoder.io_drop, torch.nn.Dropout)  # DropoutWrapper on the ablation LSTM
    assert isinstance(ours.decoder, type(off.decoder))


# --------------------------------------------------------------------------- image concepts
def test_image_concept_orders() -> None:
    d = load_dictionary("openimages")
    rank = d.word_rank
    words = sorted(rank, key=rank.get)[:7]  # 7 concepts in class-id order
    scores = [0.31, 0.9, 0.5, 0.8, 0.35, 0.95, 0.4]
    df = pd.DataFrame({"image_id": ["x"] * 8, "concept": [*words, words[1]], "score": [*scores, 0.2]})
    by_score = [c for c, _ in image_concepts(df, 0.3, 5, d, "by_score")["x"]]
    train = [c for c, _ in image_concepts(df, 0.3, 5, d, "official_train")["x"]]
    test = [c for c, _ in image_concepts(df, 0.3, 5, d, "official_test")["x"]]
    assert by_score == [words[i] for i in (5, 1, 3, 2, 6)]
    assert train == words[2:7]  # np.unique order, the last 5
    assert test == words[:5][::-1]  # [::-1][-5:]: the lowest ids, descending
    with pytest.raises(ValueError, match="order"):
        image_concepts(df, 0.3, 5, d, "shuffled")


# --------------------------------------------------------------------------- decoding
class _Fixed(torch.nn.Module):
    """A decoder whose next-word distribution depends only on the previous word (a table)."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table

    def decode_init(self, v):
        return (v,)

    def decode_step(self, state, prev):
        return self.table[prev], state, None, None

    def logits(self, h):
        return h


def _im2txt_reference(table: torch.Tensor, k: int, max_len: int, banned) -> list[int]:
    """im2txt's caption_generator, one example, written from its description (two TopN pools)."""
    lp = torch.log_softmax(table, -1).clone()
    lp[:, list(banned)] = float("-inf")
    partial = [([START], 0.0)]
    complete: list[tuple[list[int], float]] = []
    for _ in range(max_len - 1):
        nxt = []
        for sent, score in partial:
            top = torch.topk(lp[sent[-1]], k)
            for p, w in zip(top.values.tolist(), top.indices.tolist(), strict=True):
                cand = (sent + [w], score + p)
                (complete if w == END else nxt).append(cand)
        complete = sorted(complete, key=lambda c: -c[1])[:k]
        partial = sorted(nxt, key=lambda c: -c[1])[:k]
    best = complete[0][0] if complete else sorted(partial, key=lambda c: -c[1])[0][0]
    return best[1:-1]


@pytest.mark.parametrize("seed", range(4))
def test_official_decoding_matches_im2txt(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    V = 9
    table = torch.randn(V, V, generator=g) * 2
    table[:, END] += 0.5
    m = _Fixed(table)
    out = beam_search_im2txt(m, torch.zeros(1, 4), beam=3, max_len=7, banned=(PAD, START))
    n = int(out["lengths"][0, 0])
    got = [t for t in out["tokens"][0, 0, :n].tolist() if t != END]
    assert got == _im2txt_reference(table, 3, 7, (PAD, START))


def test_official_decoding_steps_and_unk() -> None:
    V = 8
    table = torch.zeros(V, V)
    table[:, UNK] = 5.0  # the model loves <UNK> and never ends
    m = _Fixed(table)
    paper = beam_search(m, torch.zeros(1, 4), beam=3, max_len=6, banned=(PAD, START, UNK))
    off = beam_search_im2txt(m, torch.zeros(1, 4), beam=3, max_len=6, banned=(PAD, START))
    assert UNK not in paper["tokens"][0, 0].tolist() and paper["tokens"].shape[-1] == 6
    # 5 steps, no caption finished: the best live one without its last word (4 tokens), <UNK> allowed
    assert off["tokens"][0, 0, :4].tolist() == [UNK] * 4 and int(off["lengths"][0, 0]) == 4


# --------------------------------------------------------------------------- text
def test_official_tokens_keep_punctuation_and_singularise_targets() -> None:
    s = "Two dogs, playing with balls on the beach."
    assert tokenize(s) == ["two", "dogs", "playing", "with", "balls", "on", "the", "beach"]
    toks = tokenize_keep_punct(s)
    assert toks == ["two", "dogs", ",", "playing", "with", "balls", "on", "the", "beach", "."]
    d = load_dictionary("openimages")
    assert "dog" in d.words and "ball" in d.words
    assert singular_targets(toks, d) == ["two", "dog", ",", "playing", "with", "ball", "on", "the", "beach", "."]
    # encoding: the official path singularises, the paper path keeps the plural
    vocab = build_vocab(Counter(toks), 1, ["dog", "ball"])
    batch = pa.RecordBatch.from_pydict({"tokens": [" ".join(toks)], "concepts": ["ball dog"], "split": ["train"]})
    off = encode_batch(batch, vocab, 1.0, Counter(), d).column("ids").to_pylist()[0]
    ours = encode_batch(batch, vocab, 1.0, Counter()).column("ids").to_pylist()[0]
    assert vocab.itos[off[1]] == "dog" and vocab.itos[ours[1]] == "dogs"


def test_lengths_and_unk_ratio_count_specials() -> None:
    toks = ["a", "man", "rides", "a", "horse", "on", "a", "beach"]  # 8 tokens, 10 with <S> and </S>
    assert drop_reason(toks, ["horse"], FilterConfig(min_tokens=10, count_specials=True)) is None
    assert drop_reason(toks, ["horse"], FilterConfig(min_tokens=10, count_specials=False)) == "too_short"
    ids = [5, 6, UNK, 7, 8, 9]  # 1 UNK in 6, 8 counting <S>, </S>
    assert unk_ratio(ids) > 0.15 and unk_ratio(ids, extra=2) <= 0.15


def test_vocab_filter_word_list(tmp_path) -> None:
    path = tmp_path / "words.txt"
    path.write_text("the\nman\nhorse 0.1 0.2\n\n", encoding="utf-8")  # a GloVe-style line works too
    allowed = read_word_list(path)
    assert allowed == {"the", "man", "horse"}
    counts = Counter({"the": 50, "man": 45, "xqzt": 60, "horse": 3})
    v = build_vocab(counts, 40, ["horse", "dog"], allowed)
    assert v.itos[4:] == ["the", "man", "dog", "horse"]  # xqzt: frequent but not in the list; dictionary kept
    assert "xqzt" in build_vocab(counts, 40, ["horse"]).itos
    with pytest.raises(FileNotFoundError, match="vocab_filter"):
        read_word_list(tmp_path / "missing.txt")


# --------------------------------------------------------------------------- r2m datasets check
def test_datasets_check_reports_filters_and_paper_vocab(tmp_path) -> None:
    import json

    from r2m.datasets.check import report

    (tmp_path / "c").mkdir()
    (tmp_path / "v").mkdir()
    (tmp_path / "c" / "stats.json").write_text(json.dumps({
        "read": {"lines": 1000}, "sentences_in": 990, "dropped": {"too_short": 90, "no_concept": 100},
        "length_ok": 900,
        "tokenizer": "official", "count_specials": True}))
    (tmp_path / "v" / "stats.json").write_text(json.dumps({
        "vocab_size": 10_001, "min_count": 15, "sentences_out": 780, "dropped_unk_train": 15, "dropped_unk_val": 5,
        "out_train": 772, "out_val": 8, "vocab_counts": "all"}))
    lines = report("g", "coco_gcc", tmp_path / "c", tmp_path / "v")
    text = "\n".join(lines)
    assert "after filter no_concept (-100)" in text and "after filter too_short (-90)" in text
    assert " 890 " in text and " 800 " in text
    assert "after the <UNK> ratio filter (-20)" in text and " 780 " in text
    vocab_line = next(ln for ln in lines if ln.startswith("vocabulary"))
    assert "10000" in vocab_line and "10652" in vocab_line and "(-6.1%)" in vocab_line
    with pytest.raises(FileNotFoundError, match="build_vocab"):
        report("g", "coco_gcc", tmp_path / "c", tmp_path / "missing")


def test_official_vocab_counts_include_sentences_without_concepts() -> None:
    from r2m.text.stages import COUNT_ONLY, process_chunk

    d = load_dictionary("openimages")
    lines = [(1, "a dog on the grass ."), (2, "a sunny day in the park ."), (3, "x")]
    cfg = FilterConfig(min_tokens=4, count_specials=True)
    dropped, passed = Counter(), Counter()
    ours = process_chunk(lines, d, cfg, 0.0, 0, Counter())
    off = process_chunk(lines, d, cfg, 0.0, 0, dropped, "official", keep_no_concept=True, passed=passed)
    assert ours["split"] == ["train"]  # the no-concept sentence is gone
    assert off["split"] == ["train", COUNT_ONLY] and off["tokens"][1].endswith(" .")
    # "x" is counted under the first filter by name (no_concept) but, too short, is not kept
    assert dropped == Counter({"no_concept": 2}) and passed["length"] == 2
    vocab = build_vocab(Counter(" ".join(off["tokens"]).split()), 1, ["dog"])
    stats: Counter[str] = Counter()
    enc = encode_batch(pa.RecordBatch.from_pydict({k: off[k] for k in ("tokens", "concepts", "split")}),
                       vocab, 1.0, stats)
    assert enc.num_rows == 1 and stats["count_only"] == 1 and "sunny" in vocab
