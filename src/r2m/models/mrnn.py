"""m-RNN (Mao et al., *Deep Captioning with Multimodal Recurrent Neural Networks*, ICLR 2015;
seeds ``001_…`` and ``003_…``): a supervised captioner, one of the seed baselines.

Per time step t, with w_t the input word (<#start> at t = 0):

* two word-embedding layers: ``e(t) = E·onehot(w_t)`` (``embed1``, a lookup) and
  ``w(t) = ReLU(W_e·e(t) + b_e)`` (``embed2``);
* the recurrent layer (``recurrent`` = 256 in the paper): ``r(t) = ReLU(U_r·r(t−1) + w(t))``,
  ``r(−1) = 0``, so ``embed2`` must equal ``recurrent`` (r(t−1) is mapped into w(t)'s space and added);
* the multimodal layer (``multimodal`` = 512): ``m(t) = g(V_w·w(t) + V_r·r(t) + V_I·I)`` with
  ``g(x) = 1.7159·tanh(2x/3)``, I the image's pooled CNN feature (VGG16 fc7 in the paper; whatever
  ``extract_features`` gives offline);
* softmax over the vocabulary: ``P(w_{t+1} | w_{≤t}, I) = softmax(W_o·m(t) + b_o)``.

Sizes 128/256/256/512 are the paper's Figure 2 (the seeds give 256 and 512). Dropout (``dropout``)
on m(t) before the softmax layer is our addition for small data (0 disables it), as is the
per-channel standardisation of I with the training images' statistics (``standardise``). The cost is the
average log-likelihood per word plus L2 (the training stage's ``weight_decay``).

The image enters only through ``V_I·I`` (one bias, ``V_w``'s, serves the sum), and r(t) does not see
the image, so scoring S sentences against b images (retrieval) runs the recurrent layer once per
sentence and only the multimodal and softmax layers per pair (:meth:`MRNN.score_block`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from r2m.models.supervised import SupervisedCaptioner, token_logprobs, valid_mask
from r2m.text.vocab import PAD


@dataclass
class MRNNConfig:
    vocab_size: int
    image_dim: int
    embed1: int = 128
    embed2: int = 256
    recurrent: int = 256
    multimodal: int = 512
    dropout: float = 0.25

    def __post_init__(self) -> None:
        if self.embed2 != self.recurrent:
            raise ValueError(f"MRNNConfig: embed2 ({self.embed2}) must equal recurrent ({self.recurrent}): "
                             "r(t) = ReLU(U_r r(t-1) + w(t)) adds them")
        if self.image_dim < 1 or self.vocab_size < 5:
            raise ValueError(f"MRNNConfig: image_dim {self.image_dim} and vocab_size {self.vocab_size} must be set")


def scaled_tanh(x: Tensor) -> Tensor:
    """g(x) = 1.7159·tanh(2x/3) (LeCun's scaled hyperbolic tangent, as in the paper)."""
    return 1.7159 * torch.tanh(x * (2.0 / 3.0))


class MRNN(SupervisedCaptioner):
    name = "mrnn"
    config_cls = MRNNConfig
    feature_kinds = ("pooled",)

    def __init__(self, cfg: MRNNConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed1 = nn.Embedding(cfg.vocab_size, cfg.embed1, padding_idx=PAD)
        self.embed2 = nn.Linear(cfg.embed1, cfg.embed2)
        self.U_r = nn.Linear(cfg.recurrent, cfg.recurrent, bias=False)
        self.V_w = nn.Linear(cfg.embed2, cfg.multimodal)
        self.V_r = nn.Linear(cfg.recurrent, cfg.multimodal, bias=False)
        self.V_I = nn.Linear(cfg.image_dim, cfg.multimodal, bias=False)
        self.out = nn.Linear(cfg.multimodal, cfg.vocab_size)
        self.drop = nn.Dropout(cfg.dropout)
        self.init_feature_norm({"pooled": cfg.image_dim})

    @classmethod
    def from_params(cls, section: dict[str, Any], vocab_size: int, shapes: dict[str, tuple[int, ...]]) -> MRNN:
        if "pooled" not in shapes:
            raise ValueError(f"m-RNN needs 'pooled' image features; the features file has {sorted(shapes)}")
        return cls(MRNNConfig(vocab_size=vocab_size, image_dim=int(shapes["pooled"][-1]), **section))

    # ------------------------------------------------------------------ layers
    def encode(self, feats: dict[str, Tensor]) -> Tensor:
        return self.standardise({"pooled": feats["pooled"]})["pooled"]

    def words(self, tokens: Tensor) -> Tensor:
        """The two embedding layers: ids [...] → w [..., embed2]."""
        return F.relu(self.embed2(self.embed1(tokens)))

    def recurrence(self, w: Tensor) -> Tensor:
        """r(t) = ReLU(U_r·r(t−1) + w(t)) over w [B, T, d] → r [B, T, d] (causal: padding after a
        sentence's end cannot change its valid steps)."""
        r = w.new_zeros(w.shape[0], w.shape[2])
        out = []
        for t in range(w.shape[1]):
            r = F.relu(self.U_r(r) + w[:, t])
            out.append(r)
        return torch.stack(out, 1)

    def multimodal(self, w: Tensor, r: Tensor, image_term: Tensor) -> Tensor:
        """m = g(V_w·w + V_r·r + V_I·I); ``image_term`` = V_I·I broadcast over the time axis."""
        return scaled_tanh(self.V_w(w) + self.V_r(r) + image_term)

    def logits(self, hidden: Tensor) -> Tensor:
        return self.out(self.drop(hidden))

    # ------------------------------------------------------------------ teacher forcing
    def forward(self, v: Tensor, inputs: Tensor, lengths: Tensor | None = None) -> dict[str, Any]:
        w = self.words(inputs)
        m = self.multimodal(w, self.recurrence(w), self.V_I(v).unsqueeze(1))
        return {"logits": self.logits(m), "hidden": m, "aux": {}}

    # ------------------------------------------------------------------ step-wise decoding
    def decode_init(self, v: Tensor) -> tuple[Tensor, ...]:
        return (self.V_I(v), v.new_zeros(v.shape[0], self.cfg.recurrent))

    def decode_step(self, state: tuple[Tensor, ...], prev: Tensor, need_weights: bool = False):
        image_term, r = state
        w = self.words(prev)
        r = F.relu(self.U_r(r) + w)
        m = self.multimodal(w, r, image_term)
        return m, (image_term, r), None, None

    # ------------------------------------------------------------------ retrieval
    def score_block(self, v: Tensor, inputs: Tensor, targets: Tensor, lengths: Tensor,
                    max_rows: int = 4096) -> Tensor:
        """log P(sentence_j | image_i) [b, S]: the language part once for all sentences, then per
        image only ``g(· + V_I·I)`` and the softmax layer, chunked over sentences to bound memory."""
        w = self.words(inputs)
        lang = self.V_w(w) + self.V_r(self.recurrence(w))  # [S, T, M]
        img = self.V_I(v)  # [b, M]
        mask = valid_mask(lengths, inputs.shape[1])
        b, (S, T, M) = img.shape[0], lang.shape
        V = self.cfg.vocab_size
        chunk = max(1, (1 << 24) // max(1, b * T * max(V, M)))
        out = torch.empty(b, S, device=v.device)
        for s in range(0, S, chunk):
            e = min(S, s + chunk)
            m = scaled_tanh(lang[None, s:e] + img[:, None, None, :])  # [b, n, T, M]
            lp = token_logprobs(self.logits(m), targets[None, s:e].expand(b, -1, -1))
            out[:, s:e] = (lp * mask[None, s:e]).sum(-1)
        return out
