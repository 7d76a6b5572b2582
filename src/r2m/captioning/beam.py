"""Batched beam search over a model's ``decode_init`` / ``decode_step`` / ``logits`` interface, and
the sampling decoder (:func:`sample_search`: each word drawn from the temperature-scaled softmax, as
m-RNN generates captions, seed 001/003; temperature 0 is greedy).

The whole batch × beam is one tensor of ``B·k`` rows: no Python loop over examples. Width 1 is
greedy decoding. A beam that has emitted <#end> is frozen (its only continuation is <pad> at
cost 0), so its score stays the sum of its words' log-probabilities. Final ranking: that sum, or
with ``length_penalty = α > 0`` the sum divided by ``length^α`` (length counts <#end>).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from r2m.text.vocab import END, PAD, START


def end_lengths(tokens: Tensor) -> Tensor:
    """Caption lengths of ``tokens`` [..., T]: up to and including the first <#end>; T when none."""
    is_end = tokens == END
    T = tokens.shape[-1]
    return torch.where(is_end.any(-1), is_end.float().argmax(-1) + 1,
                       torch.full(tokens.shape[:-1], T, dtype=torch.long, device=tokens.device))


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
    lengths = end_lengths(tokens)
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


@torch.no_grad()
def beam_search_im2txt(model, v: Tensor, beam: int = 3, max_len: int = 20,
                       banned: Sequence[int] = (PAD, START)) -> dict[str, Tensor]:
    """The released code's decoder (TF im2txt ``caption_generator`` as its ``sentence_infer`` uses it).

    Differences from :func:`beam_search`: ``max_len − 1`` steps (its ``max_caption_length − 1``);
    each live caption proposes its ``beam`` best next words; those ending in <#end> go to a separate
    pool of finished captions (the best ``beam`` kept) instead of holding a beam slot, so ``beam``
    captions stay live until the last step; no length normalisation. The answer is the best
    finished caption, or, when none finished, the best live one *without its last word* (im2txt
    strips "the end word" from it as well). Same return format as :func:`beam_search`.
    """
    B, k = v.shape[0], beam
    steps = max(max_len - 1, 1)
    dev = v.device
    state = tuple(s.repeat_interleave(k, 0) for s in model.decode_init(v))
    prev = torch.full((B * k,), START, dtype=torch.long, device=dev)
    scores = torch.full((B, k), float("-inf"), device=dev)
    scores[:, 0] = 0.0
    live = torch.zeros(B, k, steps, dtype=torch.long, device=dev)
    fin = torch.zeros(B, k, steps, dtype=torch.long, device=dev)
    fin_scores = torch.full((B, k), float("-inf"), device=dev)
    fin_len = torch.zeros(B, k, dtype=torch.long, device=dev)
    base = (torch.arange(B, device=dev) * k).unsqueeze(1)
    for t in range(steps):
        h, state, _, _ = model.decode_step(state, prev)
        lp = torch.log_softmax(model.logits(h).float(), dim=-1)
        if banned:
            lp[:, list(banned)] = float("-inf")
        V = lp.shape[-1]
        wlp, widx = lp.view(B, k, V).topk(k, dim=-1)  # [B, k, k] per live caption
        cand = (scores.unsqueeze(-1) + wlp).view(B, k * k)
        words = widx.view(B, k * k)
        src_all = torch.arange(k, device=dev).repeat_interleave(k).expand(B, -1)  # the caption extended
        ends = words == END
        # finished pool: old finished ∪ this step's <#end> candidates, best k
        new_fin = live.gather(1, src_all.unsqueeze(-1).expand(-1, -1, steps)).clone()
        new_fin[:, :, t] = END
        pool_s = torch.cat((fin_scores, cand.masked_fill(~ends, float("-inf"))), 1)
        pool_t = torch.cat((fin, new_fin), 1)
        pool_l = torch.cat((fin_len, torch.full_like(words, t + 1)), 1)
        fin_scores, pick = pool_s.topk(k, dim=-1)
        fin = pool_t.gather(1, pick.unsqueeze(-1).expand(-1, -1, steps))
        fin_len = pool_l.gather(1, pick)
        # live captions: the best k candidates that did not end
        scores, pick = cand.masked_fill(ends, float("-inf")).topk(k, dim=-1)
        src = src_all.gather(1, pick)
        tok = words.gather(1, pick)
        state = tuple(s.index_select(0, (base + src).view(-1)) for s in state)
        live = live.gather(1, src.unsqueeze(-1).expand(-1, -1, steps)).clone()
        live[:, :, t] = tok
        prev = tok.view(-1)
    has_fin = torch.isfinite(fin_scores[:, 0])
    # fallback: live captions with their last word stripped (length steps - 1, no <#end>)
    cut = live.clone()
    cut[:, :, steps - 1] = PAD
    tokens = torch.where(has_fin.view(B, 1, 1), fin, cut)
    out_scores = torch.where(has_fin.view(B, 1), fin_scores, scores)
    lengths = torch.where(has_fin.view(B, 1), fin_len, torch.full_like(fin_len, steps - 1))
    order = out_scores.argsort(dim=-1, descending=True)
    return {"tokens": tokens.gather(1, order.unsqueeze(-1).expand(-1, -1, steps)),
            "scores": out_scores.gather(1, order), "lengths": lengths.gather(1, order)}


@torch.no_grad()
def sample_search(model, v: Tensor, beam: int = 1, max_len: int = 20, banned: Sequence[int] = (PAD, START),
                  temperature: float = 1.0, generator: torch.Generator | None = None) -> dict[str, Tensor]:
    """Sample one caption per row of ``v`` [B, d]: each word is drawn from
    ``softmax(logits / temperature)`` (``banned`` ids excluded) until <#end> or ``max_len`` words;
    ``temperature`` 0 takes the most probable word (greedy: the same tokens as :func:`beam_search`
    with width 1). ``generator`` (on ``v``'s device) makes the draws reproducible. ``beam`` is
    ignored (one sample per row). Same return format as :func:`beam_search` with k = 1; ``scores``
    is the caption's log-probability under the untempered model."""
    if temperature < 0:
        raise ValueError(f"sampling temperature {temperature}: must be >= 0")
    B = v.shape[0]
    state = model.decode_init(v)
    prev = torch.full((B,), START, dtype=torch.long, device=v.device)
    scores = torch.zeros(B, device=v.device)
    done = torch.zeros(B, dtype=torch.bool, device=v.device)
    steps = []
    for _ in range(max_len):
        h, state, _, _ = model.decode_step(state, prev)
        logits = model.logits(h).float()
        if banned:
            logits[:, list(banned)] = float("-inf")
        if temperature == 0:
            tok = logits.argmax(-1)
        else:
            tok = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator).squeeze(1)
        lp = torch.log_softmax(logits, -1).gather(1, tok.unsqueeze(1)).squeeze(1)
        tok = torch.where(done, torch.full_like(tok, PAD), tok)
        scores = scores + torch.where(done, torch.zeros_like(lp), lp)
        steps.append(tok)
        done = done | (tok == END)
        prev = tok
        if bool(done.all()):
            break
    tokens = torch.stack(steps, 1) if steps else torch.zeros(B, 0, dtype=torch.long, device=v.device)
    lengths = end_lengths(tokens)
    return {"tokens": tokens.unsqueeze(1), "scores": scores.unsqueeze(1), "lengths": lengths.unsqueeze(1)}


# ``fidelity.decoding`` -> (search function, whether <UNK> is banned)
DECODERS = {"paper": (beam_search, True), "official": (beam_search_im2txt, False)}
