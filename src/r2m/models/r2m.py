"""R²M (Guo et al., IJCAI 2020): concept encoder, Fusion Memory, Recurrent Memory decoder and
reconstructor, with the Table 2 ablation switches. Equations refer to the paper.

Shapes: B batch, T time steps, K concepts, d model size, H heads, N memory slots, V vocabulary.

Design decisions (where the paper leaves room; see also docs/ARCHITECTURE.md):

* **Encoder.** Shared word embedding (d) → one ``nn.LSTM(d, d)`` over the concepts in the order
  given (the *data pipeline* shuffles them per example, seeded) → hidden state at the last valid
  concept → L2-normalised ``v``. An empty concept set gives ``v = 0`` (used at caption time for
  images with no detected concept). Dropout (``dropout``) on the concept embeddings (the official
  code's keep-prob 0.8 on the encoder LSTM) and, with ``dropout_scope="encoder_output"`` (ours),
  on the decoder memory before ``W_d``; ``"encoder"`` is the official code (none in the decoder,
  but input/output dropout around the LSTM cells of the memory ablations, its DropoutWrapper);
  ``"none"`` is the paper's text (it states no dropout).
* **Initialisation.** ``init="pytorch"``: PyTorch's defaults (embedding N(0, 1)); ``"official"``:
  see :meth:`R2M.official_init`.
* **FM (Eqs. 1–4).** ``x_t = [v; w_{t-1}]`` as 2 tokens; per head ``U_q, U_k, U_v ∈ R^{d×d_k}``
  (no bias), scaled dot-product softmax over the 2 tokens, ``x'_t ∈ R^{2×(H·d_k)}`` is flattened
  row-major (v-row then w-row) to ``2·H·d_k`` and a linear layer (with bias) gives ``f_t ∈ R^d``.
  ``fm_output="flat"`` (the released code: sonnet's RM flattens its input and applies its own input
  Linear) drops that layer: the RM's input Linear takes the ``2·H·d_k`` vector (an LSTM decoder keeps
  it, the released ``fusion`` layer). ``fm_attention="sonnet"`` reads the unpublished
  ``MultiHeadAttention_dec`` as sonnet's ``_multihead_attention``: q/k/v from one Linear with a bias
  and a LayerNorm, scaled as the RM's (``rm_scale``).
  FM does not depend on the memory, so with teacher forcing it runs for all T steps at once.
* **RM (Eqs. 5–7)**, sonnet ``RelationalMemory`` style with one attention block: memory
  ``M ∈ R^{N×d}``, ``M_0 = 0``; a single linear layer gives q/k/v of every row, followed by a
  LayerNorm over the whole q/k/v vector (as sonnet); queries come from the N memory rows only,
  keys/values from ``[M_{t-1}; f_t]`` (N+1 rows) (``qkv_norm=False``: no LayerNorm, Eqs. 5–6); key size ``d_k``, value size ``d/H`` per head
  (so the heads concatenate back to d); ``M1 = LN(M + attn)``, ``M̃ = LN(M1 + MLP(M1))`` with an
  MLP of ``mlp_layers`` linear layers of width d and ReLU between; relational gate
  ``g = σ(W f_t + U tanh(M_{t-1}) + b)`` (``W`` with the bias ``b``, ``U`` without; the forget
  half of ``b`` starts at 1 like sonnet's ``forget_bias``), ``M_t = g_i ⊙ tanh(M̃) + g_f ⊙ M_{t-1}``.
  When the input size differs from d (reconstructor with N > 1) the input is first projected to d
  (``rm_input="when_needed"``, ours: at d = input size we skip it, which gives the paper's 27.3M);
  The attention scales q by ``1/√d_k`` (``rm_scale="key"``: Eq. 5, sonnet from 1.27 on, incl. the
  1.34 the released code's environment pins) or by ``1/√(2·d_k + d_v)`` (``"qkv"``: sonnet up to 1.26).
  ``rm_input="always"`` is sonnet's ``RelationalMemory`` (an input Linear before attention in every
  RM unit, the official code; not equivalent to skipping it: without it the input's keys/values
  share the memory's q/k/v layer).
  The input-side terms (its k/v and ``W f_t + b``) are computed for all steps at once. With one
  slot (the paper's N = 1) and no attention records, a whole teacher-forced recurrence is one
  autograd node, :class:`r2m.models.rm_fused.RMRecurrence` (same function, ~4× fewer operators per
  step: closed-form attention over the two keys, hand-written backward through time); N > 1,
  ``need_weights`` and autocast use the step-wise :meth:`RelationalMemory.step`.
* **Output (Eq. 8).** ``logits = W_d · flatten(M_t)`` (+ a bias, ``out_bias=True``, ours and the
  official code's ``softmax_b``; Eq. 8 has none).
* **Reconstructor (Eq. 9).** A second RM with its own parameters over the decoder memories,
  ``M^r_t = RM(M^r_{t-1}, M^d_t)``; ``ṽ`` = its output at each caption's last valid step
  (gathered by length; the recurrence is causal so padding after it cannot change it), projected
  to d when ``N·d ≠ d`` (identity at N = 1) and L2-normalised like ``v``.
* **Image projection v̂^I.** pooled CNN feature → linear ``image_dim → d`` → L2-normalise;
  ``learned`` (default) or ``frozen_random``: a fixed random matrix drawn from
  ``image_proj_seed``, neither trained nor saved (the official code's behaviour; the training
  stages give train_m and train_i different seeds, so the last stage redraws it as the official
  code does).

(Over 450 lines on purpose: one model per file — the encoder, Fusion Memory, the Recurrent Memory
unit, decoder and reconstructor, their ablation switches and both initialisations belong together.)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from r2m.models.rm_fused import RMRecurrence, RMShape, head_matrix
from r2m.text.vocab import END, PAD, START

# Table 2 ablations: variant name -> config switches (names match r2m.params.VARIANT_NAMES)
VARIANTS: dict[str, dict[str, str]] = {
    "r2m": {},
    "no_fm": {"fm": "linear"},
    "d_lstm": {"decoder_memory": "lstm"},
    "r_lstm": {"reconstructor_memory": "lstm"},
    "dr_lstm": {"decoder_memory": "lstm", "reconstructor_memory": "lstm"},
}


@dataclass
class R2MConfig:
    vocab_size: int
    d: int = 512
    heads: int = 2
    d_k: int = 256
    memory_slots: int = 1
    dropout: float = 0.2
    mlp_layers: int = 2
    fm: Literal["attention", "linear"] = "attention"
    decoder_memory: Literal["rm", "lstm"] = "rm"
    reconstructor_memory: Literal["rm", "lstm"] = "rm"
    image_dim: int = 0  # 0: no image projection (text stages)
    image_proj: Literal["learned", "frozen_random"] = "learned"
    image_proj_seed: int = 0
    init: Literal["pytorch", "official"] = "pytorch"
    dropout_scope: Literal["encoder_output", "encoder", "none"] = "encoder_output"
    rm_input: Literal["when_needed", "always"] = "when_needed"  # the RM units' input Linear
    qkv_norm: bool = True  # LayerNorm over the RM's q/k/v (sonnet; Eqs. 5-6 have none)
    out_bias: bool = True  # a bias in W_d (Eq. 8 has none)
    rm_scale: Literal["key", "qkv"] = "key"  # RM attention scale 1/sqrt(d_k) or 1/sqrt(2 d_k + d_v)
    fm_output: Literal["fc", "flat"] = "fc"  # FM -> RM: Eq. 4's FC, or the heads flattened into the RM's input
    fm_attention: Literal["paper", "sonnet"] = "paper"  # FM's q/k/v: Eqs. 1-3, or sonnet's (bias + LayerNorm)

    def __post_init__(self) -> None:
        if self.d % self.heads:
            raise ValueError(f"R2MConfig: d={self.d} must be divisible by heads={self.heads}")
        for name, allowed in (("fm", ("attention", "linear")), ("decoder_memory", ("rm", "lstm")),
                              ("reconstructor_memory", ("rm", "lstm")),
                              ("image_proj", ("learned", "frozen_random")),
                              ("init", ("pytorch", "official")),
                              ("dropout_scope", ("encoder_output", "encoder", "none")),
                              ("rm_input", ("when_needed", "always")), ("rm_scale", ("key", "qkv")),
                              ("fm_output", ("fc", "flat")), ("fm_attention", ("paper", "sonnet"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"R2MConfig.{name}={getattr(self, name)!r}: choose from {allowed}")

    @classmethod
    def for_variant(cls, variant: str, **kwargs: Any) -> R2MConfig:
        if variant not in VARIANTS:
            raise KeyError(f"unknown R2M variant {variant!r}; known: {', '.join(VARIANTS)}")
        return cls(**{**kwargs, **VARIANTS[variant]})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> R2MConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sonnet_linear_init(module: nn.Module) -> None:
    """Every ``nn.Linear`` in ``module`` as sonnet's ``snt.Linear`` initialises it: weights from a
    normal of σ = 1/√fan_in truncated at ±2σ (TF's ``truncated_normal``), biases zero."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.Linear):
                std = 1.0 / math.sqrt(m.in_features)
                nn.init.trunc_normal_(m.weight, std=std, a=-2 * std, b=2 * std)
                if m.bias is not None:
                    m.bias.zero_()


# --------------------------------------------------------------------------- fusion (Eqs. 1-4)
class FusionMemory(nn.Module):
    """Multi-head self-attention over the two tokens [v; w_{t-1}], then FC → f_t.

    ``attention="paper"``: Eqs. 1–3, bias-free U_q, U_k, U_v; ``"sonnet"``: the released code's unpublished
    ``MultiHeadAttention_dec`` read as sonnet's ``_multihead_attention`` (the file it lives in is a copy of
    sonnet's relational_memory.py): one Linear with a bias, a LayerNorm over each token's q/k/v, no output
    layer. ``fc=False`` drops Eq. 4's FC: the output is the two tokens' heads flattened (2·H·d_k), which
    the RM's input Linear takes (``fidelity.fm_output: flat``)."""

    def __init__(self, d: int, heads: int, d_k: int, fc: bool = True, attention: str = "paper",
                 scale: str = "key") -> None:
        super().__init__()
        self.h, self.dk = heads, d_k
        sonnet = attention == "sonnet"
        # sonnet's form scales as the RM of the same file does (fidelity.rm_scale); Eq. 3 by 1/sqrt(d_k)
        self.scale = (3 * d_k) ** -0.5 if sonnet and scale == "qkv" else d_k ** -0.5
        self.qkv = nn.Linear(d, 3 * heads * d_k, bias=sonnet)  # [U_q | U_k | U_v] for all heads
        self.qkv_norm: nn.Module = nn.LayerNorm(3 * heads * d_k) if sonnet else nn.Identity()
        self.fc: nn.Module = nn.Linear(2 * heads * d_k, d) if fc else nn.Identity()
        self.out_dim = d if fc else 2 * heads * d_k

    def _qkv(self, x: Tensor) -> Tensor:
        return self.qkv_norm(self.qkv(x))

    def prepare(self, v: Tensor) -> Tensor:
        """Per-sequence constant part: q/k/v of the concept token, [B, 3, H, d_k]."""
        return self._qkv(v).view(v.shape[0], 3, self.h, self.dk)

    def forward(self, prep: Tensor, w: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """``w``: word embeddings [B, T, d] → f [B, T, d], weights [B, T, H, 2, 2] (query row, key col)."""
        B, T, _ = w.shape
        qkv_w = self._qkv(w).view(B, T, 3, self.h, self.dk)
        qkv_v = prep.unsqueeze(1).expand(B, T, 3, self.h, self.dk)
        x = torch.stack((qkv_v, qkv_w), dim=4)  # [B, T, 3, H, 2, d_k]
        q, k, val = x.unbind(2)
        att = torch.softmax(q @ k.transpose(-1, -2) * self.scale, dim=-1)  # [B, T, H, 2, 2]
        out = (att @ val).transpose(2, 3).reshape(B, T, 2 * self.h * self.dk)  # rows v, w; heads concat
        return self.fc(out), (att if need_weights else None)


class LinearFusion(nn.Module):
    """Ablation "D w/o FM": f_t = Linear([v; w_{t-1}]); ``fc=False``: f_t = [v; w_{t-1}] itself, which the
    RM's input Linear takes (the released code's ``abla_wo_fmc`` concatenates and feeds the RM)."""

    def __init__(self, d: int, heads: int, d_k: int, fc: bool = True, attention: str = "paper",
                 scale: str = "key") -> None:
        super().__init__()
        self.d = d
        self.lin = nn.Linear(2 * d, d) if fc else None
        self.out_dim = d if fc else 2 * d

    def prepare(self, v: Tensor) -> Tensor:
        return F.linear(v, self.lin.weight[:, : self.d], self.lin.bias) if self.lin is not None else v

    def forward(self, prep: Tensor, w: Tensor, need_weights: bool = False) -> tuple[Tensor, None]:
        if self.lin is None:
            return torch.cat((prep.unsqueeze(1).expand(-1, w.shape[1], -1), w), -1), None
        return prep.unsqueeze(1) + F.linear(w, self.lin.weight[:, self.d:]), None


FUSIONS: dict[str, type[nn.Module]] = {"attention": FusionMemory, "linear": LinearFusion}


# --------------------------------------------------------------------------- memories (Eqs. 5-7)
class RelationalMemory(nn.Module):
    """RM unit: state ``(M,)`` with M [B, N, d]; output flatten(M_t) [B, N·d]."""

    def __init__(self, input_dim: int, d: int, slots: int, heads: int, d_k: int, mlp_layers: int,
                 input_linear: str = "when_needed", qkv_norm: bool = True, scale: str = "key") -> None:
        super().__init__()
        self.d, self.n, self.h, self.dk, self.dv = d, slots, heads, d_k, d // heads
        self.qkv_scale = scale == "qkv"  # sonnet <= 1.26: q * (2 d_k + d_v)^-1/2; later (and Eq. 5): q * d_k^-1/2
        self.scale = RMShape(d, heads, d_k, self.dv, qkv_scale=self.qkv_scale).scale
        self.out_dim = slots * d
        always = input_linear == "always"  # sonnet: an input Linear whatever the sizes
        self.inp = nn.Linear(input_dim, d) if always or input_dim != d else nn.Identity()
        self.qkv = nn.Linear(d, heads * (2 * d_k + self.dv))
        self.qkv_norm = nn.LayerNorm(heads * (2 * d_k + self.dv)) if qkv_norm else nn.Identity()
        layers: list[nn.Module] = []
        for i in range(mlp_layers):
            layers += [nn.Linear(d, d)] + ([nn.ReLU()] if i < mlp_layers - 1 else [])
        self.mlp = nn.Sequential(*layers)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.gate_in = nn.Linear(d, 2 * d)  # W_i, W_f and b_i, b_f
        self.gate_mem = nn.Linear(d, 2 * d, bias=False)  # U_i, U_f
        # per-head scaled dot product as one mm (closed-form one-slot attention); not saved
        self.register_buffer("head_sum", head_matrix(RMShape(d, heads, d_k, self.dv, qkv_scale=self.qkv_scale),
                                                     torch.empty(0)), persistent=False)
        keep_kv = torch.ones(heads * (2 * d_k + self.dv))
        keep_kv[: heads * d_k] = 0
        self.register_buffer("keep_kv", keep_kv, persistent=False)  # zeroes the query part of q/k/v
        with torch.no_grad():
            self.gate_in.bias[d:].fill_(1.0)  # sonnet forget_bias

    def official_init(self) -> None:
        """sonnet's ``Linear`` default: weights truncated normal σ = 1/√fan_in, zero biases (the
        forget half of the gate bias keeps sonnet's ``forget_bias`` 1)."""
        sonnet_linear_init(self)
        with torch.no_grad():
            self.gate_in.bias[self.d:].fill_(1.0)

    def init_state(self, batch: int, like: Tensor) -> tuple[Tensor, ...]:
        return (like.new_zeros(batch, self.n, self.d),)

    def _split(self, qkv: Tensor) -> tuple[Tensor, ...]:
        # torch.split (not slicing): its backward is one cat, slicing's would zero-fill per piece
        hk = self.h * self.dk
        return qkv.split((hk, hk, self.h * self.dv), dim=-1)

    def precompute(self, x: Tensor) -> tuple[Tensor, ...]:
        """Input-side terms for all steps: keys [B,T,H·d_k], values [B,T,H·d_v], gate input [B,T,2d]."""
        x = self.inp(x)
        _, k, v = self._split(self.qkv_norm(self.qkv(x)))
        return k, v, self.gate_in(x)

    def can_fuse(self, need_weights: bool, x: Tensor) -> bool:
        """Whether :meth:`run_fused` computes this unit's recurrence: one slot, no attention
        records, an MLP, no autocast, inputs in the unit's dtype (the generic step-wise path covers
        everything else)."""
        return (self.n == 1 and not need_weights and len(self.mlp) > 0 and x.dtype == self.head_sum.dtype
                and not torch.is_autocast_enabled(x.device.type))

    def precompute_fused(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Input-side terms for :class:`RMRecurrence`: ``[0 | k | v]`` [B, T, F] (the input's
        normalised q/k/v with the query part zeroed) and the gate input ``W x + b`` [B, T, 2d]."""
        x = self.inp(x)
        return self.qkv_norm(self.qkv(x)) * self.keep_kv, self.gate_in(x)

    def run_fused(self, x: Tensor) -> Tensor:
        """The memory at every step [B, T, d] for inputs [B, T, ·] (N = 1; see :meth:`can_fuse`)."""
        px, gx = self.precompute_fused(x)
        norm = self.qkv_norm if isinstance(self.qkv_norm, nn.LayerNorm) else None
        shape = RMShape(self.d, self.h, self.dk, self.dv, self.norm1.eps, self.qkv_scale)
        mlp = [t for m in self.mlp if isinstance(m, nn.Linear) for t in (m.weight, m.bias)]
        return RMRecurrence.apply(shape, self.head_sum, px, gx, self.qkv.weight, self.qkv.bias,
                                  norm.weight if norm else None, norm.bias if norm else None,
                                  self.norm1.weight, self.norm1.bias, self.norm2.weight, self.norm2.bias,
                                  self.gate_mem.weight, *mlp)

    def step(self, state: tuple[Tensor, ...], pre: tuple[Tensor, ...], need_weights: bool = False):
        (M,) = state
        if self.n == 1 and not need_weights:
            return self._step_one_slot(M, pre)
        k_x, v_x, g_x = pre  # [B, H·d_k], [B, H·d_v], [B, 2d]
        B, N, h, dk, dv = M.shape[0], self.n, self.h, self.dk, self.dv
        q, k, v = self._split(self.qkv_norm(self.qkv(M)))  # [B, N, ·]
        q = q.view(B, N, h, dk).transpose(1, 2) * self.scale  # [B, H, N, d_k]
        k = torch.cat((k, k_x.unsqueeze(1)), 1).view(B, N + 1, h, dk).permute(0, 2, 3, 1)  # [B,H,dk,N+1]
        v = torch.cat((v, v_x.unsqueeze(1)), 1).view(B, N + 1, h, dv).transpose(1, 2)  # [B,H,N+1,dv]
        att = torch.softmax(q @ k, dim=-1)  # [B, H, N, N+1]
        a = (att @ v).transpose(1, 2).reshape(B, N, h * dv)
        m1 = self.norm1(M + a)
        m_tilde = self.norm2(m1 + self.mlp(m1))
        gi, gf = (self.gate_mem(torch.tanh(M)) + g_x.unsqueeze(1)).chunk(2, dim=-1)
        M_new = torch.sigmoid(gi) * torch.tanh(m_tilde) + torch.sigmoid(gf) * M
        return (M_new,), M_new.reshape(B, N * self.d), (att if need_weights else None)


    def _step_one_slot(self, M: Tensor, pre: tuple[Tensor, ...]):
        """:meth:`step` with N = 1 and no weights, in closed form (as :class:`RMRecurrence` computes
        it, under autograd): over the two keys ``[M; f]`` the softmax is a sigmoid of the score
        difference, ``a = v_f + σ(q·(k_M − k_f)/√d_k) ⊙ (v_M − v_f)``."""
        k_x, v_x, g_x = pre  # [B, H·d_k], [B, H·d_v], [B, 2d]
        m = M.reshape(M.shape[0], self.d)
        q, k, v = self._split(self.qkv_norm(self.qkv(m)))
        vd = v - v_x
        x1 = torch.addcmul(m + v_x, torch.sigmoid((q * (k - k_x)) @ self.head_sum), vd)
        m1 = self.norm1(x1)
        m_tilde = self.norm2(m1 + self.mlp(m1))
        gi, gf = torch.addmm(g_x, torch.tanh(m), self.gate_mem.weight.t()).chunk(2, dim=-1)
        M_new = torch.sigmoid(gi) * torch.tanh(m_tilde) + torch.sigmoid(gf) * m
        return (M_new.unsqueeze(1),), M_new, None


class LSTMMemory(nn.Module):
    """Ablation "w/o Memory in RM": an LSTM cell (hidden N·d) with the RM unit's interface."""

    def __init__(self, input_dim: int, d: int, slots: int, heads: int, d_k: int, mlp_layers: int,
                 input_linear: str = "when_needed", qkv_norm: bool = True, scale: str = "key") -> None:  # RM-only
        super().__init__()
        self.out_dim = slots * d
        self.ih = nn.Linear(input_dim, 4 * self.out_dim)
        self.hh = nn.Linear(self.out_dim, 4 * self.out_dim, bias=False)
        # input/output dropout of the official code's DropoutWrapper (set by R2M for dropout_scope=encoder)
        self.io_drop: nn.Module = nn.Identity()

    def official_init(self) -> None:
        """TF BasicLSTMCell: zero bias plus forget_bias 1 on the forget gate."""
        with torch.no_grad():
            self.ih.bias.zero_()
            self.ih.bias[self.out_dim: 2 * self.out_dim].fill_(1.0)

    def init_state(self, batch: int, like: Tensor) -> tuple[Tensor, ...]:
        z = like.new_zeros(batch, self.out_dim)
        return (z, z)

    def precompute(self, x: Tensor) -> tuple[Tensor, ...]:
        return (self.ih(self.io_drop(x)),)

    def step(self, state: tuple[Tensor, ...], pre: tuple[Tensor, ...], need_weights: bool = False):
        h, c = state
        i, f, g, o = (pre[0] + self.hh(h)).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return (h, c), self.io_drop(h), None


MEMORIES: dict[str, type[nn.Module]] = {"rm": RelationalMemory, "lstm": LSTMMemory}


def _at(pre: tuple[Tensor, ...], t: int) -> tuple[Tensor, ...]:
    return tuple(p[:, t] for p in pre)


# --------------------------------------------------------------------------- the model
class R2M(nn.Module):
    def __init__(self, cfg: R2MConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, md = cfg.d, cfg.memory_slots * cfg.d
        mem_args = dict(d=d, slots=cfg.memory_slots, heads=cfg.heads, d_k=cfg.d_k, mlp_layers=cfg.mlp_layers,
                        input_linear=cfg.rm_input, qkv_norm=cfg.qkv_norm, scale=cfg.rm_scale)
        self.embed = nn.Embedding(cfg.vocab_size, d, padding_idx=PAD)
        self.encoder = nn.LSTM(d, d, batch_first=True)
        # fm_output flat: the RM decoder's input Linear takes the FM's flattened heads; an LSTM decoder keeps
        # the FC (the released code's 'fusion' layer of its abla_lstm_dec)
        fc = cfg.fm_output == "fc" or cfg.decoder_memory == "lstm"
        self.fusion = FUSIONS[cfg.fm](d, cfg.heads, cfg.d_k, fc=fc, attention=cfg.fm_attention, scale=cfg.rm_scale)
        self.decoder = MEMORIES[cfg.decoder_memory](input_dim=self.fusion.out_dim, **mem_args)
        self.out = nn.Linear(md, cfg.vocab_size, bias=cfg.out_bias)  # W_d
        self.reconstructor = MEMORIES[cfg.reconstructor_memory](input_dim=md, **mem_args)
        self.rec_proj = nn.Identity() if md == d else nn.Linear(md, d)
        self.drop: nn.Module = nn.Dropout(cfg.dropout) if cfg.dropout_scope != "none" else nn.Identity()
        # dropout before W_d: ours (encoder_output); the official code has none there
        self.out_drop: nn.Module = self.drop if cfg.dropout_scope == "encoder_output" else nn.Identity()
        if cfg.dropout_scope == "encoder":
            for mem in (self.decoder, self.reconstructor):
                if isinstance(mem, LSTMMemory):
                    mem.io_drop = nn.Dropout(cfg.dropout)
        if cfg.init == "official":
            self.official_init()
        if cfg.image_dim and cfg.image_proj == "learned":
            self.image_proj = nn.Linear(cfg.image_dim, d)
        elif cfg.image_dim:
            g = torch.Generator().manual_seed(cfg.image_proj_seed)
            w = torch.randn(d, cfg.image_dim, generator=g) / math.sqrt(cfg.image_dim)
            self.register_buffer("image_proj_weight", w, persistent=False)

    # ------------------------------------------------------------------ pieces
    def official_init(self) -> None:
        """The released code's initialisation: word embedding and output weights U(±0.08) (its
        ``softmax_w`` is a transposed U(±0.08) embedding), output bias U(±sqrt(3/V)) (TF's
        glorot default for a [V] variable), LSTMs with zero bias and forget-gate bias 1
        (``BasicLSTMCell(forget_bias=1)``); the memory units (FM and RM layers) as sonnet's
        ``Linear`` (:func:`sonnet_linear_init`; the RM gates keep sonnet's forget bias 1)."""
        with torch.no_grad():
            nn.init.uniform_(self.embed.weight, -0.08, 0.08)
            self.embed.weight[PAD].zero_()  # padding row stays 0 (nothing reads it)
            nn.init.uniform_(self.out.weight, -0.08, 0.08)
            if self.out.bias is not None:
                lim = math.sqrt(3.0 / self.cfg.vocab_size)
                nn.init.uniform_(self.out.bias, -lim, lim)
            d = self.cfg.d
            for name, p in self.encoder.named_parameters():
                if name.startswith("bias"):
                    p.zero_()
                    if name.startswith("bias_ih"):
                        p[d: 2 * d].fill_(1.0)  # gate order i, f, g, o
            for mem in (self.decoder, self.reconstructor):
                if isinstance(mem, LSTMMemory):
                    mem.official_init()
        sonnet_linear_init(self.fusion)
        for mem in (self.decoder, self.reconstructor):
            if isinstance(mem, RelationalMemory):
                mem.official_init()

    def param_count(self, include_image_proj: bool = True) -> int:
        return sum(p.numel() for n, p in self.named_parameters()
                   if p.requires_grad and (include_image_proj or not n.startswith("image_proj")))

    def encode(self, concepts: Tensor, lengths: Tensor) -> Tensor:
        """Concept ids [B, K] (padded with 0, order = LSTM order) and counts [B] → v [B, d]."""
        B = concepts.shape[0]
        if concepts.shape[1] == 0:
            return self.embed.weight.new_zeros(B, self.cfg.d)
        out, _ = self.encoder(self.drop(self.embed(concepts)))  # [B, K, d]
        idx = (lengths - 1).clamp(min=0).view(B, 1, 1).expand(B, 1, out.shape[-1])
        h = out.gather(1, idx).squeeze(1) * (lengths > 0).unsqueeze(1).to(out.dtype)
        return F.normalize(h, dim=-1)

    def project_image(self, feats: Tensor) -> Tensor:
        """Pooled CNN features [B, image_dim] → v̂^I [B, d] (L2-normalised)."""
        if not self.cfg.image_dim:
            raise RuntimeError("R2M: model built without an image projection (image_dim=0)")
        if self.cfg.image_proj == "learned":
            x = self.image_proj(feats.to(self.image_proj.weight.dtype))
        else:
            x = F.linear(feats.to(self.image_proj_weight.dtype), self.image_proj_weight)
        return F.normalize(x, dim=-1)

    def logits(self, hidden: Tensor) -> Tensor:
        """Decoder memories [..., N·d] → logits [..., V] (Eq. 8)."""
        return self.out(self.out_drop(hidden))

    def run_memory(self, mem: nn.Module, x: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """Run a memory unit over inputs [B, T, ·] → outputs [B, T, N·d], weights [B, T, H, N, N+1]."""
        B, T = x.shape[:2]
        if isinstance(mem, RelationalMemory) and mem.can_fuse(need_weights, x):
            return mem.run_fused(x), None
        # unbind once: indexing p[:, t] in the loop would make backward allocate a full-size zero
        # gradient per step (O(T²) memory traffic)
        pre = list(zip(*(p.unbind(1) for p in mem.precompute(x)), strict=True))
        state = mem.init_state(B, x)
        outs, atts = [], []
        for t in range(T):
            state, o, a = mem.step(state, pre[t], need_weights)
            outs.append(o)
            atts.append(a)
        weights = torch.stack(atts, 1) if need_weights and atts and atts[0] is not None else None
        return torch.stack(outs, 1), weights

    def reconstruct_raw(self, dec_hidden: Tensor, lengths: Tensor) -> Tensor:
        """Eq. 9 over decoder memories [B, T, N·d]; ṽ at step ``lengths-1`` → [B, d], unnormalised
        (the official losses use it as it is)."""
        rec, _ = self.run_memory(self.reconstructor, dec_hidden)
        B = rec.shape[0]
        idx = (lengths - 1).clamp(min=0).view(B, 1, 1).expand(B, 1, rec.shape[-1])
        return self.rec_proj(rec.gather(1, idx).squeeze(1))

    def reconstruct(self, dec_hidden: Tensor, lengths: Tensor) -> Tensor:
        """:meth:`reconstruct_raw`, L2-normalised like ``v``."""
        return F.normalize(self.reconstruct_raw(dec_hidden, lengths), dim=-1)

    # ------------------------------------------------------------------ teacher forcing (L_XE, L_S)
    def forward(self, concepts: Tensor, concept_lens: Tensor, inputs: Tensor, lengths: Tensor,
                need_weights: bool = False, reconstruct: bool = True) -> dict[str, Tensor | None]:
        """Teacher-forced pass. ``inputs`` [B, T] = <#start> w_1 … (padded), ``lengths`` [B] valid steps.

        Returns ``hidden`` [B, T, N·d] (apply :meth:`logits`, ideally on valid positions only),
        ``v`` [B, d], ``v_tilde`` [B, d] (None unless ``reconstruct``), ``fm`` / ``rm`` weights.
        """
        v = self.encode(concepts, concept_lens)
        f, fm_w = self.fusion(self.fusion.prepare(v), self.embed(inputs), need_weights)
        hidden, rm_w = self.run_memory(self.decoder, f, need_weights)
        raw = self.reconstruct_raw(hidden, lengths) if reconstruct else None
        v_tilde = F.normalize(raw, dim=-1) if raw is not None else None
        return {"hidden": hidden, "v": v, "v_tilde": v_tilde, "v_tilde_raw": raw, "fm": fm_w, "rm": rm_w}

    # ------------------------------------------------------------------ step-wise decoding
    def decode_init(self, v: Tensor) -> tuple[Tensor, ...]:
        """Decoder state for free-running decoding: a tuple of tensors, batch first."""
        return (self.fusion.prepare(v), *self.decoder.init_state(v.shape[0], v))

    def decode_step(self, state: tuple[Tensor, ...], prev: Tensor, need_weights: bool = False):
        """One step from previous tokens [B] → (hidden [B, N·d], new state, fm weights, rm weights)."""
        prep, mem_state = state[0], state[1:]
        f, fm_w = self.fusion(prep, self.embed(prev).unsqueeze(1), need_weights)
        mem_state, h, rm_w = self.decoder.step(mem_state, _at(self.decoder.precompute(f), 0), need_weights)
        return h, (prep, *mem_state), (fm_w[:, 0] if fm_w is not None else None), rm_w

    STOP_CHECK_EVERY = 8

    def greedy(self, v: Tensor, max_len: int, reconstruct: bool = True, stop_early: bool = True) -> dict[str, Tensor | None]:
        """Free-running greedy decoding from ``v`` with gradients through the hidden states (L_M, L_I).

        Returns ``tokens`` [B, T] (after the first <#end>: <pad>), ``lengths`` [B] (up to and including
        the first <#end>, else T), ``hidden`` [B, T, N·d], ``logprobs`` [B, T] of the chosen words,
        ``v_tilde`` [B, d].
        """
        B = v.shape[0]
        state = self.decode_init(v)
        prev = torch.full((B,), START, dtype=torch.long, device=v.device)
        done = torch.zeros(B, dtype=torch.bool, device=v.device)
        hs, toks, lps = [], [], []
        # the early-stop test reads ``done`` on the host: on CPU every step; on an accelerator only
        # every STOP_CHECK_EVERY steps, so the queue of kernels is not drained each step (steps
        # after every caption ended only add <pad> columns: lengths, ṽ and the loss are unchanged)
        check = 1 if v.device.type == "cpu" else self.STOP_CHECK_EVERY
        for t in range(max_len):
            h, state, _, _ = self.decode_step(state, prev)
            lp = torch.log_softmax(self.logits(h).float(), dim=-1)
            tok_lp, tok = lp.max(dim=-1)
            tok = tok.masked_fill(done, PAD)
            hs.append(h), toks.append(tok), lps.append(tok_lp)
            done = done | (tok == END)
            prev = tok
            if stop_early and (t + 1) % check == 0 and bool(done.all()):
                break
        tokens = torch.stack(toks, 1)
        is_end = tokens == END
        T = tokens.shape[1]
        first_end = torch.where(is_end.any(1), is_end.float().argmax(1) + 1, torch.full_like(done, T, dtype=torch.long))
        hidden = torch.stack(hs, 1)
        raw = self.reconstruct_raw(hidden, first_end) if reconstruct else None
        return {"tokens": tokens, "lengths": first_end, "hidden": hidden, "logprobs": torch.stack(lps, 1),
                "v_tilde": F.normalize(raw, dim=-1) if raw is not None else None, "v_tilde_raw": raw}

    # ------------------------------------------------------------------ checkpoints
    def checkpoint(self, **meta: Any) -> dict[str, Any]:
        """A ``torch.load(weights_only=True)``-safe dict: tensors + plain config."""
        return {"model": "r2m", "config": self.cfg.to_dict(),
                "state_dict": {k: v.detach().cpu() for k, v in self.state_dict().items()}, **meta}

    @classmethod
    def from_config(cls, cfg: R2MConfig | dict[str, Any]) -> R2M:
        return cls(cfg if isinstance(cfg, R2MConfig) else R2MConfig.from_dict(cfg))

    @classmethod
    def from_checkpoint(cls, ckpt: dict[str, Any], **overrides: Any) -> R2M:
        """Rebuild from :meth:`checkpoint`; ``overrides`` may add an image projection (keys missing
        from the checkpoint are allowed only for ``image_proj``)."""
        cfg = R2MConfig.from_dict({**ckpt["config"], **overrides})
        model = cls(cfg)
        try:
            missing, unexpected = model.load_state_dict(ckpt["state_dict"], strict=False)
        except RuntimeError as err:  # shape mismatches
            raise ValueError(f"R2M checkpoint does not match the config {cfg}: {err}") from None
        bad = [k for k in missing if not k.startswith("image_proj")]
        if cfg.image_dim != ckpt["config"].get("image_dim"):
            unexpected = [k for k in unexpected if not k.startswith("image_proj")]
        if bad or unexpected:
            raise ValueError(f"R2M checkpoint does not match the config: missing {bad}, unexpected {unexpected}")
        return model

