"""S-CNN-RNN (Liu et al., "Semantic Regularisation for Recurrent Image Annotation", CVPR 2017).

Shapes: B batch, T time steps, F image feature size, k concepts, n LSTM size, V vocabulary.

* **Concepts.** The k most frequent caption words of the training set (k = 1000 in the paper,
  after Fang et al.: "which cover 92% of word occurrences"); a training image's ground-truth label
  vector ``s ∈ {0,1}^k`` marks the concepts that occur in any of its captions
  (:func:`concept_vocab`, :func:`concept_labels`, :func:`concept_coverage`). Function words are
  kept, as in the seed (``drop_stopwords: false``); ``drop_stopwords: true`` leaves
  :data:`STOPWORDS` out. The share of training word occurrences the k words cover is logged and
  saved (``concept_coverage`` in the config and in ``train_metrics.json``).
* **Concept head** ``ŝ = σ(W f + b)`` on the CNN's pooled feature ``f``. This module is the part
  above the CNN (the models layer knows no image backbone): with ``scnn.cnn: end_to_end`` (the
  seed) :mod:`r2m.supervised.finetune` puts the dataset's ``sup_features`` backbone underneath and
  trains it on the images' pixels; with ``scnn.cnn: frozen`` ``f`` is the precomputed
  ``sup_features`` vector (only the prediction layer learns, "S-CNN-RNN (frozen CNN)"). Our addition
  (``feature_norm``, default on): the feature is standardised over its channels (a LayerNorm
  without parameters) first. Loss: Eq. 5, the binary cross-entropy
  ``ℓ_u = −Σ_j s_j log ŝ_j + (1 − s_j) log(1 − ŝ_j)`` summed over the k concepts (the paper
  prints the log-likelihood; the loss is its negative), averaged over the batch.
* **LSTM** (n = 512 = word embedding size, as NIC v2): the concept vector goes through one FC
  layer that sets the initial hidden state, ``h_0 = FC(ŝ)``, ``c_0 = 0`` (the paper: "connected to
  a fully connected layer before being used to set the initial hidden state"); words are fed from
  <#start>; ``logits = W_o · dropout(h_t)``. ``L_r`` = NLL summed over the caption's steps,
  averaged over the batch.
* **Two-stage schedule** (two cached DAG steps, ``pretrain_sup`` then ``train_sup``).
  Pre-training in parallel (phase ``pretrain``): the CNN + concept head on ``L_u`` and the LSTM on
  ``L_r`` fed the ground-truth ``s`` (the two losses share no parameter, so one optimiser step on
  their sum is the same as two separate pre-trainings; ``L_r`` never reaches the CNN); then joint
  fine-tuning (phase ``joint``) of ``L = L_u + L_r`` with the LSTM fed ``ŝ``, gradients of both
  into the CNN. Inference: ``ŝ`` from the image, beam width 3.
* **Multi-label evaluation** (:func:`r2m.evaluation.multilabel.topk_multilabel`, the seed's §4.2
  protocol with the top-3 labels per image; a metric on score tensors, apart from this module so that
  ``inspect_sup`` of the other baselines does not depend on this file): C-P / C-R averaged over *all* k
  classes, O-P / O-R over all images, F1 the harmonic mean of the averaged P and R; every 0/0 (a class
  never predicted, a class or image without a true label) counts as 0.

Decoding interface (as :func:`r2m.captioning.beam.beam_search` expects): ``decode_init(v)`` takes
``encode``'s output (the pooled feature) and returns ``(h_0, c_0)`` from ŝ;
``decode_step(state, prev)`` → ``(h_t, state, None, None)``; ``logits(h_t)``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from r2m.models.supervised import SupervisedCaptioner
from r2m.text.tokenize import tokenize
from r2m.text.vocab import PAD

STOPWORDS = frozenset(
    "a an the and or of in on at to with near by for from is are there this that it its his her their "
    "some two three , . ' s".split())


def word_counts(captions: Iterable[Sequence[str]]) -> Counter[str]:
    """Occurrences of every word of tokenised ``captions`` (special tokens ``<…>`` left out)."""
    counts: Counter[str] = Counter()
    for words in captions:
        counts.update(w for w in words if not w.startswith("<"))
    return counts


def concept_vocab(captions: Iterable[Sequence[str]], k: int, drop_stopwords: bool = False) -> list[str]:
    """The ``k`` most frequent words of tokenised ``captions`` (ties broken alphabetically);
    ``drop_stopwords`` leaves :data:`STOPWORDS` out (the seed keeps them)."""
    counts = word_counts(captions)
    kept = ((w, n) for w, n in counts.items() if not (drop_stopwords and w in STOPWORDS))
    return [w for w, _ in sorted(kept, key=lambda kv: (-kv[1], kv[0]))[:k]]


def concept_coverage(counts: Counter[str], concepts: Sequence[str]) -> float:
    """Share of all word occurrences in ``counts`` that are one of ``concepts`` (the seed: the
    1,000 most frequent COCO caption words cover 92%); 0 when there are no words."""
    total = sum(counts.values())
    return sum(counts[w] for w in set(concepts)) / total if total else 0.0


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
    concepts: list[str] = field(default_factory=list)  # the k concept words (ŝ's units, in order)
    hidden: int = 512  # n (= embedding size)
    dropout: float = 0.5
    feature_norm: bool = True  # standardise the image feature over its channels (no parameters)
    cnn: str = "frozen"  # end_to_end: the CNN under the head was fine-tuned (its own features; r2m.supervised.finetune)
    concept_coverage: float | None = None  # share of the training word occurrences the concepts cover

    def __post_init__(self) -> None:
        for name in ("vocab_size", "image_dim", "hidden"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SCNNConfig.{name}={getattr(self, name)} must be positive")
        if not self.concepts:
            raise ValueError("SCNNConfig.concepts is empty: no concept words (no training captions?)")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"SCNNConfig.dropout={self.dropout} must be in [0, 1)")

    @property
    def num_concepts(self) -> int:
        return len(self.concepts)


class SCNN(SupervisedCaptioner):
    name = "scnn"
    config_cls = SCNNConfig
    feature_kinds = ("pooled",)
    aux_losses = ("l_u",)

    def __init__(self, cfg: SCNNConfig) -> None:
        super().__init__()
        self.cfg = cfg
        n, k = cfg.hidden, cfg.num_concepts
        self.concept_head = nn.Linear(cfg.image_dim, k)  # the CNN's prediction layer (ŝ's logits)
        self.init_fc = nn.Linear(k, n)  # FC(ŝ) → h_0
        self.embed = nn.Embedding(cfg.vocab_size, n, padding_idx=PAD)
        self.lstm = nn.LSTMCell(n, n)
        self.out = nn.Linear(n, cfg.vocab_size)
        self.drop = nn.Dropout(cfg.dropout)
        self.phase = "joint"
        self._labels: dict[str, list[int]] = {}

    # ------------------------------------------------------------------ construction and data
    @classmethod
    def from_params(cls, section: dict[str, Any], vocab_size: int, shapes: dict[str, tuple[int, ...]]) -> SCNN:
        if "pooled" not in shapes:
            raise ValueError(f"S-CNN-RNN needs 'pooled' image features; the features file has {sorted(shapes)}")
        section = {k: v for k, v in section.items() if k not in ("num_concepts", "drop_stopwords")}
        return cls(SCNNConfig(vocab_size=vocab_size, image_dim=int(shapes["pooled"][-1]), **section))

    @classmethod
    def prepare_params(cls, section: dict[str, Any], captions: Any) -> dict[str, Any]:
        """The concept words from the training captions (``captions``: the sup_vocab table with
        ``split`` and ``caption``): the ``num_concepts`` most frequent."""
        train = [tokenize(c) for c, sp in zip(captions["caption"], captions["split"], strict=True) if sp == "train"]
        words = concept_vocab(train, int(section.get("num_concepts", 1000)), bool(section.get("drop_stopwords", False)))
        return {**section, "concepts": words, "concept_coverage": concept_coverage(word_counts(train), words)}

    def train_info(self) -> dict[str, Any]:
        """What ``train_metrics.json`` records: the report label of this configuration (the CNN
        mode), the number of concepts and their coverage of the training word occurrences."""
        mode = "end to end" if self.cfg.cnn == "end_to_end" else "frozen CNN"
        return {"label": f"{self.label} ({mode})", "cnn": self.cfg.cnn, "concepts": self.cfg.num_concepts,
                "concept_coverage": self.cfg.concept_coverage}

    def bind_data(self, captions: Any) -> None:
        """Ground-truth labels s per image: the concepts occurring in any of its captions."""
        index = {w: j for j, w in enumerate(self.cfg.concepts)}
        labels: dict[str, set[int]] = {}
        for iid, cap in zip(captions["image_id"], captions["caption"], strict=True):
            labels.setdefault(str(iid), set()).update(index[w] for w in tokenize(cap) if w in index)
        self._labels = {i: sorted(js) for i, js in labels.items()}

    def labels_of(self, image_ids: Sequence[str]) -> Tensor:
        s = torch.zeros(len(image_ids), self.cfg.num_concepts)
        for r, i in enumerate(image_ids):
            if i not in self._labels:
                raise KeyError(f"S-CNN-RNN: no concept labels for image {i!r} (bind_data first)")
            s[r, self._labels[i]] = 1.0
        return s

    def batch_features(self, feats: dict[str, Tensor], image_ids: Sequence[str]) -> dict[str, Tensor]:
        """Training batches also carry the ground-truth concept labels (``concepts`` [B, k])."""
        if not self._labels:
            return feats
        device = next(iter(feats.values())).device  # ``pooled``, or the images under an end-to-end CNN
        return {**feats, "concepts": self.labels_of(image_ids).to(device)}

    def set_phase(self, phase: str) -> None:
        """``pretrain`` (the pretrain_sup stage) or ``train`` / ``joint`` (train_sup)."""
        if phase not in ("pretrain", "joint", "train"):
            raise ValueError(f"S-CNN-RNN phase {phase!r}: choose pretrain or joint")
        self.phase = "pretrain" if phase == "pretrain" else "joint"

    # ------------------------------------------------------------------ pieces
    def encode(self, feats: dict[str, Tensor]) -> Tensor:
        """v = the pooled feature [B, F], with the ground-truth labels appended ([B, F + k]) when the
        batch carries them (training)."""
        f = feats["pooled"].float()
        return torch.cat((f, feats["concepts"].float()), -1) if "concepts" in feats else f

    def _split(self, v: Tensor) -> tuple[Tensor, Tensor | None]:
        F_ = self.cfg.image_dim
        if v.shape[-1] == F_:
            return v, None
        if v.shape[-1] != F_ + self.cfg.num_concepts:
            raise ValueError(f"S-CNN-RNN: input width {v.shape[-1]}, expected {F_} or {F_ + self.cfg.num_concepts}")
        return v[:, :F_], v[:, F_:]

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
    def init_state(self, concepts: Tensor) -> tuple[Tensor, Tensor]:
        """``(h_0, c_0)`` = (FC(s), 0) from a concept vector [B, k]."""
        h0 = self.init_fc(concepts.to(self.init_fc.weight.dtype))
        return h0, torch.zeros_like(h0)

    def decode_init(self, v: Tensor) -> tuple[Tensor, ...]:
        """From ``encode``'s output: the LSTM starts from ŝ predicted from the image."""
        f, _ = self._split(v)
        return self.init_state(self.predict_concepts(f))

    def decode_step(self, state: tuple[Tensor, ...], prev: Tensor, need_weights: bool = False):
        h, c = self.lstm(self.embed(prev), state)
        return h, (h, c), None, None

    # without training labels forward is decode_init, decode_step per word and logits: score step-wise
    score_block = SupervisedCaptioner.score_block_stepwise

    # ------------------------------------------------------------------ teacher forcing
    def forward(self, v: Tensor, inputs: Tensor, lengths: Tensor | None = None) -> dict[str, Any]:
        """Teacher forcing. With ground-truth labels in ``v`` (training): ``aux["l_u"]`` = Σ_b ℓ_u
        (Eq. 5) divided by the number of valid words (the loop averages L_r per word, so
        L_u + L_r keeps the paper's ratio), and the LSTM is fed s in the ``pretrain`` phase, ŝ in
        the ``joint`` phase. Without labels (captioning, retrieval) it is fed ŝ and aux is empty."""
        f, s = self._split(v)
        c_logits = self.concept_logits(f)
        aux: dict[str, Tensor] = {}
        if s is not None:
            n_words = lengths.sum().clamp(min=1) if lengths is not None else inputs.numel()
            aux["l_u"] = concept_bce(c_logits, s).sum() / n_words
        # pre-training feeds the ground truth s (data, detached: L_r reaches no parameter below the LSTM)
        rnn_in = s.detach() if (s is not None and self.phase == "pretrain") else torch.sigmoid(c_logits)
        state = self.init_state(rnn_in)
        hs = []
        for prev in inputs.unbind(1):
            h, state, _, _ = self.decode_step(state, prev)
            hs.append(h)
        hidden = torch.stack(hs, 1)
        return {"logits": self.logits(hidden), "hidden": hidden, "concept_logits": c_logits, "aux": aux}
