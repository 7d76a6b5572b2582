"""Beam search and the caption stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from r2m.captioning.beam import beam_search, to_words
from r2m.models.r2m import R2M, R2MConfig
from r2m.text.vocab import END, PAD, START

torch.set_num_threads(1)


def model(seed: int = 0, variant: str = "r2m") -> R2M:
    torch.manual_seed(seed)
    m = R2M(R2MConfig.for_variant(variant, vocab_size=25, d=16, heads=2, d_k=8, dropout=0.0)).eval()
    with torch.no_grad():  # make <#end> reachable within a few steps
        m.out.bias[END] += 1.0
    return m


def plain_greedy(m: R2M, v: torch.Tensor, max_len: int, banned=(PAD, START)):
    state = m.decode_init(v)
    prev = torch.full((v.shape[0],), START)
    toks, total = [], torch.zeros(v.shape[0])
    done = torch.zeros(v.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        h, state, _, _ = m.decode_step(state, prev)
        lp = torch.log_softmax(m.logits(h), -1)
        lp[:, list(banned)] = float("-inf")
        s, t = lp.max(-1)
        t = t.masked_fill(done, PAD)
        total += torch.where(done, torch.zeros_like(s), s)
        done |= t == END
        toks.append(t)
        prev = t
    return torch.stack(toks, 1), total


@torch.no_grad()
@pytest.mark.parametrize("variant", ["r2m", "dr_lstm"])
def test_beam_width_one_equals_greedy(variant: str) -> None:
    m = model(variant=variant)
    v = torch.nn.functional.normalize(torch.randn(6, 16), dim=-1)
    out = beam_search(m, v, beam=1, max_len=9)
    toks, total = plain_greedy(m, v, 9)
    T = out["tokens"].shape[-1]
    assert torch.equal(out["tokens"][:, 0], toks[:, :T])
    torch.testing.assert_close(out["scores"][:, 0], total)
    # the model's own training-time greedy (no banned tokens) agrees when nothing is banned
    g = m.greedy(v, 9, reconstruct=False, stop_early=False)
    b = beam_search(m, v, beam=1, max_len=9, banned=())
    assert torch.equal(b["tokens"][:, 0], g["tokens"][:, : b["tokens"].shape[-1]])


@torch.no_grad()
def test_beam_scores_sorted_and_consistent() -> None:
    m = model(1)
    v = torch.nn.functional.normalize(torch.randn(4, 16), dim=-1)
    out = beam_search(m, v, beam=4, max_len=7)
    s = out["scores"]
    assert torch.all(s[:, :-1] >= s[:, 1:])
    # each score is the sum of its tokens' log-probabilities (re-scored teacher-forced)
    for i in range(4):
        for j in range(4):
            L = int(out["lengths"][i, j])
            toks = out["tokens"][i, j, :L]
            state = m.decode_init(v[i: i + 1])
            prev, total = torch.tensor([START]), 0.0
            for t in toks:
                h, state, _, _ = m.decode_step(state, prev)
                lp = torch.log_softmax(m.logits(h), -1)
                lp[:, [PAD, START]] = float("-inf")
                total += float(lp[0, t])
                prev = t.view(1)
            assert total == pytest.approx(float(s[i, j]), abs=1e-4)


def test_to_words_stops_at_end() -> None:
    itos = ["<pad>", "<#start>", "<#end>", "<UNK>", "a", "dog"]
    assert to_words(torch.tensor([[4, 5, END, PAD], [5, 5, 5, 5]]), itos) == [["a", "dog"], ["dog"] * 4]


def test_caption_stage_writes_results_and_attention(tmp_path: Path) -> None:
    from r2m.captioning.stage import run
    from test_training import ctx_for, make_params, make_synthetic, run_stage

    make_synthetic(tmp_path)
    p = make_params(train_xe={"steps": 3})
    run_stage(tmp_path, "train_xe", p)
    ctx = ctx_for(tmp_path, "caption", p, ckpt="train_xe")
    run(ctx)
    caps = json.loads(ctx.outs["captions"].read_text())
    assert [c["image_id"] for c in caps] == [f"img{i}" for i in range(20, 24)]
    from test_training import ITOS

    words = set(ITOS[4:])  # real words only: no <pad>/<#start>/<#end>/<UNK>
    assert all(set(c["caption"].split()) <= words for c in caps), caps  # exact content: test_memorise.py
    att = json.loads(ctx.outs["attention"].read_text())
    assert att["fm_tokens"] == ["v", "w_prev"] and att["heads"] == 2
    assert [a["caption"] for a in att["images"]] == [c["caption"] for c in caps]
    img = att["images"][0]
    assert img["steps"][0]["input"] == "<#start>"
    st = img["steps"][0]
    assert len(st["fm"]) == 2 and len(st["fm"][0]) == 2 and sum(st["fm"][0][0]) == pytest.approx(1.0, abs=1e-5)
    assert len(st["rm"]) == 2 and len(st["rm"][0][0]) == 2
    for rec in att["images"]:  # each caption is the words its decoding steps emitted
        out = [s["output"] for s in rec["steps"]]
        assert " ".join(w for w in out if w != "<#end>") == rec["caption"]
