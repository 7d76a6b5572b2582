"""The Recurrent Memory unit with one memory slot, as one autograd node over the whole sequence.

A training step at paper sizes is launch-bound (issue 17): the RM recurrence under plain autograd
dispatches ~150 operators per time step, most of them views, transposes and the backward's
per-step parameter-gradient accumulations. :class:`RMRecurrence` computes the same function
(``RelationalMemory.step`` of :mod:`r2m.models.r2m` with N = 1, iterated over T steps) with:

* **closed-form attention over the two keys** ``[M_{t-1}; f_t]``: per head the softmax over two
  scores is ``σ(s_M − s_f)``, so ``a = v_f + σ(q·(k_M − k_f)/√d_k) ⊙ (v_M − v_f)``; the per-head
  dot product and its broadcast over the head's value dims are one ``mm`` with a constant block
  matrix (:func:`head_matrix`, the scale folded in);
* **a forward without autograd**, keeping per step only the activations the backward reads
  (LayerNorm inputs with their mean / rstd, gate values, …; no copies of weights);
* **a hand-written backward through time** with aten's fused kernels
  (``native_layer_norm_backward``, ``threshold_backward``); the elementwise derivative factors that
  do not depend on the incoming gradient (σ', 1 − tanh², …) are formed for all steps at once
  before the loop, and every **parameter gradient is computed once** over all T steps as
  ``[T·B, ·]`` matmuls / reductions after it, instead of T accumulations.

Inputs are the input-side terms computed for all steps by autograd beforehand
(``RelationalMemory.precompute_fused``): ``px`` = the input's normalised q/k/v with the query part
zeroed, ``[0 | k_f | v_f]`` [B, T, F], and ``gx`` = ``W f_t + b`` [B, T, 2d]. The output is the
memory at every step, [B, T, d]. ``tests/test_fused_r2m.py`` checks it against today's step-wise
code (values and gradients) and with ``torch.autograd.gradcheck`` in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

aten = torch.ops.aten


@dataclass(frozen=True)
class RMShape:
    """Sizes of an RM unit: model size d, heads H, key size d_k, value size d_v = d / H, LN eps."""

    d: int
    heads: int
    d_k: int
    d_v: int
    eps: float = 1e-5

    @property
    def hk(self) -> int:
        return self.heads * self.d_k

    @property
    def hv(self) -> int:
        return self.heads * self.d_v


def head_matrix(shape: RMShape, like: Tensor) -> Tensor:
    """[H·d_k, H·d_v]: entry (i, j) is 1/√d_k when key dim i and value dim j belong to one head.

    ``(q ⊙ k) @ head_matrix`` is each head's scaled dot product, repeated over its d_v value dims."""
    blocks = [like.new_full((shape.d_k, shape.d_v), shape.d_k ** -0.5)] * shape.heads
    return torch.block_diag(*blocks)


def _ln(x: Tensor, w: Tensor | None, b: Tensor | None, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    return aten.native_layer_norm(x, [x.shape[-1]], w, b, eps)


def _ln_back(g: Tensor, x: Tensor, mu: Tensor, rs: Tensor, w: Tensor | None, b: Tensor | None) -> Tensor:
    return aten.native_layer_norm_backward(g, x, [x.shape[-1]], mu, rs, w, b, [True, False, False])[0]


def _ln_param_grads(g: Tensor, x: Tensor, mu: Tensor, rs: Tensor, w: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    _, gw, gb = aten.native_layer_norm_backward(g, x, [x.shape[-1]], mu, rs, w, b, [False, True, True])
    return gw, gb


def _cat(xs: list[Tensor]) -> Tensor:
    return torch.cat(xs, 0)  # per-step [B, ·] → [T·B, ·] (one op; no stack + view)


class RMRecurrence(torch.autograd.Function):
    """``M_1 … M_T`` of an RM unit with one slot; see the module docstring.

    ``apply(shape, px, gx, w_qkv, b_qkv, ln_w, ln_b, ln1_w, ln1_b, ln2_w, ln2_b, u, *mlp)``:
    ``ln_w``/``ln_b`` None without the q/k/v LayerNorm, ``mlp`` = (W_0, b_0, W_1, b_1, …).
    """

    @staticmethod
    def forward(ctx, shape: RMShape, px: Tensor, gx: Tensor, w_qkv: Tensor, b_qkv: Tensor,
                ln_w: Tensor | None, ln_b: Tensor | None, ln1_w: Tensor, ln1_b: Tensor,
                ln2_w: Tensor, ln2_b: Tensor, u: Tensor, *mlp: Tensor) -> Tensor:
        B, T = px.shape[:2]
        hk, eps = shape.hk, shape.eps
        se = head_matrix(shape, px)
        w_qkv_t, u_t = w_qkv.t(), u.t()
        mlp_t = [(mlp[i].t(), mlp[i + 1]) for i in range(0, len(mlp), 2)]
        px_t, gx_t = px.unbind(1), gx.unbind(1)
        vx_t = px[..., 2 * hk:].unbind(1)
        M = px.new_zeros(B, shape.d)
        save = any(ctx.needs_input_grad)  # keep per-step activations only for a backward
        keep: dict[str, list] = {k: [] for k in ("M", "pre", "mu", "rs", "z", "ame", "x1", "mu1", "rs1",
                                                 "x2", "mu2", "rs2", "th", "sig", "tM")}
        keep["h"] = [[] for _ in mlp_t]  # inputs of the MLP layers (h[0] = m1)
        outs = []
        for t in range(T):
            pre = torch.addmm(b_qkv, M, w_qkv_t)
            if ln_w is not None:
                qn, mu, rs = _ln(pre, ln_w, ln_b, eps)
            else:
                qn, mu, rs = pre, None, None
            z = qn - px_t[t]  # [q | k_M − k_f | v_M − v_f]
            q, kd, vd = z.split((hk, hk, shape.hv), -1)
            ame = torch.sigmoid((q * kd) @ se)  # weight of the memory's key, per value dim
            x1 = torch.addcmul(M + vx_t[t], ame, vd)  # M + attention output
            m1, mu1, rs1 = _ln(x1, ln1_w, ln1_b, eps)
            h = m1
            for i, (w_t, b) in enumerate(mlp_t):
                if save:
                    keep["h"][i].append(h)
                h = torch.addmm(b, h, w_t)
                if i < len(mlp_t) - 1:
                    h = torch.relu(h)
            x2 = h + m1
            mt, mu2, rs2 = _ln(x2, ln2_w, ln2_b, eps)
            th, tM = torch.tanh(mt), torch.tanh(M)
            sig = torch.sigmoid(torch.addmm(gx_t[t], tM, u_t))
            s_i, s_f = sig.chunk(2, -1)
            for k, val in () if not save else (("M", M), ("pre", pre), ("mu", mu), ("rs", rs), ("z", z), ("ame", ame), ("x1", x1),
                           ("mu1", mu1), ("rs1", rs1), ("x2", x2), ("mu2", mu2), ("rs2", rs2), ("th", th),
                           ("sig", sig), ("tM", tM)):
                keep[k].append(val)
            M = torch.addcmul(s_i * th, s_f, M)
            outs.append(M)
        if save:
            ctx.shape, ctx.keep, ctx.se = shape, keep, se
            ctx.params = (w_qkv, b_qkv, ln_w, ln_b, ln1_w, ln1_b, ln2_w, ln2_b, u, mlp)
        return torch.stack(outs, 1)

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # noqa: C901 - one BPTT, kept in one place on purpose
        shape, keep, se = ctx.shape, ctx.keep, ctx.se
        w_qkv, b_qkv, ln_w, ln_b, ln1_w, ln1_b, ln2_w, ln2_b, u, mlp = ctx.params
        d, hk, hv = shape.d, shape.hk, shape.hv
        T = len(keep["M"])
        B = grad_out.shape[0]
        n_mlp = len(mlp) // 2
        g_out = grad_out.unbind(1)
        # per-step factors that do not depend on the incoming gradient, for all steps at once
        SIG, TH, MP, TM = (_cat(keep[k]) for k in ("sig", "th", "M", "tM"))
        AME, Z = _cat(keep["ame"]), _cat(keep["z"])
        k_gate = torch.cat((TH, MP), -1) * (SIG - SIG * SIG)  # ∂M_t/∂(gate pre-activations) / dM
        s_i, s_f = SIG.split(d, -1)
        j_th = s_i * (1 - TH * TH)  # ∂M_t/∂m̃ / dM
        p_tm = 1 - TM * TM  # tanh'(M_{t-1})
        q, kd, vd = Z.split((hk, hk, hv), -1)
        vs = vd * (AME - AME * AME)  # ∂x1/∂(scores, repeated per value dim) / dx1
        qk = torch.cat((kd, q), -1)
        se2 = torch.cat((se.t(), se.t()), 1)  # [H·d_v, 2·H·d_k]
        per_step = [x.split(B) for x in (k_gate, j_th, p_tm, s_f, vs, qk, AME)]
        K, J, P, SF, VS, QK, AM = per_step
        mlp_w = [mlp[2 * i] for i in range(n_mlp)]
        has_norm = ln_w is not None
        grads: dict[str, list[Tensor]] = {k: [] for k in ("dg", "dmt", "dm1", "dx1", "dzn", "dpre")}
        grads["da"] = [[] for _ in range(n_mlp)]  # gradients of the MLP layers' outputs
        G = g_out[T - 1]
        for t in range(T - 1, -1, -1):
            dg = G.repeat(1, 2) * K[t]
            dmt = G * J[t]
            dx2 = _ln_back(dmt, keep["x2"][t], keep["mu2"][t], keep["rs2"][t], ln2_w, ln2_b)
            da = dx2
            grads["da"][n_mlp - 1].append(da)
            for i in range(n_mlp - 1, 0, -1):
                da = aten.threshold_backward(da @ mlp_w[i], keep["h"][i][t], 0)
                grads["da"][i - 1].append(da)
            dm1 = torch.addmm(dx2, da, mlp_w[0])
            dx1 = _ln_back(dm1, keep["x1"][t], keep["mu1"][t], keep["rs1"][t], ln1_w, ln1_b)
            dqk = ((dx1 * VS[t]) @ se2) * QK[t]
            dzn = torch.cat((dqk, dx1 * AM[t]), -1)
            dpre = _ln_back(dzn, keep["pre"][t], keep["mu"][t], keep["rs"][t], ln_w, ln_b) if has_norm else dzn
            for k, val in (("dg", dg), ("dmt", dmt), ("dm1", dm1), ("dx1", dx1), ("dzn", dzn), ("dpre", dpre)):
                grads[k].append(val)
            if t:  # the gradient reaching M_{t-1} (M_0 = 0 is a constant)
                carry = torch.addcmul(g_out[t - 1], G, SF[t])
                carry = torch.addcmul(carry, dg @ u, P[t])
                G = torch.addmm(carry + dx1, dpre, w_qkv)
        for k, v in grads.items():
            for lst in (v if k == "da" else [v]):
                lst.reverse()
        DG, DMT, DM1, DX1, DZN, DPRE = (_cat(grads[k]) for k in ("dg", "dmt", "dm1", "dx1", "dzn", "dpre"))
        # parameter gradients, once over all T·B rows
        g_wqkv, g_bqkv = DPRE.t() @ MP, DPRE.sum(0)
        g_ln = (_ln_param_grads(DZN, _cat(keep["pre"]), _cat(keep["mu"]), _cat(keep["rs"]), ln_w, ln_b)
                if has_norm else (None, None))
        g_ln1 = _ln_param_grads(DM1, _cat(keep["x1"]), _cat(keep["mu1"]), _cat(keep["rs1"]), ln1_w, ln1_b)
        g_mlp: list[Tensor] = []
        for i in range(n_mlp):
            DA = _cat(grads["da"][i])
            g_mlp += [DA.t() @ _cat(keep["h"][i]), DA.sum(0)]
        g_ln2 = _ln_param_grads(DMT, _cat(keep["x2"]), _cat(keep["mu2"]), _cat(keep["rs2"]), ln2_w, ln2_b)
        g_u = DG.t() @ TM
        # input-side gradients: px = [0 | k_f | v_f] enters as z = qn − px and x1 = M + v_f + …
        dpx = -DZN
        dpx[:, 2 * hk:] += DX1
        g_px = dpx.view(T, B, -1).transpose(0, 1)
        g_gx = DG.view(T, B, -1).transpose(0, 1)
        return (None, g_px, g_gx, g_wqkv, g_bqkv, *g_ln, *g_ln1, *g_ln2, g_u, *g_mlp)
