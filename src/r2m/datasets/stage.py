"""The ``prepare`` stage: run the catalog entry's recipe into ``data/<dataset>/prepared``."""

from __future__ import annotations

from r2m.datasets import load_recipes
from r2m.datasets.base import RECIPES
from r2m.pipeline.context import StageContext
from r2m.utils.io import atomic_path


def run(ctx: StageContext) -> None:
    load_recipes()
    recipe = RECIPES.get(ctx.entry.kind)
    out = ctx.outs["prepared"]
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        manifest = recipe(ctx.entry, tmp, ctx.log)
        ctx.save_params(tmp)
    ctx.log.info("prepared %s: %s", ctx.dataset, {k: manifest[k] for k in ("n_images", "n_sentences") if k in manifest})
