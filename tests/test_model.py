"""R2M modules: shapes, attention normalisation, the relational gate, masking, memorisation."""

from __future__ import annotations

import pytest
import torch

from r2m.models.catalog import MODELS, build_model, load_model
from r2m.models.r2m import R2M, VARIANTS, FusionMemory, R2MConfig, RelationalMemory
from r2m.params import VARIANT_NAMES
from r2m.text.vocab import END, START

torch.set_num_threads(1)


def tiny(**kw) -> R2M:
    torch.manual_seed(0)
    return R2M(R2MConfig(**{"vocab_size": 30, "d": 16, "heads": 2, "d_k": 8, "dropout": 0.0, **kw})).eval()


def batch(B: int = 3, T: int = 7):
    g = torch.Generator().manual_seed(1)
    concepts = torch.tensor([[5, 6, 7], [8, 9, 0], [10, 0, 0]])[:B]
    clens = torch.tensor([3, 2, 1])[:B]
    inputs = torch.randint(4, 30, (B, T), generator=g)
    inputs[:, 0] = START
    lengths = torch.tensor([T, T - 2, 3])[:B]
    return concepts, clens, inputs, lengths


def test_variants_match_params_and_registry() -> None:
    assert tuple(VARIANTS) == VARIANT_NAMES
    assert "r2m" in MODELS
    assert isinstance(build_model("r2m", {"vocab_size": 30, "d": 16, "d_k": 8}), R2M)


def test_paper_size_parameter_count() -> None:
    m = R2M(R2MConfig(vocab_size=18679))
    assert m.param_count() == 27_294_455  # paper / brief: 27.3M
    m = R2M(R2MConfig(vocab_size=18679, image_dim=1536))
    assert m.param_count(include_image_proj=False) == 27_294_455
    assert m.param_count() == 27_294_455 + 1536 * 512 + 512
    frozen = R2M(R2MConfig(vocab_size=18679, image_dim=1536, image_proj="frozen_random"))
    assert frozen.param_count() == 27_294_455
    assert not any(k.startswith("image_proj") for k in frozen.state_dict())


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("slots", [1, 2])
def test_shapes_every_module(variant: str, slots: int) -> None:
    m = R2M(R2MConfig.for_variant(variant, vocab_size=30, d=16, heads=2, d_k=8, memory_slots=slots, image_dim=12))
    c, cl, x, ln = batch()
    out = m(c, cl, x, ln, need_weights=True)
    B, T = x.shape
    assert out["hidden"].shape == (B, T, slots * 16)
    assert m.logits(out["hidden"]).shape == (B, T, 30)
    assert out["v"].shape == (B, 16) and out["v_tilde"].shape == (B, 16)
    torch.testing.assert_close(out["v"].norm(dim=-1), torch.ones(B))
    torch.testing.assert_close(out["v_tilde"].norm(dim=-1), torch.ones(B))
    if variant == "no_fm":
        assert out["fm"] is None
    else:
        assert out["fm"].shape == (B, T, 2, 2, 2)
    if variant in ("d_lstm", "dr_lstm"):
        assert out["rm"] is None
    else:
        assert out["rm"].shape == (B, T, 2, slots, slots + 1)
        torch.testing.assert_close(out["rm"].sum(-1), torch.ones(B, T, 2, slots))
    g = m.greedy(out["v"], 5)
    assert g["tokens"].shape[0] == B and g["hidden"].shape[-1] == slots * 16 and g["v_tilde"].shape == (B, 16)
    assert m.project_image(torch.randn(B, 12)).shape == (B, 16)


def test_fm_weights_sum_to_one_over_two_inputs() -> None:
    fm = FusionMemory(16, 2, 8)
    v, w = torch.randn(4, 16), torch.randn(4, 5, 16)
    f, att = fm(fm.prepare(v), w, need_weights=True)
    assert f.shape == (4, 5, 16) and att.shape == (4, 5, 2, 2, 2)
    torch.testing.assert_close(att.sum(-1), torch.ones(4, 5, 2, 2))
    # hand computation for one head/one step
    q = torch.stack([v[0] @ fm.qkv.weight[:8].t(), w[0, 0] @ fm.qkv.weight[:8].t()])
    k = torch.stack([v[0] @ fm.qkv.weight[16:24].t(), w[0, 0] @ fm.qkv.weight[16:24].t()])
    torch.testing.assert_close(att[0, 0, 0], torch.softmax(q @ k.t() / 8 ** 0.5, -1))


def test_relational_gate_matches_hand_computation() -> None:
    torch.manual_seed(0)
    rm = RelationalMemory(input_dim=16, d=16, slots=1, heads=2, d_k=8, mlp_layers=2)
    M = torch.randn(2, 1, 16)
    f = torch.randn(2, 16)
    pre = tuple(p[:, 0] for p in rm.precompute(f.unsqueeze(1)))
    (M_new,), out, att = rm.step((M,), pre, need_weights=True)
    # hand computation of Eqs. 5-7
    qkv_m = rm.qkv_norm(rm.qkv(M[:, 0]))
    qkv_f = rm.qkv_norm(rm.qkv(f))
    heads = []
    for h in range(2):
        q = qkv_m[:, h * 8:(h + 1) * 8]
        keys = torch.stack([qkv_m[:, 16 + h * 8: 16 + (h + 1) * 8], qkv_f[:, 16 + h * 8: 16 + (h + 1) * 8]], 1)
        vals = torch.stack([qkv_m[:, 32 + h * 8: 32 + (h + 1) * 8], qkv_f[:, 32 + h * 8: 32 + (h + 1) * 8]], 1)
        a = torch.softmax((keys @ q.unsqueeze(-1)).squeeze(-1) / 8 ** 0.5, -1)
        torch.testing.assert_close(att[:, h, 0], a)
        heads.append((a.unsqueeze(-1) * vals).sum(1))
    m1 = rm.norm1(M[:, 0] + torch.cat(heads, -1))
    m_tilde = rm.norm2(m1 + rm.mlp(m1))
    W, b, U = rm.gate_in.weight, rm.gate_in.bias, rm.gate_mem.weight
    g_i = torch.sigmoid(f @ W[:16].t() + torch.tanh(M[:, 0]) @ U[:16].t() + b[:16])
    g_f = torch.sigmoid(f @ W[16:].t() + torch.tanh(M[:, 0]) @ U[16:].t() + b[16:])
    expected = g_i * torch.tanh(m_tilde) + g_f * M[:, 0]
    torch.testing.assert_close(M_new[:, 0], expected)
    torch.testing.assert_close(out, expected)


def test_padding_does_not_change_loss_or_v_tilde() -> None:
    from r2m.losses.xe import xe_loss

    m = tiny()
    c, cl, x, ln = batch()
    targets = torch.roll(x, -1, 1)
    mask = torch.arange(x.shape[1])[None] < ln[:, None]
    a = m(c, cl, x, ln)
    x2, t2 = x.clone(), targets.clone()
    x2[~mask] = 17
    t2[~mask] = 23
    c2 = c.clone()
    c2[1, 2] = 11  # beyond concept length 2
    b = m(c2, cl, x2, ln)
    torch.testing.assert_close(a["v"], b["v"])
    torch.testing.assert_close(a["v_tilde"], b["v_tilde"])
    la = xe_loss(m.logits(a["hidden"]), targets, mask)
    lb = xe_loss(m.logits(b["hidden"]), t2, mask)
    torch.testing.assert_close(la, lb)
    # and a change inside the valid part does change ṽ
    x3 = x.clone()
    x3[2, 1] = (x3[2, 1] + 1) % 30
    assert not torch.allclose(m(c, cl, x3, ln)["v_tilde"][2], a["v_tilde"][2])


def test_empty_concept_set_gives_zero_v() -> None:
    m = tiny()
    v = m.encode(torch.zeros(2, 0, dtype=torch.long), torch.zeros(2, dtype=torch.long))
    assert torch.equal(v, torch.zeros(2, 16))
    v = m.encode(torch.tensor([[5, 0], [0, 0]]), torch.tensor([1, 0]))
    assert v[1].abs().sum() == 0 and v[0].norm() > 0.99


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_teacher_forcing_equals_stepwise(variant: str) -> None:
    m = R2M(R2MConfig.for_variant(variant, vocab_size=30, d=16, heads=2, d_k=8, dropout=0.0)).eval()
    c, cl, x, ln = batch()
    out = m(c, cl, x, ln)
    state = m.decode_init(out["v"])
    for t in range(x.shape[1]):
        h, state, _, _ = m.decode_step(state, x[:, t])
        torch.testing.assert_close(h, out["hidden"][:, t])


def test_greedy_lengths_and_gradients() -> None:
    m = tiny()
    c, cl, _, _ = batch()
    v = m.encode(c, cl)
    g = m.greedy(v, 6)
    toks, L = g["tokens"], g["lengths"]
    for i in range(toks.shape[0]):
        ends = (toks[i] == END).nonzero()
        assert L[i] == (ends[0, 0] + 1 if len(ends) else toks.shape[1])
    g["v_tilde"].sum().backward()
    assert m.decoder.qkv.weight.grad is not None and m.decoder.qkv.weight.grad.abs().sum() > 0
    assert m.encoder.weight_hh_l0.grad.abs().sum() > 0  # through v and the hidden states


def test_memorises_tiny_corpus() -> None:
    from r2m.losses.xe import xe_loss

    torch.manual_seed(0)
    m = R2M(R2MConfig(vocab_size=20, d=32, heads=2, d_k=16, dropout=0.0))
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    c = torch.tensor([[4, 5], [6, 0], [7, 8], [9, 0]])
    cl = torch.tensor([2, 1, 2, 1])
    sents = torch.tensor([[10, 11, 12, 13, 2], [14, 15, 16, 2, 0], [17, 18, 10, 19, 2], [11, 12, 2, 0, 0]])
    ln = (sents != 0).sum(1)
    inputs = torch.cat([torch.full((4, 1), START), sents[:, :-1]], 1) * (torch.arange(5)[None] < ln[:, None])
    mask = sents != 0
    for _ in range(150):
        out = m(c, cl, inputs, ln, reconstruct=False)
        loss = xe_loss(m.logits(out["hidden"]), sents, mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05
    g = m.eval().greedy(m.encode(c, cl), 6, reconstruct=False)
    for i in range(4):
        assert g["tokens"][i, : ln[i]].tolist() == sents[i, : ln[i]].tolist()


def test_checkpoint_roundtrip_weights_only(tmp_path) -> None:
    from r2m.utils.checkpoint import save_torch

    m = tiny(image_dim=12)
    save_torch(tmp_path / "model.pt", m.checkpoint(stage="x"))
    m2, ck = load_model(tmp_path)
    assert ck["stage"] == "x"
    for k, v in m.state_dict().items():
        assert torch.equal(v, m2.state_dict()[k])
    # a text-stage checkpoint gains an image projection later
    save_torch(tmp_path / "t.pt", tiny().checkpoint())
    m3, _ = load_model(tmp_path / "t.pt", image_dim=12)
    assert m3.project_image(torch.randn(2, 12)).shape == (2, 16)
    with pytest.raises(ValueError, match="does not match"):
        R2M.from_checkpoint(tiny().checkpoint(), d_k=4)
