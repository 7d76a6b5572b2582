"""S-CNN-RNN (Liu et al., "Semantic Regularisation for Recurrent Image Annotation", CVPR 2017).

Shapes: B batch, T time steps, F image feature size, k concepts, n LSTM size, V vocabulary.

* **Concepts.** The k most frequent caption words of the training set (k = 1000 in the paper,
  after Fang et al.); a training image's ground-truth label vector ``s ∈ {0,1}^k`` marks the
  concepts that occur in any of its captions (:func:`concept_vocab`, :func:`concept_labels`). Our
  choice: function words (:data:`STOPWORDS`) are left out of the concept set by default
  (``drop_stopwords``), otherwise a top-3 multi-label evaluation only ever sees "a", "in", "the".
* **Concept head** ``ŝ = σ(W f + b)`` on the precomputed CNN feature ``f``. The CNN itself is frozen
  (features are precomputed), so this is the paper's "Fix" variant: only the prediction layer is
  learned, as in the paper's first CNN pre-training phase. Our addition (``feature_norm``, default
  on): the feature is standardised over its channels (a LayerNorm without parameters) first. Loss: Eq. 5, the binary cross-entropy
  ``ℓ_u = −Σ_j s_j log ŝ_j + (1 − s_j) log(1 − ŝ_j)`` summed over the k concepts (the paper
  prints the log-likelihood; the loss is its negative), averaged over the batch.
* **LSTM** (n = 512 = word embedding size, as NIC v2): the concept vector goes through one FC
  layer that sets the initial hidden state, ``h_0 = FC(ŝ)``, ``c_0 = 0`` (the paper: "connected to
  a fully connected layer before being used to set the initial hidden state"); words are fed from
  <#start>; ``logits = W_o · dropout(h_t)``. ``L_r`` = NLL summed over the caption's steps,
  averaged over the batch.
* **Two-stage schedule.** Pre-training in parallel: the concept head on ``L_u`` and the LSTM on
  ``L_r`` fed the ground-truth ``s`` (:meth:`SCNN.sup_loss` with ``stage="pretrain"``; the two
  losses share no parameter, so one optimiser step on their sum is the same as two separate
  pre-trainings); then joint fine-tuning of ``L = L_u + L_r`` with the LSTM fed ``ŝ``
  (``stage="joint"``). Inference: ``ŝ`` from the image, beam width 3.

Decoding interface (as :func:`r2m.decoding.beam.beam_search` expects): ``decode_init(f)`` takes the
image features [B, F] (or, with ``concepts=``, a concept vector [B, k]) and returns ``(h, c)``;
``decode_step(state, prev)`` → ``(h_t, state, None, None)``; ``logits(h_t)``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from r2m.models.r2m import PAD

STOPWORDS = frozenset(
    "a an the and or of in on at to with near by for from is are there this that it its his her their "
    "some two three , . ' s".split())


def concept_vocab(captions: Iterable[Sequence[str]], k: int, drop_stopwords: bool = True) -> list[str]:
    """The ``k`` most frequent words of tokenised ``captions`` (ties broken alphabetically)."""
    counts: Counter[str] = Counter()
    for words in captions:
        counts.update(w for w in words if not (drop_stopwords and w in STOPWORDS) and not w.startswith("<"))
    return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:k]]


def concept_labels(captions_per_image: Sequence[Sequence[Sequence[str]]], concepts: Sequence[str]) -> Tensor:
    """Ground-truth ``s`` [N, k]: 1 where the concept occurs in any of the image's captions."""
    index = {w: j for j, w in enumerate(concepts)}
    s = torch.zeros(len(captions_per_image), len(concepts))
    for i, caps in enumerate(captions_per_image):
        for words in caps:
            for w in words:
                j = index.get(w)
                if j is not None:
                    s[i, j] = 1.0
    return s


def concept_bce(s_hat_logits: Tensor, s: Tensor) -> Tensor:
    """Eq. 5 negated, per image: −Σ_j [s_j log ŝ_j + (1 − s_j) log(1 − ŝ_j)] with ŝ = σ(logits) → [B]."""
    return F.binary_cross_entropy_with_logits(s_hat_logits.float(), s.float(), reduction="none").sum(-1)


@dataclass
class SCNNConfig:
    vocab_size: int
    image_dim: int
    num_concepts: int  # k
    hidden: int = 512  # n (= embedding size)
    dropout: float = 0.5
    feature_norm: bool = True  # standardise the image feature over its channels (no parameters)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "image_dim", "num_concepts", "hidden"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SCNNConfig.{name}={getattr(self, name)} must be positive")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"SCNNConfig.dropout={self.dropout} must be in [0, 1)")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SCNNConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class SCNN(nn.Module):
    name = "scnn"

    def __init__(self, cfg: SCNNConfig) -> None:
        super().__init__()
        self.cfg = cfg
        n = cfg.hidden
        self.concept_head = nn.Linear(cfg.image_dim, cfg.num_concepts)  # the "Fix" CNN's prediction layer
        self.init_fc = nn.Linear(cfg.num_concepts, n)  # FC(ŝ) → h_0
        self.embed = nn.Embedding(cfg.vocab_size, n, padding_idx=PAD)
        self.lstm = nn.LSTMCell(n, n)
        self.out = nn.Linear(n, cfg.vocab_size)
        self.drop = nn.Dropout(cfg.dropout)

    def param_count(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    # ------------------------------------------------------------------ pieces
    def concept_logits(self, feats: Tensor) -> Tensor:
        """Image features [B, F] → concept logits [B, k] (ŝ = sigmoid of these)."""
        feats = feats.to(self.concept_head.weight.dtype)
        if self.cfg.feature_norm:
            feats = F.layer_norm(feats, feats.shape[-1:])
        return self.concept_head(feats)

    def predict_concepts(self, feats: Tensor) -> Tensor:
        return torch.sigmoid(self.concept_logits(feats))

    def logits(self, h: Tensor) -> Tensor:
        return self.out(self.drop(h))

    # ------------------------------------------------------------------ step-wise decoding
    def decode_init(self, feats: Tensor | None = None, concepts: Tensor | None = None) -> tuple[Tensor, ...]:
        """Initial ``(h_0, c_0)`` from image features [B, F] (through ŝ) or a concept vector [B, k]."""
        if concepts is None:
            if feats is None:
                raise ValueError("SCNN.decode_init: give image features or a concept vector")
            concepts = self.predict_concepts(feats)
        h0 = self.init_fc(concepts.to(self.init_fc.weight.dtype))
        return h0, torch.zeros_like(h0)

    def decode_step(self, state: tuple[Tensor, ...], prev: Tensor, need_weights: bool = False):
        h, c = self.lstm(self.embed(prev), state)
        return h, (h, c), None, None

    # ------------------------------------------------------------------ teacher forcing
    def forward(self, inputs: Tensor, feats: Tensor | None = None, concepts: Tensor | None = None) -> dict[str, Tensor]:
        """``inputs`` [B, T] (<#start> w_1 …) → ``hidden`` [B, T, n]."""
        state = self.decode_init(feats, concepts)
        hs = []
        for prev in inputs.unbind(1):
            h, state, _, _ = self.decode_step(state, prev)
            hs.append(h)
        return {"hidden": torch.stack(hs, 1)}

    def sup_loss(self, feats: Tensor, inputs: Tensor, targets: Tensor, lengths: Tensor, s: Tensor,
                 stage: Literal["pretrain", "joint"] = "joint") -> dict[str, Tensor]:
        """``pretrain``: L_u(s, ŝ) + L_r(π | s) with the LSTM fed the ground truth ``s`` (the two
        parts share no parameters); ``joint``: L_u + L_r(π | ŝ). Both summed per image/caption and
        averaged over the batch; ``xe`` is the mean per-token NLL (for logging)."""
        if stage not in ("pretrain", "joint"):
            raise ValueError(f"SCNN.sup_loss: stage {stage!r}: choose pretrain or joint")
        c_logits = self.concept_logits(feats)
        lu = concept_bce(c_logits, s)
        rnn_in = s if stage == "pretrain" else torch.sigmoid(c_logits)
        hidden = self.forward(inputs, concepts=rnn_in)["hidden"]
        T = inputs.shape[1]
        step_mask = torch.arange(T, device=inputs.device).unsqueeze(0) < lengths.unsqueeze(1)
        logits = self.logits(hidden).float()
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
        nll = (nll.view_as(targets) * step_mask).sum(1)
        B = inputs.shape[0]
        return {"loss": (lu.sum() + nll.sum()) / B, "l_u": lu.mean(), "l_r": nll.mean(),
                "xe": nll.sum() / step_mask.sum().clamp(min=1)}

    # ------------------------------------------------------------------ checkpoints
    def checkpoint(self, **meta: Any) -> dict[str, Any]:
        return {"model": self.name, "config": self.cfg.to_dict(),
                "state_dict": {k: v.detach().cpu() for k, v in self.state_dict().items()}, **meta}

    @classmethod
    def from_config(cls, cfg: SCNNConfig | dict[str, Any]) -> SCNN:
        return cls(cfg if isinstance(cfg, SCNNConfig) else SCNNConfig.from_dict(cfg))

    @classmethod
    def from_checkpoint(cls, ckpt: dict[str, Any], **overrides: Any) -> SCNN:
        model = cls(SCNNConfig.from_dict({**ckpt["config"], **overrides}))
        try:
            model.load_state_dict(ckpt["state_dict"])
        except RuntimeError as err:
            raise ValueError(f"S-CNN-RNN checkpoint does not match its config: {err}") from None
        return model


def topk_multilabel(scores: Tensor, truth: Tensor, k: int = 3) -> dict[str, float]:
    """The paper's multi-label protocol with the top-``k`` labels per image: per-class (C-P/C-R/C-F1,
    averaged over the classes) and per-image / overall (O-P/O-R/O-F1, averaged over the images)
    precision and recall, F1 = harmonic mean of the averaged P and R. ``scores``, ``truth`` [N, C].
    Per-class figures average over the classes that occur in ``truth`` (a class never predicted
    has precision 0); per-image recall averages over the images with at least one true label."""
    N, C = scores.shape
    pred = torch.zeros_like(truth, dtype=torch.bool)
    pred.scatter_(1, scores.topk(min(k, C), dim=1).indices, True)
    y = truth.bool()
    tp = (pred & y).float()
    # per image
    p_img = tp.sum(1) / pred.sum(1).clamp(min=1)
    has = y.sum(1) > 0
    r_img = tp.sum(1)[has] / y.sum(1)[has].float()
    # per class
    present = y.sum(0) > 0
    p_cls = tp.sum(0) / pred.sum(0).clamp(min=1)
    r_cls = tp.sum(0)[present] / y.sum(0)[present].float()
    p_cls = p_cls[present]  # classes that exist in the truth

    def f1(p: float, r: float) -> float:
        return 2 * p * r / (p + r) if p + r > 0 else 0.0

    cp, cr = float(p_cls.mean()) if len(p_cls) else 0.0, float(r_cls.mean()) if len(r_cls) else 0.0
    op, orr = float(p_img.mean()) if N else 0.0, float(r_img.mean()) if len(r_img) else 0.0
    return {"C-P": cp, "C-R": cr, "C-F1": f1(cp, cr), "O-P": op, "O-R": orr, "O-F1": f1(op, orr)}
