"""Why the supervised stages skip a dataset, read without numpy, pyarrow or torch: a skipped
baseline's job (every supervised stage of a dataset without paired captions) starts in a blink."""

from __future__ import annotations

from pathlib import Path

from r2m.utils.io import read_json


def skip_reason(sup_vocab_dir: str | Path) -> str | None:
    """Why the supervised stages skip this dataset (``None``: it has paired captions)."""
    stats = read_json(Path(sup_vocab_dir) / "stats.json")
    return None if stats.get("paired") else str(stats.get("reason") or "no paired training captions")
