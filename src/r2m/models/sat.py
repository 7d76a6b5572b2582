"""Show, Attend and Tell (Xu et al., ICML 2015), deterministic "soft" attention.

Shapes: B batch, T time steps, L annotation locations (h·w of the CNN grid), D annotation size,
m embedding size, n LSTM size, A attention size, V vocabulary.

Equations (seed paper): the annotations ``a_i`` are the CNN grid cells (the paper: VGG conv5_4,
14×14×512; any feature backend that writes a ``grid`` works). Per step t, from ``y_{t-1}``,
``h_{t-1}``, ``c_{t-1}``:

* attention ``e_ti = f_att(a_i, h_{t-1})``, ``α_t = softmax_i(e_t)`` over the valid locations
  (masked locations get exactly 0);
* gating ``β_t = σ(f_β(h_{t-1}))`` and context ``ẑ_t = β_t · Σ_i α_ti a_i`` (Sec. 4.2.1);
* LSTM (Eq. 1) on the input ``[E y_{t-1}; ẑ_t]`` (the recurrent ``h_{t-1}`` enters as usual);
* deep output (Eq. 2) ``p(y_t) ∝ exp(L_o(E y_{t-1} + L_h h_t + L_z ẑ_t))``;
* initial state ``c_0 = f_init,c(mean_i a_i)``, ``h_0 = f_init,h(mean_i a_i)``;
* loss (Eq. 9) ``−log p(y|a) + λ Σ_i (1 − Σ_t α_ti)²``.

Where the paper leaves a detail open we follow the authors' released Theano code
(arctic-captions) and say so here:

* ``f_att(a, h) = w·tanh(W_a a + W_h h + b) + c`` (one hidden layer of size A = D by default);
  ``W_a a + b`` is computed once per image.
* ``f_init,c``, ``f_init,h``: one linear layer each with tanh; ``f_β``: one linear layer.
* deep output: ``tanh`` on ``E y_{t-1} + L_h h_t + L_z ẑ_t``, dropout, then ``L_o`` (the released
  code's ``prev2out`` / ``ctx2out`` with a tanh); dropout also on ``h_t`` before ``L_h``.
* λ = 1 (the released training scripts' ``alpha_c``); the regulariser is summed over the valid
  locations of each image (Σ_t over its valid steps, i.e. the words and <#end>). The paper sums
  Eq. 9 per caption; the shared training loop averages the cross-entropy per word, so the
  regulariser (``aux["dsr"]``) is divided by the same word count: the ratio of the two terms is
  the paper's.
* ``feature_norm`` (our addition, not the seed's: off in the params, so on the benchmarks; the
  ``tiny`` entries turn it on, where it helps): each annotation vector is standardised over its D
  channels (a LayerNorm without parameters) before anything else, so backends whose features
  have very different scales (a random CNN: ~0.03; VGG conv5: tens) train with the same settings.
* The hard (stochastic) attention variant is its own model, ``sat_hard`` (:mod:`r2m.models.sat_hard`).

Decoding interface (shared with :func:`r2m.captioning.beam.beam_search`): ``decode_init(a)`` takes the
annotations ``[B, L, D]`` (or a grid ``[B, h, w, D]``) and returns a batch-first state tuple that
carries the annotations, their attention projection and the location mask;
``decode_step(state, prev)`` returns ``(o_t, state, α_t, β_t)`` where ``o_t`` is the deep-output
pre-activation and ``logits(o_t)`` the word scores.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from r2m.models.supervised import SupervisedCaptioner, valid_mask
from r2m.text.vocab import PAD, START


@dataclass
class SATConfig:
    vocab_size: int
    feat_dim: int = 512  # D
    embed: int = 512  # m
    hidden: int = 1000  # n
    att_dim: int = 0  # A; 0 = D (as the released code)
    dropout: float = 0.5
    dsr_lambda: float = 1.0  # λ of Eq. 9
    selector: bool = True  # the gating scalar β
    feature_norm: bool = True  # standardise each annotation vector over its D channels (no parameters)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "feat_dim", "embed", "hidden"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SATConfig.{name}={getattr(self, name)} must be positive")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"SATConfig.dropout={self.dropout} must be in [0, 1)")
        if self.dsr_lambda < 0:
            raise ValueError(f"SATConfig.dsr_lambda={self.dsr_lambda} must be >= 0")


def flatten_grid(a: Tensor) -> Tensor:
    """A grid ``[B, h, w, D]`` → annotations ``[B, h·w, D]`` (``[B, L, D]`` passes through)."""
    if a.dim() == 4:
        return a.reshape(a.shape[0], a.shape[1] * a.shape[2], a.shape[3])
    if a.dim() != 3:
        raise ValueError(f"SAT: annotations must be [B, L, D] or [B, h, w, D], got shape {tuple(a.shape)}")
    return a


def doubly_stochastic(alphas: Tensor, step_mask: Tensor | None = None, loc_mask: Tensor | None = None) -> Tensor:
    """Σ_i (1 − Σ_t α_ti)² per example: ``alphas`` [B, T, L], ``step_mask`` [B, T] (valid steps),
    ``loc_mask`` [B, L] (valid locations) → [B]."""
    if step_mask is not None:
        alphas = alphas * step_mask.unsqueeze(-1).to(alphas.dtype)
    pen = (1.0 - alphas.sum(1)) ** 2
    if loc_mask is not None:
        pen = pen * loc_mask.to(pen.dtype)
    return pen.sum(-1)


class SAT(SupervisedCaptioner):
    name = "sat"
    config_cls = SATConfig
    feature_kinds = ("grid",)
    aux_losses = ("dsr",)

    def __init__(self, cfg: SATConfig) -> None:
        super().__init__()
        self.cfg = cfg
        D, m, n = cfg.feat_dim, cfg.embed, cfg.hidden
        A = cfg.att_dim or D
        self.embed = nn.Embedding(cfg.vocab_size, m, padding_idx=PAD)  # E
        self.init_h = nn.Linear(D, n)
        self.init_c = nn.Linear(D, n)
        self.att_a = nn.Linear(D, A)  # W_a, b
        self.att_h = nn.Linear(n, A, bias=False)  # W_h
        self.att_out = nn.Linear(A, 1)  # w, c
        self.beta = nn.Linear(n, 1) if cfg.selector else None  # f_β
        self.lstm = nn.LSTMCell(m + D, n)
        self.out_h = nn.Linear(n, m)  # L_h
        self.out_z = nn.Linear(D, m)  # L_z
        self.out = nn.Linear(m, cfg.vocab_size)  # L_o
        self.drop = nn.Dropout(cfg.dropout)

    @classmethod
    def from_params(cls, section: dict[str, Any], vocab_size: int, shapes: dict[str, tuple[int, ...]]) -> SAT:
        if "grid" not in shapes:
            raise ValueError("Show, Attend and Tell needs a 'grid' of image features; the features file has "
                             f"{sorted(shapes)} (set extract_features.options.kinds: [pooled, grid])")
        return cls(cls.config_cls(vocab_size=vocab_size, feat_dim=int(shapes["grid"][-1]), **section))

    # ------------------------------------------------------------------ pieces
    def encode(self, feats: dict[str, Tensor]) -> Tensor:
        """The annotations [B, L, D] from the feature grid [B, h, w, D]."""
        return flatten_grid(feats["grid"].float())

    def attention(self, pa: Tensor, mask: Tensor, h: Tensor) -> Tensor:
        """α_t [B, L] from ``h_{t-1}`` (``f_att`` then a softmax over the valid locations)."""
        e = self.att_out(torch.tanh(pa + self.att_h(h).unsqueeze(1))).squeeze(-1)  # [B, L]
        e = e.masked_fill(mask <= 0, float("-inf"))
        return torch.softmax(e, dim=-1)

    def context(self, a: Tensor, weights: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        """ẑ_t = β_t · Σ_i w_i a_i for location weights ``weights`` [B, L] (α: soft attention; a one-hot
        s_t: hard) → (ẑ_t [B, D], β_t [B])."""
        z = (weights.unsqueeze(-1) * a).sum(1)
        beta = torch.sigmoid(self.beta(h)).squeeze(-1) if self.beta is not None else torch.ones_like(z[:, 0])
        return beta.unsqueeze(-1) * z, beta

    def attend(self, a: Tensor, pa: Tensor, mask: Tensor, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Soft attention from ``h_{t-1}`` → context ẑ_t [B, D], α_t [B, L], β_t [B]."""
        alpha = self.attention(pa, mask, h)
        z, beta = self.context(a, alpha, h)
        return z, alpha, beta

    def logits(self, o: Tensor) -> Tensor:
        """Deep-output pre-activations [..., m] → word logits [..., V] (Eq. 2)."""
        return self.out(self.drop(torch.tanh(o)))

    # ------------------------------------------------------------------ step-wise decoding
    def decode_init(self, a: Tensor, mask: Tensor | None = None) -> tuple[Tensor, ...]:
        """Annotations [B, L, D] (or grid [B, h, w, D]), optional location mask [B, L] (1 = valid)
        → state ``(a, W_a a + b, mask, h_0, c_0)``."""
        a = flatten_grid(a).to(self.init_h.weight.dtype)
        if self.cfg.feature_norm:
            a = F.layer_norm(a, a.shape[-1:])
        if mask is None:
            mask = a.new_ones(a.shape[:2])
        mask = mask.to(a.dtype)
        mean = (a * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp(min=1.0)
        return a, self.att_a(a), mask, torch.tanh(self.init_h(mean)), torch.tanh(self.init_c(mean))

    def decode_step(self, state: tuple[Tensor, ...], prev: Tensor, need_weights: bool = False):
        """Previous words [B] → (deep-output pre-activation [B, m], new state, α_t [B, L], β_t [B])."""
        a, pa, mask, h, c = state
        z, alpha, beta = self.attend(a, pa, mask, h)
        o, h, c = self.advance(prev, z, h, c)
        return o, (a, pa, mask, h, c), alpha, beta

    def advance(self, prev: Tensor, z: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The LSTM step (Eq. 1) on ``[E y_{t-1}; ẑ_t]`` and the deep output (Eq. 2) → (o_t, h_t, c_t)."""
        ey = self.embed(prev)
        h, c = self.lstm(torch.cat((ey, z), -1), (h, c))
        o = ey + self.out_h(self.drop(h)) + self.out_z(z)
        return o, h, c

    # ------------------------------------------------------------------ teacher forcing
    def forward(self, a: Tensor, inputs: Tensor, lengths: Tensor | None = None,
                mask: Tensor | None = None) -> dict[str, Any]:
        """``inputs`` [B, T] = <#start> w_1 … (padded), ``lengths`` [B] valid steps (None: all) →
        ``logits`` [B, T, V], ``hidden`` [B, T, m], ``alpha`` [B, T, L], ``beta`` [B, T] and
        ``aux["dsr"]`` = λ·Σ_b Σ_i (1 − Σ_t α_ti)² / (number of valid words): Eq. 9 divided by the
        word count, like the cross-entropy the training loop averages per word."""
        state = self.decode_init(a, mask)
        outs, alphas, betas = [], [], []
        for prev in inputs.unbind(1):
            o, state, alpha, beta = self.decode_step(state, prev)
            outs.append(o), alphas.append(alpha), betas.append(beta)
        hidden, alpha = torch.stack(outs, 1), torch.stack(alphas, 1)
        B, T = inputs.shape
        steps = valid_mask(lengths, T) if lengths is not None else torch.ones(B, T, dtype=torch.bool,
                                                                                device=inputs.device)
        dsr = doubly_stochastic(alpha.float(), steps, state[2]).sum() / steps.sum().clamp(min=1)
        return {"logits": self.logits(hidden), "hidden": hidden, "alpha": alpha, "beta": torch.stack(betas, 1),
                "aux": {"dsr": self.cfg.dsr_lambda * dsr}}

    # ------------------------------------------------------------------ retrieval
    # forward's teacher forcing is decode_init, decode_step per word and logits: score step-wise
    score_block = SupervisedCaptioner.score_block_stepwise

    @torch.no_grad()
    def attention_of(self, a: Tensor, tokens: Tensor) -> Tensor:
        """α for given captions ``tokens`` [B, T] (w_1 … without <#start>) → [B, T, L] (eval mode)."""
        inputs = torch.cat((torch.full_like(tokens[:, :1], START), tokens[:, :-1]), 1)
        return self.forward(a, inputs)["alpha"]
