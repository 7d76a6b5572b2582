"""``inspect_sup``: what a supervised model can show beyond its captions, per model.

* ``sat``, ``sat_hard`` (Show, Attend and Tell, soft / hard attention): per-word attention maps of
  a few test images (α upsampled to the image and smoothed, the paper's Figs. 2–3) as PNGs,
  and — when the prepared dataset knows its objects' boxes (``prepared/detections.jsonl``, as the synthetic
  ``tiny`` writes) — how often the attention for a generated object word lands on that object, against
  chance (:mod:`r2m.supervised.inspect_sat`).
* ``scnn`` (S-CNN-RNN): its concept head as a multi-label classifier of the test images
  (:mod:`r2m.supervised.inspect_scnn`).
* any other model: ``{"skipped": ...}``.

Each model's inspector is a module of its own, ``inspect(ctx, model, feats, itos, out_dir, device) -> dict``,
loaded by name from :data:`INSPECTOR_MODULES` (the model, its features and vocabulary are opened by
:func:`r2m.supervised.inspection.opened`): a stage instance's code dependencies hold its own model's
inspector and nothing of the others' (:mod:`r2m.pipeline.codedeps`): m-RNN's, which has none, neither the
decoding nor the attention figures.

Output folder ``results/<D>/<model>/s<seed>/train_sup/inspect/``: ``inspect.json`` (+ the figures), emptied first
and then marked as the stage's (:func:`r2m.utils.io.replace_folder`, :func:`r2m.utils.io.mark_owned`).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from r2m.pipeline.context import StageContext
from r2m.utils.io import mark_owned, replace_folder, write_json

# model -> the module of its inspector (tests/test_code_deps.py checks each defines ``inspect``)
INSPECTOR_MODULES: dict[str, str] = {
    "sat": "r2m.supervised.inspect_sat",
    "sat_hard": "r2m.supervised.inspect_sat",  # its maps: α_t, the distribution its location s_t is drawn from
    "scnn": "r2m.supervised.inspect_scnn",
}


def run(ctx: StageContext) -> None:
    from r2m.supervised.skip import skip_reason

    out_dir = Path(ctx.outs["inspect"])
    replace_folder(out_dir)  # nothing of an older run outlives this one; only a folder of this stage is emptied
    reason = skip_reason(ctx.deps["sup_vocab"])
    if reason or ctx.model not in INSPECTOR_MODULES:
        result = {"model": ctx.model, "skipped": reason or f"nothing to inspect for {ctx.model}"}
    else:
        result = importlib.import_module(INSPECTOR_MODULES[ctx.model]).inspect(ctx, out_dir)
    write_json(out_dir / "inspect.json", result)
    mark_owned(out_dir)
