"""Batched beam search over a model's ``decode_init`` / ``decode_step`` / ``logits`` interface.

The whole batch × beam is one tensor of ``B·k`` rows: no Python loop over examples. Width 1 is
greedy decoding. A beam that has emitted <#end> is frozen (its only continuation is <pad> at
cost 0), so its score stays the sum of its words' log-probabilities. Final ranking: that sum, or
with ``length_penalty = α > 0`` the sum divided by ``length^α`` (length counts <#end>).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from r2m.models.r2m import END, PAD, START


@torch.no_grad()
def beam_search(model, v: Tensor, beam: int = 3, max_len: int = 20, length_penalty: float = 0.0,
                banned: Sequence[int] = (PAD, START)) -> dict[str, Tensor]:
    """Decode from concept vectors ``v`` [B, d].

    Returns ``tokens`` [B, k, T] (<pad> after <#end>), ``scores`` [B, k] sorted best first,
    ``lengths`` [B, k] (up to and including <#end>; T when it never ended).
    """
    B, k = v.shape[0], beam
    state = tuple(s.repeat_interleave(k, 0) for s in model.decode_init(v))
    prev = torch.full((B * k,), START, dtype=torch.long, device=v.device)
    scores = torch.full((B, k), float("-inf"), device=v.device)
    scores[:, 0] = 0.0  # all beams start identical: keep one
    done = torch.zeros(B, k, dtype=torch.bool, device=v.device)
    tokens = torch.zeros(B, k, 0, dtype=torch.long, device=v.device)
    base = (torch.arange(B, device=v.device) * k).unsqueeze(1)
    frozen = None
    for _ in range(max_len):
        h, state, _, _ = model.decode_step(state, prev)
        lp = torch.log_softmax(model.logits(h).float(), dim=-1)
        V = lp.shape[-1]
        if banned:
            lp[:, list(banned)] = float("-inf")
        lp = lp.view(B, k, V)
        if frozen is None:
            frozen = torch.full((V,), float("-inf"), device=v.device)
            frozen[PAD] = 0.0
        lp = torch.where(done.unsqueeze(-1), frozen, lp)
        top, idx = (scores.unsqueeze(-1) + lp).view(B, k * V).topk(k, dim=-1)
        src, tok = idx // V, idx % V
        state = tuple(s.index_select(0, (base + src).view(-1)) for s in state)
        tokens = torch.cat((tokens.gather(1, src.unsqueeze(-1).expand(-1, -1, tokens.shape[-1])), tok.unsqueeze(-1)), -1)
        done = done.gather(1, src) | (tok == END)
        scores, prev = top, tok.view(-1)
        if bool(done.all()):
            break
    T = tokens.shape[-1]
    is_end = tokens == END
    lengths = torch.where(is_end.any(-1), is_end.float().argmax(-1) + 1, torch.full_like(scores, T, dtype=torch.long))
    if length_penalty > 0:
        scores = scores / lengths.float().pow(length_penalty)
    order = scores.argsort(dim=-1, descending=True)
    return {"tokens": tokens.gather(1, order.unsqueeze(-1).expand(-1, -1, T)),
            "scores": scores.gather(1, order), "lengths": lengths.gather(1, order)}


def to_words(tokens: Tensor, itos: Sequence[str]) -> list[list[str]]:
    """Token ids [B, T] → words up to (not including) the first <#end>."""
    out = []
    for row in tokens.tolist():
        words = []
        for t in row:
            if t == END or t == PAD:
                break
            words.append(itos[t])
        out.append(words)
    return out
