"""Why the supervised stages skip a dataset, read without numpy, pyarrow or torch: a skipped
baseline's job (every supervised stage of a dataset without paired captions) starts in a blink; and what a
skipped training step (``pretrain_sup``, ``train_sup``) writes (:func:`write_skipped`)."""

from __future__ import annotations

from pathlib import Path

from r2m.stage.context import StageContext
from r2m.utils.io import atomic_path, read_json, write_json, write_text


def skip_reason(sup_vocab_dir: str | Path) -> str | None:
    """Why the supervised stages skip this dataset (``None``: it has paired captions)."""
    stats = read_json(Path(sup_vocab_dir) / "stats.json")
    return None if stats.get("paired") else str(stats.get("reason") or "no paired training captions")


def write_skipped(ctx: StageContext, reason: str) -> None:
    """A skipped training step's outputs: ``skipped.json`` (and its params) in the model folder, written whole
    (nothing of an older run outlives it), an empty ``loss.tsv``, metrics ``{"skipped": reason}``."""
    with atomic_path(Path(ctx.outs["model"])) as out_dir:
        out_dir.mkdir()
        write_json(out_dir / "skipped.json", {"skipped": reason})
        ctx.save_params(out_dir)
    write_text(ctx.outs["loss"], "step\tsplit\tloss\txe\n")
    write_json(ctx.outs["metrics"], {"model": ctx.model, "skipped": reason})
    ctx.log.info("train_sup: %s", reason)
