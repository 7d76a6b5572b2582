"""L_XE (Eq. 10): word cross-entropy of corpus sentences given their concepts."""

from __future__ import annotations

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
