"""L_XE (Eq. 10): word cross-entropy of corpus sentences given their concepts.

Two reductions, selected by ``fidelity.xe_reduction`` (see :data:`XE_REDUCTIONS`): ``token_mean``
(ours and the released code's ``reduce_mean`` over the valid tokens) and ``sentence_sum`` (Eq. 10:
the negative log-likelihood summed over each sentence, averaged over the sentences — the token
mean times the mean sentence length, which weighs L_XE about that much more against L_rec).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor


def xe_loss(logits: Tensor, targets: Tensor, mask: Tensor | None = None) -> Tensor:
    """Mean negative log-likelihood over the valid tokens.

    ``logits`` [..., V], ``targets`` [...] (long), ``mask`` [...] (bool/0-1; None = all valid).
    Padded positions contribute nothing, whatever their logits or targets.
    """
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), reduction="none")
    if mask is None:
        return nll.mean()
    m = mask.reshape(-1).to(nll.dtype)
    return (nll * m).sum() / m.sum().clamp(min=1.0)


def _token_mean(xe: Tensor, n_tokens: Tensor, n_sentences: int) -> Tensor:
    return xe


def _sentence_sum(xe: Tensor, n_tokens: Tensor, n_sentences: int) -> Tensor:
    return xe * (n_tokens.to(xe.dtype) / max(n_sentences, 1))


# name -> f(token-mean XE, valid tokens, sentences) -> the reduced L_XE
XE_REDUCTIONS: dict[str, Callable[[Tensor, Tensor, int], Tensor]] = {
    "token_mean": _token_mean,
    "sentence_sum": _sentence_sum,
}


def reduce_xe(name: str, xe: Tensor, n_tokens: Tensor, n_sentences: int) -> Tensor:
    """L_XE by reduction name from the token-mean XE of a batch of ``n_sentences`` sentences with
    ``n_tokens`` valid tokens (``token_mean`` returns ``xe`` itself: the same value and graph)."""
    if name not in XE_REDUCTIONS:
        raise KeyError(f"unknown xe_reduction {name!r}; known: {', '.join(XE_REDUCTIONS)}")
    return XE_REDUCTIONS[name](xe, n_tokens, n_sentences)


class _LinearXE(torch.autograd.Function):
    """Mean cross-entropy of ``h @ W.T + b`` computed chunk by chunk; the gradients are formed in
    the same pass (softmax − one-hot), so the [n, V] logits never exist in full."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, chunk: int) -> Tensor:
        n = h.shape[0]
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grads = need_h or need_w or need_b
        gh = torch.empty_like(h) if need_h else None
        gw = torch.zeros_like(weight) if need_w else None
        gb = torch.zeros_like(bias) if (bias is not None and need_b) else None
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        for s in range(0, n, chunk):
            hc, tc = h[s: s + chunk], targets[s: s + chunk]
            logits = torch.addmm(bias, hc, weight.t()) if bias is not None else hc @ weight.t()
            lse = torch.logsumexp(logits, dim=-1)
            total += (lse - logits.gather(1, tc.unsqueeze(1)).squeeze(1)).sum()
            if grads:
                p = logits.sub_(lse.unsqueeze(1)).exp_()  # softmax, in place
                p[torch.arange(len(tc), device=p.device), tc] -= 1.0
                p.div_(n)
                if gh is not None:
                    torch.mm(p, weight, out=gh[s: s + chunk])
                if gw is not None:
                    gw.addmm_(p.t(), hc)
                if gb is not None:
                    gb += p.sum(0)
        ctx.save_for_backward(*(g if g is not None else torch.empty(0) for g in (gh, gw, gb)))
        ctx.has = (gh is not None, gw is not None, gb is not None)
        return total / max(n, 1)

    @staticmethod
    def backward(ctx, g: Tensor):
        saved = ctx.saved_tensors
        return (*(s * g if has else None for s, has in zip(saved, ctx.has, strict=True)), None, None)


def linear_xe_loss(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, chunk: int = 128) -> Tensor:
    """``xe_loss(F.linear(hidden, weight, bias), targets)`` for valid tokens only ([n, d], [n]),
    without materialising the [n, V] logits (same value and gradients; faster and lighter on CPU)."""
    if hidden.shape[0] == 0:
        return hidden.sum() * 0.0
    return _LinearXE.apply(hidden, weight, bias, targets, chunk)
