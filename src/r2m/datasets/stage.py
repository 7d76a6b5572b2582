"""The ``prepare`` stage (the catalog entry's recipe into ``data/<dataset>/prepared``) and the
``references`` stage (its reference captions into ``data/<dataset>/references``)."""

from __future__ import annotations

from r2m.datasets.recipes import build_references, recipe
from r2m.stage.context import StageContext
from r2m.utils.io import atomic_path


def run(ctx: StageContext) -> None:
    make = recipe(ctx.entry.kind).prepare
    out = ctx.outs["prepared"]
    with atomic_path(out) as tmp:
        tmp.mkdir(parents=True)
        manifest = make(ctx.entry, tmp, ctx.log)
        ctx.save_params(tmp)
    ctx.log.info("prepared %s: %s", ctx.dataset, {k: manifest[k] for k in ("n_images", "n_sentences") if k in manifest})


def references(ctx: StageContext) -> None:
    """DAG stage ``references``: ``references.json`` (+ ``train_references.json``) of the dataset."""
    with atomic_path(ctx.outs["references"]) as tmp:
        tmp.mkdir(parents=True)
        counts = build_references(ctx.entry, ctx.deps["prepared"], tmp, ctx.log, ctx.dataset)
        ctx.save_params(tmp)
    ctx.log.info("references of %s: %s", ctx.dataset, counts)
