"""``inspect_sup``: what a supervised model can show beyond its captions, per model.

* ``sat``, ``sat_hard`` (Show, Attend and Tell, soft / hard attention): per-word attention maps of
  a few test images (α upsampled to the image and smoothed, the paper's Figs. 2–3) as PNGs,
  and — when the prepared dataset knows its objects' boxes (``prepared/detections.jsonl``, as the synthetic
  ``tiny`` writes) — how often the attention for a generated object word lands on that object, against
  chance (:mod:`r2m.supervised.inspect_sat`).
* ``scnn`` (S-CNN-RNN): its concept head as a multi-label classifier of the test images
  (:mod:`r2m.supervised.inspect_scnn`).
* any other model: ``{"skipped": ...}``.

Each model's inspector is a function ``inspect(ctx, out_dir) -> dict`` in a module of its own, named by the
model's catalogue entry (``inspector`` in :data:`r2m.baselines.BASELINES`) and imported only for that model
(the model, its features and vocabulary are opened by :func:`r2m.supervised.inspection.opened`).

Output folder ``results/<D>/<model>/s<seed>/train_sup/inspect/``: ``inspect.json`` (+ the figures), written whole
(:func:`r2m.utils.io.atomic_path`: built beside it, renamed over it when complete, so nothing of an older run
outlives this one).
"""

from __future__ import annotations

from r2m.baselines import BASELINES
from r2m.stage.context import StageContext
from r2m.utils.io import atomic_path, write_json
from r2m.utils.registry import load_target


def run(ctx: StageContext) -> None:
    from r2m.supervised.skip import skip_reason

    reason = skip_reason(ctx.deps["sup_vocab"])
    inspector = BASELINES[ctx.model].inspector
    with atomic_path(ctx.outs["inspect"]) as out_dir:  # nothing of an older run outlives this one
        out_dir.mkdir()
        if reason or inspector is None:
            result = {"model": ctx.model, "skipped": reason or f"nothing to inspect for {ctx.model}"}
        else:
            result = load_target(inspector)(ctx, out_dir)
        write_json(out_dir / "inspect.json", result)
