"""What the ``inspect_sup`` inspectors (:mod:`r2m.supervised.inspect_sat`, :mod:`r2m.supervised.inspect_scnn`)
share: the instance's model, vocabulary and features, opened (:func:`opened`), and a split's image ids."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from r2m.stage.context import StageContext


def split_of(prepared: Path, split: str) -> list[str]:
    """The image ids of ``split`` in ``prepared/images.parquet`` (none: an empty list)."""
    import pyarrow.parquet as pq

    images = pq.read_table(prepared / "images.parquet", columns=["image_id", "split"]).to_pandas()
    return [str(i) for i in images.loc[images["split"] == split, "image_id"]]


@contextlib.contextmanager
def opened(ctx: StageContext) -> Iterator[tuple[Any, Any, list[str], Any]]:
    """``(model, features, itos, device)`` of the instance's checkpoint (its own features when its CNN was
    fine-tuned: :func:`r2m.supervised.data.model_features`); the features closed on leaving."""
    from r2m.captioning.captioner import load_checkpoint_model
    from r2m.supervised.data import model_features

    device = ctx.runtime.torch_device()
    model, _, itos = load_checkpoint_model(ctx.deps["model"], device, ctx.deps["sup_vocab"])
    feats = model_features(ctx.deps["model"], ctx.deps["features"], model.feature_kinds)
    try:
        yield model, feats, itos, device
    finally:
        feats.close()
