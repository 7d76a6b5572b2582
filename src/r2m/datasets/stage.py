"""The ``prepare`` stage (the catalog entry's recipe into ``data/<dataset>/prepared``) and the
``references`` stage (its reference captions into ``data/<dataset>/references``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from r2m.datasets import load_recipes
from r2m.datasets.base import RECIPES, REFERENCE_BUILDERS, read_index, write_references
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


def check_index(prepared: Path, refs: dict[str, Any], source: str) -> None:
    """Every evaluation image the references name is in the prepared index with the same split (else the
    reference files' image list changed after ``prepare`` ran): one line naming the image."""
    index = read_index(prepared)
    split_of = dict(zip(index["image_id"].astype(str), index["split"].astype(str), strict=True))
    for img in refs.get("images", []):
        have, want = split_of.get(str(img["id"])), img.get("split", "test")
        if have != want:
            where = "not in" if have is None else f"of split {have!r} in"
            raise ValueError(f"{source}: image {img['id']!r} (split {want!r}) is {where} {prepared / 'images.parquet'}; "
                             "the references' image list changed after prepare ran: run prepare again")


def references(ctx: StageContext) -> None:
    """DAG stage ``references``: ``references.json`` (+ ``train_references.json``) of the dataset."""
    load_recipes()
    build = REFERENCE_BUILDERS.get(ctx.entry.kind)
    prepared = ctx.deps["prepared"]
    refs, train_refs = build(ctx.entry, prepared, ctx.log)
    check_index(prepared, refs, f"references of {ctx.dataset} (kind {ctx.entry.kind})")
    with atomic_path(ctx.outs["references"]) as tmp:
        tmp.mkdir(parents=True)
        counts = write_references(tmp, refs, train_refs)
        ctx.save_params(tmp)
    ctx.log.info("references of %s: %s", ctx.dataset, counts)
