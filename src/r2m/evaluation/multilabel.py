"""S-CNN-RNN's multi-label evaluation of its concept head (seed 002, §4.2): :func:`topk_multilabel`.

A metric on score and label tensors, used by ``inspect_sup`` (:mod:`r2m.supervised.inspect`); apart from
the model (:mod:`r2m.models.scnn`) so that the inspection of every other baseline does not load that file.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _ratio(num: Tensor, den: Tensor) -> Tensor:
    """``num / den`` elementwise with 0/0 (and x/0) = 0: the protocol's convention."""
    return torch.where(den > 0, num / den.clamp(min=1), torch.zeros_like(num))


def _f1(p: float, r: float) -> float:
    return 2 * p * r / (p + r) if p + r > 0 else 0.0


def topk_multilabel(scores: Tensor, truth: Tensor, k: int = 3) -> dict[str, float]:
    """The seed's multi-label protocol (§4.2) with the top-``k`` labels per image. ``scores``,
    ``truth`` [N, C]. Per class: precision = |y ∩ ŷ| / |ŷ| and recall = |y ∩ ŷ| / |y| over the
    images, C-P / C-R their mean over **all** C classes; per image the same over the classes,
    O-P / O-R their mean over all N images; C-F1 / O-F1 the harmonic mean of the averaged P and R.
    Convention for 0/0: 0 (a class never predicted has precision 0, a class without a true image
    recall 0; an image without a true label recall 0)."""
    N, C = scores.shape
    if N == 0 or C == 0:
        return {c: 0.0 for c in ("C-P", "C-R", "C-F1", "O-P", "O-R", "O-F1")}
    pred = torch.zeros_like(truth, dtype=torch.bool)
    pred.scatter_(1, scores.topk(min(k, C), dim=1).indices, True)
    y = truth.bool()
    tp = (pred & y).float()
    cp = float(_ratio(tp.sum(0), pred.sum(0).float()).mean())
    cr = float(_ratio(tp.sum(0), y.sum(0).float()).mean())
    op = float(_ratio(tp.sum(1), pred.sum(1).float()).mean())
    orr = float(_ratio(tp.sum(1), y.sum(1).float()).mean())
    return {"C-P": cp, "C-R": cr, "C-F1": _f1(cp, cr), "O-P": op, "O-R": orr, "O-F1": _f1(op, orr)}
