"""The Recurrent Memory unit with one memory slot, as one autograd node over the whole sequence.

A training step at paper sizes is launch-bound: the RM recurrence under plain autograd
dispatches ~150 operators per time step, most of them views, transposes and the backward's
per-step parameter-gradient accumulations. :class:`RMRecurrence` computes the same function
(``RelationalMemory.step`` of :mod:`r2m.models.r2m` with N = 1, iterated over T steps) with:

* **closed-form attention over the two keys** ``[M_{t-1}; f_t]``: per head the softmax over two
  scores is ``σ(s_M − s_f)``, so ``a = v_f + σ(q·(k_M − k_f)/√d_k) ⊙ (v_M − v_f)``; the per-head
  dot product and its broadcast over the head's value dims are one ``mm`` with a constant block
  matrix (:func:`head_matrix`, the scale folded in);
* **a forward without autograd**, keeping per step only the activations the backward reads
  (LayerNorm inputs with their mean / rstd, gate values, …; no copies of weights), written into
  [T, B, ·] buffers through views made once (``out=``), so splitting q/k/v or the gate halves and
  stacking the outputs cost no op per step; the MLP's last bias rides in LN1's bias
  (:func:`_mlp_plan`). The block matrix spends H× the multiply-adds the scores need (negligible
  next to the q/k/v projection at H = 2) to save the per-head view/sum/expand ops;
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
    qkv_scale: bool = False  # scale q by 1/sqrt(2 d_k + d_v) (sonnet up to 1.26) instead of 1/sqrt(d_k)

    @property
    def scale(self) -> float:
        """The attention's query scale: 1/√d_k, or 1/√(2·d_k + d_v) with ``qkv_scale``."""
        return (2 * self.d_k + self.d_v) ** -0.5 if self.qkv_scale else self.d_k ** -0.5

    @property
    def hk(self) -> int:
        return self.heads * self.d_k

    @property
    def hv(self) -> int:
        return self.heads * self.d_v


def head_matrix(shape: RMShape, like: Tensor) -> Tensor:
    """[H·d_k, H·d_v]: entry (i, j) is the query scale (:attr:`RMShape.scale`, 1/√d_k by default) when key
    dim i and value dim j belong to one head.

    ``(q ⊙ k) @ head_matrix`` is each head's scaled dot product, repeated over its d_v value dims."""
    blocks = [like.new_full((shape.d_k, shape.d_v), shape.scale)] * shape.heads
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


def _mlp_plan(mlp: tuple[Tensor, ...], ln1_b: Tensor) -> tuple[list[tuple[Tensor, Tensor]], Tensor]:
    """The MLP layers as (Wᵀ, bias) for ``addmm`` and the LayerNorm-1 bias to use.

    With ≥ 2 layers the last layer's bias b_L is folded into the residual: LN1 runs with the bias
    ``ln1_b + b_L`` (giving ``m1 + b_L``), the first layer's bias becomes ``b_0 − W_0 b_L`` and the
    last layer is ``addmm(m1 + b_L, h, W_Lᵀ)`` — the residual add and the bias in one op."""
    layers = [(mlp[i].t(), mlp[i + 1]) for i in range(0, len(mlp), 2)]
    if len(layers) < 2:
        return layers, ln1_b
    (w0_t, b0), b_last = layers[0], layers[-1][1]
    layers[0] = (w0_t, b0 - b_last @ w0_t)
    return layers, ln1_b + b_last


class RMRecurrence(torch.autograd.Function):
    """``M_1 … M_T`` of an RM unit with one slot; see the module docstring.

    ``apply(shape, se, px, gx, w_qkv, b_qkv, ln_w, ln_b, ln1_w, ln1_b, ln2_w, ln2_b, u, *mlp)``:
    ``se`` = :func:`head_matrix` (a constant),
    ``ln_w``/``ln_b`` None without the q/k/v LayerNorm, ``mlp`` = (W_0, b_0, W_1, b_1, …).
    Per step: 19 ops forward, 17 backward (the step-wise autograd path: ~145 for both).
    """

    @staticmethod
    def forward(ctx, shape: RMShape, se: Tensor, px: Tensor, gx: Tensor, w_qkv: Tensor, b_qkv: Tensor,
                ln_w: Tensor | None, ln_b: Tensor | None, ln1_w: Tensor, ln1_b: Tensor,
                ln2_w: Tensor, ln2_b: Tensor, u: Tensor, *mlp: Tensor) -> Tensor:
        B, T, F = px.shape
        d, hk, eps = shape.d, shape.hk, shape.eps
        w_qkv_t, u_t = w_qkv.t(), u.t()
        layers, ln1_bias = _mlp_plan(mlp, ln1_b)
        folded, has_norm = len(layers) >= 2, ln_w is not None
        px_t, gx_t = px.unbind(1), gx.unbind(1)
        vx_t = px[..., 2 * hk:].unbind(1)
        # [T, B, ·] buffers the steps write into (what the backward reads, plus the outputs)
        buf = {k: px.new_empty(T, B, n) for k, n in (("z", F), ("ame", shape.hv), ("x1", d), ("x2", d),
                                                      ("th", d), ("tM", d), ("sig", 2 * d))}
        buf |= {f"h{i}": px.new_empty(T, B, d) for i in range(1, len(layers))}  # ReLU outputs
        if has_norm:
            buf["pre"] = px.new_empty(T, B, F)
        at = {k: v.unbind(0) for k, v in buf.items()}
        Z, SIG = buf["z"], buf["sig"]
        q_t, kd_t, vd_t = Z[..., :hk].unbind(0), Z[..., hk:2 * hk].unbind(0), Z[..., 2 * hk:].unbind(0)
        si_t, sf_t = SIG[..., :d].unbind(0), SIG[..., d:].unbind(0)
        OUT = px.new_empty(B, T, d)
        out_t = OUT.unbind(1)
        M = px.new_zeros(B, d)
        stats: dict[str, list[Tensor]] = {k: [] for k in ("mu", "rs", "m1", "mu1", "rs1", "mu2", "rs2")}
        for t in range(T):
            if has_norm:
                pre = torch.addmm(b_qkv, M, w_qkv_t, out=at["pre"][t])
                qn, mu, rs = _ln(pre, ln_w, ln_b, eps)
                stats["mu"].append(mu), stats["rs"].append(rs)
            else:
                qn = torch.addmm(b_qkv, M, w_qkv_t)
            torch.sub(qn, px_t[t], out=at["z"][t])  # [q | k_M − k_f | v_M − v_f]
            # weight of the memory's key, per value dim
            ame = torch.sigmoid((q_t[t] * kd_t[t]) @ se, out=at["ame"][t])
            x1 = torch.addcmul(M + vx_t[t], ame, vd_t[t], out=at["x1"][t])  # M + attention output
            m1, mu1, rs1 = _ln(x1, ln1_w, ln1_bias, eps)  # m1 (+ b_L when folded)
            h = m1
            for i, (w_t, b) in enumerate(layers):
                if i < len(layers) - 1:
                    h = torch.clamp_min(torch.addmm(b, h, w_t), 0, out=at[f"h{i + 1}"][t])  # ReLU
                elif folded:
                    h = torch.addmm(m1, h, w_t, out=at["x2"][t])
                else:
                    h = torch.add(torch.addmm(b, h, w_t), m1, out=at["x2"][t])
            mt, mu2, rs2 = _ln(h, ln2_w, ln2_b, eps)
            th, tM = torch.tanh(mt, out=at["th"][t]), torch.tanh(M, out=at["tM"][t])
            torch.sigmoid(torch.addmm(gx_t[t], tM, u_t), out=at["sig"][t])
            for k, val in (("m1", m1), ("mu1", mu1), ("rs1", rs1), ("mu2", mu2), ("rs2", rs2)):
                stats[k].append(val)
            M = torch.addcmul(si_t[t] * th, sf_t[t], M, out=out_t[t])
        if any(ctx.needs_input_grad):  # keep what the backward reads
            ctx.shape, ctx.se, ctx.folded = shape, se, folded
            # through save_for_backward (not attributes of ctx): freed after the backward as autograd
            # frees saved tensors, and no reference cycle through the output
            ctx.layout = (list(buf), {k: len(v) for k, v in stats.items()})
            ctx.save_for_backward(OUT, *buf.values(), *(x for v in stats.values() for x in v))
            ctx.params = (w_qkv, b_qkv, ln_w, ln_b, ln1_w, ln1_b, ln2_w, ln2_b, u, mlp)
        return OUT

    @staticmethod
    def backward(ctx, grad_out: Tensor):  # noqa: C901 - one BPTT, kept in one place on purpose
        shape, se, (names, counts) = ctx.shape, ctx.se, ctx.layout
        out, *saved = ctx.saved_tensors
        buf = dict(zip(names, saved, strict=False))
        stats, i = {}, len(names)
        for k, n in counts.items():
            stats[k], i = saved[i: i + n], i + n
        at = {k: buf[k].unbind(0) for k in names if k in ("x1", "x2", "pre") or k.startswith("h")}
        w_qkv, b_qkv, ln_w, ln_b, ln1_w, ln1_b, ln2_w, ln2_b, u, mlp = ctx.params
        d, hk, hv = shape.d, shape.hk, shape.hv
        T, B, F = buf["z"].shape
        n_mlp = len(mlp) // 2
        has_norm = ln_w is not None
        flat = {k: v.view(T * B, v.shape[-1]) for k, v in buf.items()}
        g_out = grad_out.unbind(1)
        # M_{t-1} for every step (M_0 = 0), t-major like the buffers
        MP = torch.cat((out.new_zeros(1, B, d), out[:, :-1].transpose(0, 1)), 0).view(T * B, d)
        # per-step factors that do not depend on the incoming gradient, for all steps at once
        SIG, TH, AME = flat["sig"], flat["th"], flat["ame"]
        k_gate = aten.sigmoid_backward(torch.cat((TH, MP), -1), SIG)  # ∂M_t/∂(gate pre-activations) / dM
        j_th = aten.tanh_backward(SIG[:, :d], TH)  # ∂M_t/∂m̃ / dM
        p_tm = aten.tanh_backward(torch.ones_like(TH), flat["tM"])  # tanh'(M_{t-1})
        q, kd, vd = flat["z"].split((hk, hk, hv), -1)
        vs = aten.sigmoid_backward(vd, AME)  # ∂x1/∂(scores, repeated per value dim) / dx1
        se2 = torch.cat((se.t(), se.t()), 1)  # [H·d_v, 2·H·d_k]
        JK, P, SF, VS, QK, AM = (x.split(B) for x in (torch.cat((j_th, k_gate), -1), p_tm, SIG[:, d:], vs,
                                                       torch.cat((kd, q), -1), AME))
        mlp_w = [mlp[2 * i] for i in range(n_mlp)]
        relu_out = [None] + [at[f"h{i}"] for i in range(1, n_mlp)]
        DZN = buf["z"].new_empty(T, B, F)  # ∂L/∂(normalised q/k/v) per step, written in place
        dzn_t, dqk_t, dvd_t = DZN.unbind(0), DZN[..., :2 * hk].unbind(0), DZN[..., 2 * hk:].unbind(0)
        DMG = DZN.new_empty(T, B, 3 * d)  # [∂L/∂m̃ | ∂L/∂(gate pre-activations)] per step, written in place
        dmg_t, dmt_t, dg_t = DMG.unbind(0), DMG[..., :d].unbind(0), DMG[..., d:].unbind(0)
        grads: dict[str, list[Tensor]] = {k: [] for k in ("dm1", "dx1", "dpre")}
        grads["da"] = [[] for _ in range(n_mlp)]  # gradients of the MLP layers' outputs
        G = g_out[T - 1]
        for t in range(T - 1, -1, -1):
            torch.mul(G.repeat(1, 3), JK[t], out=dmg_t[t])
            dg = dg_t[t]
            dx2 = _ln_back(dmt_t[t], at["x2"][t], stats["mu2"][t], stats["rs2"][t], ln2_w, ln2_b)
            da = dx2
            grads["da"][n_mlp - 1].append(da)
            for i in range(n_mlp - 1, 0, -1):
                da = aten.threshold_backward(da @ mlp_w[i], relu_out[i][t], 0)
                grads["da"][i - 1].append(da)
            dm1 = torch.addmm(dx2, da, mlp_w[0])
            dx1 = _ln_back(dm1, at["x1"][t], stats["mu1"][t], stats["rs1"][t], ln1_w, ln1_b)
            torch.mul((dx1 * VS[t]) @ se2, QK[t], out=dqk_t[t])
            torch.mul(dx1, AM[t], out=dvd_t[t])
            dpre = _ln_back(dzn_t[t], at["pre"][t], stats["mu"][t], stats["rs"][t], ln_w, ln_b) if has_norm else dzn_t[t]
            for k, val in (("dm1", dm1), ("dx1", dx1), ("dpre", dpre)):
                grads[k].append(val)
            if t:  # the gradient reaching M_{t-1} (M_0 = 0 is a constant)
                carry = torch.addcmul(g_out[t - 1], G, SF[t])
                carry = torch.addcmul(carry, dg @ u, P[t])
                G = torch.addmm(carry + dx1, dpre, w_qkv)
        for k, v in grads.items():
            for lst in (v if k == "da" else [v]):
                lst.reverse()
        DM1, DX1, DPRE = (_cat(grads[k]) for k in ("dm1", "dx1", "dpre"))
        DZN, DMG = DZN.view(T * B, F), DMG.view(T * B, 3 * d)
        DMT, DG = DMG.split((d, 2 * d), -1)
        # parameter gradients, once over all T·B rows
        g_wqkv, g_bqkv = DPRE.t() @ MP, DPRE.sum(0)
        g_ln = (_ln_param_grads(DZN, flat["pre"], _cat(stats["mu"]), _cat(stats["rs"]), ln_w, ln_b)
                if has_norm else (None, None))
        g_ln1 = _ln_param_grads(DM1, flat["x1"], _cat(stats["mu1"]), _cat(stats["rs1"]), ln1_w, ln1_b)
        g_mlp: list[Tensor] = []
        for i in range(n_mlp):
            DA = _cat(grads["da"][i])
            if i:
                H = flat[f"h{i}"]
            else:  # LN1's output; it ran with the bias ln1_b + b_L when folded
                H = _cat(stats["m1"])
                H = H - mlp[-1] if ctx.folded else H
            g_mlp += [DA.t() @ H, DA.sum(0)]
        g_ln2 = _ln_param_grads(DMT, flat["x2"], _cat(stats["mu2"]), _cat(stats["rs2"]), ln2_w, ln2_b)
        g_u = DG.t() @ flat["tM"]
        # input-side gradients: px = [0 | k_f | v_f] enters as z = qn − px and x1 = M + v_f + …
        dpx = DZN.neg_()  # DZN is not read after this
        dpx[:, 2 * hk:] += DX1
        g_px = dpx.view(T, B, -1).transpose(0, 1)
        g_gx = DG.view(T, B, -1).transpose(0, 1)
        return (None, None, g_px, g_gx, g_wqkv, g_bqkv, *g_ln, *g_ln1, *g_ln2, g_u, *g_mlp)
