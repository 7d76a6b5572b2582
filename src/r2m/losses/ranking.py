"""L_M^I (Eq. 12): hinge triplet ranking with the hardest in-batch negatives (VSE++ max violation)."""

from __future__ import annotations

import torch
from torch import Tensor


def triplet_hardest(img: Tensor, cap: Tensor, margin: float = 0.2) -> Tensor:
    """Hardest-negative triplet loss between matched rows of ``img`` (v̂^I) and ``cap`` (ṽ^I), [B, d].

    ``S = img @ cap.T`` (inner product). For pair i:
    ``[m − S_ii + max_{j≠i} S_ji]_+`` (hardest image for caption i) +
    ``[m − S_ii + max_{j≠i} S_ij]_+`` (hardest caption for image i); mean over the batch.
    A batch of one has no negatives and gives 0.
    """
    s = img.float() @ cap.float().t()
    B = s.shape[0]
    if B < 2:
        return s.sum() * 0.0
    pos = s.diagonal()
    off = s.masked_fill(torch.eye(B, dtype=torch.bool, device=s.device), float("-inf"))
    hardest_img = off.max(dim=0).values  # over images j for caption i (column i)
    hardest_cap = off.max(dim=1).values  # over captions j for image i (row i)
    return ((margin - pos + hardest_img).clamp(min=0) + (margin - pos + hardest_cap).clamp(min=0)).mean()
