"""What every supervised captioner (the seed baselines: m-RNN, Show-Attend-Tell, S-CNN-RNN, …)
provides, so one training loop, one beam search and one retrieval scorer serve them all.

A model is one file with a small dataclass config (``vocab_size`` plus its sizes and the image
feature sizes it needs) and a subclass of :class:`SupervisedCaptioner` whose ``name`` is its entry in
:data:`r2m.baselines.BASELINES` (which gives its report label, its params section and its extra phases).

The interface (shapes: B batch, T steps, V vocabulary):

* ``feature_kinds``: the feature kinds of ``features.h5`` it reads (``pooled`` [B, C],
  ``grid`` [B, H, W, C]); ``from_params(section, vocab_size, shapes)`` builds it from its params
  section and the per-image shapes of those kinds.
* ``encode(feats) -> v``: the image conditioning, one batch-first tensor (whatever the model needs:
  a pooled vector, a flattened grid). Beam search repeats it per beam. ``init_feature_norm`` /
  ``standardise`` give per-channel standardisation with the training images' statistics (the
  training stage fits them).
* ``forward(v, inputs, lengths) -> {"logits": [B, T, V], "aux": {name: scalar}}``: teacher forcing
  with ``inputs`` = <#start> w_1 … (padded with <pad>); ``aux`` are extra loss terms (e.g. SAT's
  attention regulariser), added to the cross-entropy and logged as their own loss columns.
* ``decode_init(v) -> state`` (tuple of batch-first tensors), ``decode_step(state, prev) ->
  (hidden, state, None, None)``, ``logits(hidden) -> [B, V]``: the interface of
  :func:`r2m.captioning.beam.beam_search` (the same as R2M's).
* ``sentence_logprob`` and ``score_block``: log P(sentence | image) for retrieval; the generic
  versions here run :meth:`forward` on every (image, sentence) pair of a block in one batch; a
  model can override them with something cheaper (m-RNN shares its recurrent layer; SAT and S-CNN-RNN
  score step-wise, :meth:`SupervisedCaptioner.score_block_stepwise`).
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from r2m.baselines import BASELINES
from r2m.text.vocab import PAD


def valid_mask(lengths: Tensor, T: int) -> Tensor:
    return torch.arange(T, device=lengths.device)[None, :] < lengths[:, None]


def token_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """log P(target) per position: [..., V] and [...] → [...]."""
    return logits.float().log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


class SupervisedCaptioner(nn.Module):
    name: ClassVar[str] = ""  # its name in r2m.baselines.BASELINES (and in its checkpoints)
    config_cls: ClassVar[type]
    feature_kinds: ClassVar[tuple[str, ...]] = ("pooled",)
    aux_losses: ClassVar[tuple[str, ...]] = ()  # names of forward()'s "aux" terms (loss.tsv columns)

    cfg: Any

    @property
    def label(self) -> str:
        """Its name in the reports."""
        return BASELINES[self.name].label

    @property
    def phases(self) -> tuple[str, ...]:
        """Training phases beyond the one of train_sup (S-CNN-RNN: "pretrain")."""
        return BASELINES[self.name].phases

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_params(cls, section: dict[str, Any], vocab_size: int, shapes: dict[str, tuple[int, ...]]):
        raise NotImplementedError

    @classmethod
    def prepare_params(cls, section: dict[str, Any], captions: Any) -> dict[str, Any]:
        """Hook: complete the params section from the paired captions (the ``sup_vocab`` table,
        columns ``image_id``, ``split``, ``caption``) before building, e.g. S-CNN-RNN's concept words."""
        return section

    def bind_data(self, captions: Any) -> None:
        """Hook: per-image training targets from the paired captions (S-CNN-RNN's labels s)."""

    def batch_features(self, feats: dict[str, Tensor], image_ids: Any) -> dict[str, Tensor]:
        """Hook: what a *training* batch gives :meth:`encode` (default: the image features)."""
        return feats

    def train_info(self) -> dict[str, Any]:
        """Hook: extra entries for ``train_metrics.json`` (S-CNN-RNN: its label, CNN mode, coverage)."""
        return {}

    def set_phase(self, phase: str) -> None:
        """Hook: switch the training phase (one of :attr:`phases`, or "train" for train_sup)."""
        if phase not in (*self.phases, "train"):
            raise ValueError(f"{self.name}: no training phase {phase!r} (has {self.phases or 'none'})")

    @classmethod
    def from_config(cls, cfg: Any):
        if not isinstance(cfg, cls.config_cls):
            known = {f.name for f in fields(cls.config_cls)}
            cfg = cls.config_cls(**{k: v for k, v in dict(cfg).items() if k in known})
        return cls(cfg)

    @classmethod
    def from_checkpoint(cls, ckpt: dict[str, Any], **overrides: Any):
        model = cls.from_config({**ckpt["config"], **overrides})
        try:
            model.load_state_dict(ckpt["state_dict"])
        except RuntimeError as err:
            raise ValueError(f"{cls.name} checkpoint does not match its config: {err}") from None
        return model

    def checkpoint(self, **meta: Any) -> dict[str, Any]:
        """A ``torch.load(weights_only=True)``-safe dict: tensors + plain config."""
        return {"model": self.name, "config": asdict(self.cfg),
                "state_dict": {k: v.detach().cpu() for k, v in self.state_dict().items()}, **meta}

    def param_count(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    # ------------------------------------------------------------------ image feature standardisation
    def init_feature_norm(self, channels: dict[str, int]) -> None:
        """Per-channel standardisation of each feature kind (buffers, saved with the weights; set
        from the training images by :meth:`fit_feature_norm`, identity until then). Our addition:
        CNN activations differ in scale by orders of magnitude between backends."""
        for kind, c in channels.items():
            self.register_buffer(f"norm_{kind}_mean", torch.zeros(c))
            self.register_buffer(f"norm_{kind}_std", torch.ones(c))

    def fit_feature_norm(self, stats: dict[str, tuple[Tensor, Tensor]]) -> None:
        with torch.no_grad():
            for kind, (mean, std) in stats.items():
                if hasattr(self, f"norm_{kind}_mean"):
                    getattr(self, f"norm_{kind}_mean").copy_(mean)
                    getattr(self, f"norm_{kind}_std").copy_(std.clamp_min(1e-6))

    def standardise(self, feats: dict[str, Tensor]) -> dict[str, Tensor]:
        """``(x - mean) / std`` over the last (channel) axis of every kind with statistics."""
        out = {}
        for kind, x in feats.items():
            if hasattr(self, f"norm_{kind}_mean"):
                x = (x.float() - getattr(self, f"norm_{kind}_mean")) / getattr(self, f"norm_{kind}_std")
            out[kind] = x
        return out

    # ------------------------------------------------------------------ the interface
    def encode(self, feats: dict[str, Tensor]) -> Tensor:
        raise NotImplementedError

    def logits(self, hidden: Tensor) -> Tensor:
        raise NotImplementedError

    def decode_init(self, v: Tensor) -> tuple[Tensor, ...]:
        raise NotImplementedError

    def decode_step(self, state: tuple[Tensor, ...], prev: Tensor, need_weights: bool = False):
        raise NotImplementedError

    # ------------------------------------------------------------------ generic pieces
    def loss(self, v: Tensor, inputs: Tensor, targets: Tensor, lengths: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """Average negative log-likelihood per word (valid positions only) + the aux terms."""
        out = self(v, inputs, lengths)
        mask = valid_mask(lengths, inputs.shape[1])
        xe = F.cross_entropy(out["logits"][mask].float(), targets[mask])
        aux = out.get("aux") or {}
        total = xe + sum(aux.values()) if aux else xe
        return total, {"xe": xe, **aux}

    def sentence_logprob(self, v: Tensor, inputs: Tensor, targets: Tensor, lengths: Tensor) -> Tensor:
        """log P(sentence | image) per row [B]: the sum over valid positions (incl. <#end>)."""
        lp = token_logprobs(self(v, inputs, lengths)["logits"], targets)
        return (lp * valid_mask(lengths, inputs.shape[1])).sum(-1)

    def score_block(self, v: Tensor, inputs: Tensor, targets: Tensor, lengths: Tensor,
                    max_rows: int = 4096) -> Tensor:
        """log P(sentence_j | image_i) for a block of images ``v`` [b, …] and all sentences [S, T] → [b, S]."""
        b, S = v.shape[0], inputs.shape[0]
        out = torch.empty(b, S, device=v.device)
        rows = max(1, max_rows // max(b, 1))
        for s in range(0, S, rows):
            e = min(S, s + rows)
            n = e - s
            vv = v.repeat_interleave(n, 0)
            lp = self.sentence_logprob(vv, inputs[s:e].repeat(b, 1), targets[s:e].repeat(b, 1),
                                       lengths[s:e].repeat(b))
            out[:, s:e] = lp.view(b, n)
        return out

    def score_block_stepwise(self, v: Tensor, inputs: Tensor, targets: Tensor, lengths: Tensor,
                             max_rows: int = 4096) -> Tensor:
        """:meth:`score_block` for a model whose :meth:`forward` (without training labels) is
        ``decode_init``, ``decode_step`` per word and ``logits``, cheaper: ``decode_init`` runs once per
        image, not per pair; sentences go longest first, sentence-major, so the pairs still inside their
        sentence at step t are a prefix of the batch and the steps past every sentence's end are skipped;
        the per-step log-probabilities are summed over the steps at the end as :meth:`sentence_logprob`
        sums them (SAT, SAT-hard, S-CNN-RNN: ``score_block = SupervisedCaptioner.score_block_stepwise``)."""
        b, S = v.shape[0], inputs.shape[0]
        out = torch.empty(b, S, device=v.device)
        if b == 0 or S == 0:
            return out
        init = self.decode_init(v)
        order = torch.argsort(lengths, descending=True, stable=True)
        rows = max(1, max_rows // b)
        for s in range(0, S, rows):
            idx = order[s: s + rows]
            n, lens = idx.numel(), lengths[idx]
            steps = int(lens.max())
            # pair k = sentence (k // b) × image (k % b); lens is descending, so the live pairs are a prefix
            live = (lens[None, :] > torch.arange(steps, device=lens.device)[:, None]).sum(1) * b
            state = [x.repeat(n, *([1] * (x.dim() - 1))) for x in init]
            prev, tgt = inputs[idx].repeat_interleave(b, 0), targets[idx].repeat_interleave(b, 0)
            lp = torch.zeros(n * b, inputs.shape[1], device=v.device)
            for t in range(steps):
                k = int(live[t])
                now = tuple(x[:k] for x in state)
                o, new, _, _ = self.decode_step(now, prev[:k, t])
                for x, was, y in zip(state, now, new, strict=True):
                    if y is not was:  # parts the step passes through unchanged (SAT's annotations) stay
                        x[:k] = y
                lp[:k, t] = token_logprobs(self.logits(o), tgt[:k, t])
            out[:, idx] = lp.sum(-1).view(n, b).t()
        return out


__all__ = ["PAD", "SupervisedCaptioner", "token_logprobs", "valid_mask"]
