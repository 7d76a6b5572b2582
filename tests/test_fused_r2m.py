"""The fused RM recurrence (r2m.models.rm_fused) computes what the step-wise RM unit computed.

The reference is a copy of ``RelationalMemory.precompute`` / ``step`` as they were before the
fused path (sonnet-style multi-head attention over ``[M; f]`` with views and transposes), run by
autograd; the fused path must give the same outputs and gradients (all parameters and the input)
to ~1e-5 relative on random weights and inputs, for every setting the fused path covers.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from r2m.models.r2m import R2M, R2MConfig, RelationalMemory
from r2m.models.rm_fused import RMRecurrence, RMShape


def reference_run(mem: RelationalMemory, x: Tensor) -> Tensor:
    """Today's (pre-fusion) RM recurrence over x [B, T, ·] → memories [B, T, N·d]."""
    h, dk, dv, N = mem.h, mem.dk, mem.dv, mem.n
    hk = h * dk
    x = mem.inp(x)
    _, k_all, v_all = mem.qkv_norm(mem.qkv(x)).split((hk, hk, h * dv), dim=-1)
    g_all = mem.gate_in(x)
    B, T = x.shape[:2]
    M = x.new_zeros(B, N, mem.d)
    outs = []
    for t in range(T):
        k_x, v_x, g_x = k_all[:, t], v_all[:, t], g_all[:, t]
        q, k, v = mem.qkv_norm(mem.qkv(M)).split((hk, hk, h * dv), dim=-1)
        # sonnet 1.27+ (and Eq. 5) scale q by key_size ** -0.5, sonnet up to 1.26 by qkv_size ** -0.5
        q = q.view(B, N, h, dk).transpose(1, 2) * ((2 * dk + dv) ** -0.5 if mem.qkv_scale else dk ** -0.5)
        k = torch.cat((k, k_x.unsqueeze(1)), 1).view(B, N + 1, h, dk).permute(0, 2, 3, 1)
        v = torch.cat((v, v_x.unsqueeze(1)), 1).view(B, N + 1, h, dv).transpose(1, 2)
        att = torch.softmax(q @ k, dim=-1)
        a = (att @ v).transpose(1, 2).reshape(B, N, h * dv)
        m1 = mem.norm1(M + a)
        m_tilde = mem.norm2(m1 + mem.mlp(m1))
        gi, gf = (mem.gate_mem(torch.tanh(M)) + g_x.unsqueeze(1)).chunk(2, dim=-1)
        M = torch.sigmoid(gi) * torch.tanh(m_tilde) + torch.sigmoid(gf) * M
        outs.append(M.reshape(B, N * mem.d))
    return torch.stack(outs, 1)


def stepwise_run(mem: RelationalMemory, x: Tensor) -> Tensor:
    """The step-wise API (``precompute`` + ``step``, as free-running decoding uses it)."""
    pre = mem.precompute(x)
    state = mem.init_state(x.shape[0], x)
    outs = []
    for t in range(x.shape[1]):
        state, o, _ = mem.step(state, tuple(p[:, t] for p in pre))
        outs.append(o)
    return torch.stack(outs, 1)


def _randomise(mem: nn.Module, seed: int) -> None:
    """Random weights everywhere (LayerNorm gains and biases too), so no gradient is trivially 0/1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in mem.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)


def _grads(mem: nn.Module, x: Tensor, out: Tensor, w: Tensor) -> list[Tensor]:
    return torch.autograd.grad((out * w).sum(), [x, *mem.parameters()], allow_unused=True)


CASES = [
    dict(),
    dict(qkv_norm=False),
    dict(input_linear="always"),
    dict(mlp_layers=1),
    dict(mlp_layers=3),
    dict(heads=4, d_k=5),
    dict(scale="qkv"),
    dict(scale="qkv", heads=4, d_k=5, input_linear="always"),
]


def _unit(kw: dict, seed: int, T: int) -> tuple[RelationalMemory, Tensor, Tensor]:
    """An RM unit of one of :data:`CASES` with random weights (``seed``), inputs x [3, T, ·] that
    require grad, and random output weights w [3, T, d] for a scalar to differentiate."""
    torch.manual_seed(0)
    args = dict(input_dim=12, d=12, slots=1, heads=2, d_k=8, mlp_layers=2) | kw
    mem = RelationalMemory(**args)
    _randomise(mem, seed)
    return mem, torch.randn(3, T, args["input_dim"], requires_grad=True), torch.randn(3, T, args["d"])


@pytest.mark.parametrize("kw", CASES, ids=[str(c) or "default" for c in CASES])
def test_fused_matches_reference(kw):
    mem, x, w = _unit(kw, 1, 7)
    assert mem.can_fuse(False, x)
    ref, fused = reference_run(mem, x), mem.run_fused(x)
    torch.testing.assert_close(fused, ref, rtol=1e-5, atol=1e-5)
    for gr, gf in zip(_grads(mem, x, ref, w), _grads(mem, x, fused, w), strict=True):
        assert (gr is None) == (gf is None)
        if gr is not None:
            torch.testing.assert_close(gf, gr, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kw", CASES, ids=[str(c) or "default" for c in CASES])
def test_closed_form_step_matches_reference(kw):
    """The one-slot ``step`` (greedy decoding, beam search) in closed form: same values and gradients."""
    mem, x, w = _unit(kw, 3, 5)
    ref, got = reference_run(mem, x), stepwise_run(mem, x)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for gr, gf in zip(_grads(mem, x, ref, w), _grads(mem, x, got, w), strict=True):
        if gr is not None:
            torch.testing.assert_close(gf, gr, rtol=1e-5, atol=1e-5)


def test_fused_gradcheck_float64():
    torch.manual_seed(0)
    mem = RelationalMemory(input_dim=4, d=4, slots=1, heads=2, d_k=3, mlp_layers=2).double()
    _randomise(mem, 2)
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    px, gx = (t.detach().requires_grad_() for t in mem.precompute_fused(x))
    shape = RMShape(mem.d, mem.h, mem.dk, mem.dv, mem.norm1.eps)
    params = [mem.qkv.weight, mem.qkv.bias, mem.qkv_norm.weight, mem.qkv_norm.bias, mem.norm1.weight,
              mem.norm1.bias, mem.norm2.weight, mem.norm2.bias, mem.gate_mem.weight,
              mem.mlp[0].weight, mem.mlp[0].bias, mem.mlp[2].weight, mem.mlp[2].bias]
    params = [p.detach().clone().requires_grad_() for p in params]
    assert torch.autograd.gradcheck(lambda *a: RMRecurrence.apply(shape, mem.head_sum, *a), (px, gx, *params))


MODEL_CASES = [("r2m", {}), ("no_fm", {}), ("d_lstm", {}), ("r_lstm", {}), ("dr_lstm", {}),
               ("r2m", {"init": "official"}), ("r2m", {"rm_input": "always"}), ("r2m", {"qkv_norm": False}),
               ("r2m", {"rm_scale": "qkv"}), ("r2m", {"fm_output": "flat", "rm_input": "always"}),
               ("no_fm", {"fm_output": "flat"}), ("d_lstm", {"fm_output": "flat"}), ("r2m", {"fm_attention": "sonnet"})]


@pytest.mark.parametrize(("variant", "kw"), MODEL_CASES, ids=[f"{v}-{k}" for v, k in MODEL_CASES])
def test_model_uses_fused_path_and_matches_generic(variant, kw):
    """The whole teacher-forced model (decoder and reconstructor fused) equals the step-wise path
    (in float64, so that the comparison is about the math, not float32 rounding of large gradients)."""
    torch.manual_seed(0)
    model = R2M(R2MConfig.for_variant(variant, vocab_size=20, d=16, heads=2, d_k=8, dropout=0.0, **kw))
    model = model.double().train()
    B, T = 3, 6
    inputs = torch.randint(4, 20, (B, T))
    lengths = torch.tensor([6, 4, 2])
    concepts, clens = torch.randint(4, 20, (B, 3)), torch.tensor([3, 1, 2])

    def run(fused: bool):
        for mem in mems:
            mem.can_fuse = (lambda nw, x, m=mem: RelationalMemory.can_fuse(m, nw, x)) if fused else (lambda nw, x: False)
        out = model(concepts, clens, inputs, lengths)
        loss = model.logits(out["hidden"]).logsumexp(-1).mean() + out["v_tilde_raw"].pow(2).sum()
        return out, torch.autograd.grad(loss, list(model.parameters()))

    mems = [m for m in (model.decoder, model.reconstructor) if isinstance(m, RelationalMemory)]
    (a, ga), (b, gb) = run(True), run(False)
    for mem in mems:
        del mem.can_fuse
    torch.testing.assert_close(a["hidden"], b["hidden"], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(a["v_tilde_raw"], b["v_tilde_raw"], rtol=1e-10, atol=1e-10)
    for x, y in zip(ga, gb, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-9)


def test_generic_path_kept_where_not_fused():
    """N > 1 slots, attention records and autocast keep the step-wise path."""
    mem = RelationalMemory(input_dim=8, d=8, slots=2, heads=2, d_k=4, mlp_layers=2)
    x = torch.randn(2, 3, 8)
    assert not mem.can_fuse(False, x)
    mem1 = RelationalMemory(input_dim=8, d=8, slots=1, heads=2, d_k=4, mlp_layers=2)
    assert mem1.can_fuse(False, x) and not mem1.can_fuse(True, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not mem1.can_fuse(False, x)


def test_fused_graph_is_freed_without_the_cycle_collector():
    """The fused node keeps its output via save_for_backward (no reference cycle): a step's
    activations go when its tensors do, not at the next garbage collection."""
    import gc
    import weakref

    mem = RelationalMemory(input_dim=8, d=8, slots=1, heads=2, d_k=4, mlp_layers=2)
    x = torch.randn(2, 5, 8, requires_grad=True)
    gc.disable()
    try:
        for backward in (True, False):
            out = mem.run_fused(x)
            if backward:
                out.sum().backward()
            ref = weakref.ref(out)
            del out
            assert ref() is None
    finally:
        gc.enable()
