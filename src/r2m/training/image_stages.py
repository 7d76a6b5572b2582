"""The image stages' entry (``train_m``, ``train_i``): :func:`r2m.training.stages.train` with the
checkpoint chosen by validation CIDEr (``<stage>.select_by``: ``auto`` or ``cider``;
:mod:`r2m.training.selection`), or the last one (``last``).

Apart from :mod:`r2m.training.stages` (the text stages' entry) because selecting captions and scores the
``val`` images: decoding and evaluation are code dependencies of the image stages only
(:mod:`r2m.pipeline.codedeps`; an edit of the beam search re-runs no ``train_xe``).
"""

from __future__ import annotations

from r2m.stage.context import StageContext
from r2m.text.vocab import load_itos
from r2m.training import selection
from r2m.training.stages import add_arguments, relaunch, train  # noqa: F401  (r2m.cli reads both from the entry)


def run(ctx: StageContext) -> None:
    select = None
    if getattr(ctx.params, ctx.stage.name).select_by != "last":  # auto: cider for the image stages
        select = selection.cider_selector(ctx, ctx.runtime.torch_device(), load_itos(ctx.deps["vocab"]))
    train(ctx, select)
