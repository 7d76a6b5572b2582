"""Show, Attend and Tell with stochastic "hard" attention (Xu et al. 2015, Sec. 4.1; seed 004).

The network is :class:`r2m.models.sat.SAT`'s (annotations, ``f_att``, LSTM, deep output); only the
context differs. At step t the location ``s_t ~ Multinoulli_L(α_t)`` (Eq. 3) and ``ẑ_t = a_{s_t}``
(Eq. 4). Training maximises the variational lower bound ``L_s = Σ_s p(s|a) log p(y|s, a)`` (Eq. 5)
with the seed's learning rule (one sample s̃ per caption)::

    ∂L_s/∂W ≈ ∂log p(y|s̃,a)/∂W + λ_r (log p(y|s̃,a) − b) ∂log p(s̃|a)/∂W + λ_e ∂H[s̃]/∂W

* ``b``: the moving-average baseline ``b_k = 0.9 b_{k−1} + 0.1 log p(y|s̃_k, a)`` (the batch mean of
  the sampled captions' log-likelihoods), a buffer of the model (saved in ``model.pt`` and in the
  training loop's ``last.pt``, so a resumed run continues it); batch k uses ``b_{k−1}`` (a baseline
  that does not depend on the current sample keeps the estimator unbiased) and then updates it.
* ``H[s̃] = −Σ_t Σ_i α_ti log α_ti``, the entropy of the attention distributions along the caption.
* λ_r = 1 and λ_e = 0.002: the seed only says "set by cross-validation"; these are the authors'
  released code's (arctic-captions: the REINFORCE term enters unscaled, ``alpha_entropy_c = 0.002``).
* the seed's robustness trick: with probability ``expectation_prob`` = 0.5 for a given image, s̃ is
  set to its expected value α for the whole caption (the deterministic soft context of Sec. 4.2);
  such captions get no REINFORCE term (nothing was sampled) and do not update the baseline. (The
  released code draws this once per time step for the whole batch; we follow the paper's text.)
* the regularisers of the soft model (the doubly stochastic penalty, the gate β) are options here
  too (``dsr_lambda``, ``selector``); the paper introduces them for the deterministic model.

As everywhere in the shared training loop, the loss is averaged per word: the surrogate below is
``[−Σ_b log p(y_b|s̃_b) − λ_r Σ_b (log p(y_b|s̃_b) − b) log p(s̃_b|a_b) − λ_e Σ_b H_b] / words``,
whose gradient is minus the learning rule summed over the batch divided by the word count (the
paper's ratio of the terms). ``loss.tsv`` columns: ``xe`` (per-word NLL under the sampled
attention), ``dsr``, ``reinforce`` and ``entropy`` (the surrogate terms; their values are not
losses, only their gradients mean something).

At test time (eval mode: captions, beam search, perplexity, retrieval, validation) the context is
``test_attention``: ``expected`` (default: Σ_i α_i a_i, the NWGM approximation of Sec. 4.2 that
marginalises over locations) or ``argmax`` (the single most probable location). The attention maps
of ``inspect_sup`` show α_t, the distribution s_t is drawn from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from r2m.models.sat import SAT, SATConfig, doubly_stochastic
from r2m.models.supervised import token_logprobs, valid_mask

TEST_ATTENTION = ("expected", "argmax")


@dataclass
class SATHardConfig(SATConfig):
    dsr_lambda: float = 0.0  # the soft model's regulariser (Sec. 4.2.1): off unless asked for
    selector: bool = False  # the soft model's gate β: off unless asked for
    feature_norm: bool = False  # the seed's annotations as they are
    reinforce_lambda: float = 1.0  # λ_r
    entropy_lambda: float = 0.002  # λ_e
    baseline_decay: float = 0.9  # b_k = decay·b_{k−1} + (1 − decay)·log p(y|s̃_k, a)
    expectation_prob: float = 0.5  # per image: s̃ := α (soft) instead of a sample
    test_attention: str = "expected"  # expected | argmax

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.baseline_decay < 1.0:
            raise ValueError(f"SATHardConfig.baseline_decay={self.baseline_decay} must be in [0, 1)")
        if not 0.0 <= self.expectation_prob <= 1.0:
            raise ValueError(f"SATHardConfig.expectation_prob={self.expectation_prob} must be in [0, 1]")
        if self.test_attention not in TEST_ATTENTION:
            raise ValueError(f"SATHardConfig.test_attention={self.test_attention!r}: one of {TEST_ATTENTION}")


def hard_attention_terms(loglik: Tensor, logp_s: Tensor, entropy: Tensor, baseline: Tensor | float,
                         sampled: Tensor, reinforce_lambda: float, entropy_lambda: float) -> tuple[Tensor, Tensor]:
    """The REINFORCE and entropy terms of the hard-attention surrogate loss (to minimise; sums over the batch).

    Per caption b: ``loglik`` [B] = log p(y|s̃, a) (its reward; not differentiated), ``logp_s`` [B] =
    log p(s̃|a) = Σ_t log α_{t,s̃_t}, ``entropy`` [B] = H[s̃] = Σ_t H(α_t), ``sampled`` [B] (bool: s̃
    was sampled, not set to α). With ``−Σ_b loglik`` (the cross-entropy), the gradient of
    ``reinforce + entropy`` is minus the seed's rule ``λ_r (log p(y|s̃) − b) ∂log p(s̃|a) + λ_e ∂H``.
    """
    reward = (loglik.detach() - baseline) * sampled.to(loglik.dtype)
    return -reinforce_lambda * (reward * logp_s).sum(), -entropy_lambda * entropy.sum()


class SATHard(SAT):
    name = "sat_hard"
    config_cls = SATHardConfig
    aux_losses = ("dsr", "reinforce", "entropy")

    def __init__(self, cfg: SATHardConfig) -> None:
        super().__init__(cfg)
        self.register_buffer("reward_baseline", torch.zeros(()))  # b, the moving average

    # ------------------------------------------------------------------ test time
    def test_weights(self, alpha: Tensor) -> Tensor:
        """The location weights at test time: α (``expected``) or the one-hot argmax (``argmax``)."""
        if self.cfg.test_attention == "argmax":
            return F.one_hot(alpha.argmax(-1), alpha.shape[-1]).to(alpha.dtype)
        return alpha

    def attend(self, a: Tensor, pa: Tensor, mask: Tensor, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Deterministic attention (decoding, eval-mode forward): context of :meth:`test_weights`."""
        alpha = self.attention(pa, mask, h)
        z, beta = self.context(a, self.test_weights(alpha), h)
        return z, alpha, beta

    # ------------------------------------------------------------------ training: sampled locations
    def sample_forward(self, a: Tensor, inputs: Tensor, lengths: Tensor) -> dict[str, Any]:
        """Teacher forcing with s̃_t ~ Multinoulli(α_t) (or α, per image with ``expectation_prob``) →
        ``logits`` [B, T, V], ``alpha`` [B, T, L], ``logp_s`` [B, T] = log α_{t,s̃_t}, ``entropy``
        [B, T] = H(α_t), ``sampled`` [B] (bool), ``dsr`` (as :meth:`SAT.forward`'s), ``steps`` [B, T]."""
        state = self.decode_init(a)
        a, pa, mask, h, c = state
        B, T = inputs.shape
        sampled = torch.rand(B, device=a.device) >= self.cfg.expectation_prob
        outs, alphas, logps, ents = [], [], [], []
        for prev in inputs.unbind(1):
            alpha = self.attention(pa, mask, h)
            s = torch.multinomial(alpha.detach().float(), 1)  # [B, 1]
            onehot = torch.zeros_like(alpha).scatter_(1, s, 1.0)
            z, _ = self.context(a, torch.where(sampled[:, None], onehot, alpha), h)
            o, h, c = self.advance(prev, z, h, c)
            log_alpha = alpha.clamp_min(1e-12).log()
            outs.append(o), alphas.append(alpha)
            logps.append(log_alpha.gather(1, s).squeeze(1))
            ents.append(-(alpha * log_alpha).sum(-1))
        alpha = torch.stack(alphas, 1)
        steps = valid_mask(lengths, T)
        dsr = doubly_stochastic(alpha.float(), steps, mask).sum() / steps.sum().clamp(min=1)
        return {"logits": self.logits(torch.stack(outs, 1)), "alpha": alpha, "logp_s": torch.stack(logps, 1),
                "entropy": torch.stack(ents, 1), "sampled": sampled, "dsr": self.cfg.dsr_lambda * dsr,
                "steps": steps}

    def loss(self, v: Tensor, inputs: Tensor, targets: Tensor, lengths: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """Training: the hard-attention surrogate (per word, see the module doc) and, once per batch,
        the baseline update; eval mode: the per-word NLL under the test-time attention (+ ``dsr``)."""
        if not self.training:
            return super().loss(v, inputs, targets, lengths)
        out = self.sample_forward(v, inputs, lengths)
        steps = out["steps"]
        xe = F.cross_entropy(out["logits"][steps].float(), targets[steps])
        w = steps.to(torch.float32)
        loglik = (token_logprobs(out["logits"].detach(), targets) * w).sum(-1)
        reinforce, entropy = hard_attention_terms(
            loglik, (out["logp_s"].float() * w).sum(-1), (out["entropy"].float() * w).sum(-1),
            self.reward_baseline, out["sampled"], self.cfg.reinforce_lambda, self.cfg.entropy_lambda)
        words = w.sum().clamp(min=1)
        self.update_baseline(loglik, out["sampled"])
        aux = {"dsr": out["dsr"], "reinforce": reinforce / words, "entropy": entropy / words}
        return xe + sum(aux.values()), {"xe": xe, **aux}

    @torch.no_grad()
    def update_baseline(self, loglik: Tensor, sampled: Tensor) -> None:
        """``b ← decay·b + (1 − decay)·mean(log p(y|s̃))`` over the sampled captions of the batch."""
        if bool(sampled.any()):
            d = self.cfg.baseline_decay
            self.reward_baseline.mul_(d).add_((1.0 - d) * loglik[sampled].float().mean())
