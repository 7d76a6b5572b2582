"""Show, Attend and Tell's per-word attention maps (the paper's Figs. 2–3): for a generated caption,
one panel per word with the image and α_t upsampled to the image size and smoothed on top."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from r2m.evaluation.attention_hits import smooth_map  # noqa: E402


def attention_maps_figure(image: np.ndarray, words: Sequence[str], alphas: np.ndarray, title: str = "",
                          per_row: int = 6) -> Figure:
    """``image`` [H, W, 3] uint8, ``words`` the caption (with <#end> if wanted), ``alphas`` [T, h, w]."""
    n = len(words) + 1
    rows = -(-n // per_row)
    fig = Figure(figsize=(1.8 * per_row, 1.95 * rows))
    axes = fig.subplots(rows, per_row, squeeze=False).ravel()
    H, W = image.shape[:2]
    for ax in axes:
        ax.axis("off")
    axes[0].imshow(image)
    axes[0].set_title(title or "image", fontsize=8)
    for ax, word, alpha in zip(axes[1:], words, alphas, strict=False):
        ax.imshow(image)
        ax.imshow(smooth_map(np.asarray(alpha, dtype=np.float32), (H, W)), cmap="gray", alpha=0.65, vmin=0, vmax=1)
        ax.set_title(word, fontsize=9)
    fig.tight_layout()
    return fig
