"""The ``figures`` stage for one dataset: training losses, FM/RM attention (paper Fig. 5),
qualitative examples (paper Fig. 6), plus ``index.json`` describing them for the HTML page. The
drawing itself is :mod:`r2m.reports.plots`.

Optional inputs (a variant's loss curve, ``attention.json``, an image file) may be missing: the
figure is then skipped or drawn without them and a note says so in ``index.json`` (and the page).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from r2m.params import TRAIN_STAGES
from r2m.reports.intervals import first_seeds
from r2m.reports.plots import (
    attention_figure,
    choose_examples,
    examples_figure,
    load_thumbnail,
    loss_figure,
    read_loss,
    save_figure,
)
from r2m.reports.published import CKPT_LABELS, dataset_label
from r2m.stage.context import StageContext
from r2m.utils.io import atomic_path, read_json, write_json


@dataclass
class FigureIndex:
    """What the figure stage produced (serialised to ``index.json``)."""

    dataset: str
    label: str
    figures: list[dict[str, str]] = field(default_factory=list)
    examples: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "label": self.label, "figures": self.figures,
                "examples": self.examples, "notes": self.notes}


# --------------------------------------------------------------------------- inputs
def _captions_by_ckpt(ctx: StageContext, idx: FigureIndex) -> dict[str, dict[str, str]]:
    from r2m.evaluation.inputs import load_results

    out: dict[str, dict[str, str]] = {}
    for keys, path in first_seeds(ctx.gather("captions"), lambda k: k["ckpt"]).values():
        path = Path(path)
        if path.exists():
            out[keys["ckpt"]] = load_results(path)
        else:
            idx.notes.append(f"captions missing: {path}")
    return out


def _concepts(ctx: StageContext, idx: FigureIndex) -> dict[str, list[tuple[str, float]]]:
    path = Path(ctx.deps["concepts"]) / "detections.parquet"
    if not path.exists():
        idx.notes.append(f"detections missing: {path}")
        return {}
    import pandas as pd

    from r2m.text.dictionary import image_concepts

    c = ctx.params.concepts
    return image_concepts(pd.read_parquet(path), c.score_threshold, c.max_per_image)


def _image_paths(ctx: StageContext) -> dict[str, Path]:
    import pandas as pd

    from r2m.datasets.base import resolve_image_path

    prepared = Path(ctx.deps["prepared"])
    path = prepared / "images.parquet"
    if not path.exists():
        return {}
    df = pd.read_parquet(path, columns=["image_id", "path"])
    return {str(i): resolve_image_path(prepared, p) for i, p in zip(df["image_id"], df["path"], strict=True)}


def _references(ctx: StageContext) -> dict[str, list[str]]:
    from r2m.evaluation.inputs import load_references

    path = Path(ctx.deps["references"]) / "references.json"
    return load_references(path) if path.exists() else {}


def attention_path(ctx: StageContext) -> Path:
    """R2M's final attention weights of the dataset's first seed."""
    return Path(ctx.gather("attention")[0][1])


# --------------------------------------------------------------------------- the stage
def _losses(ctx: StageContext, out: Path, idx: FigureIndex) -> None:
    curves, missing = {}, []
    for keys, path in ctx.gather("losses"):
        path = Path(path)
        if path.exists():
            curves.setdefault((keys["variant"], keys["ckpt"]), []).append(read_loss(path))  # one per seed
        else:
            missing.append(f"{keys['variant']}/s{keys['seed']}/{keys['ckpt']}")
    if missing:
        idx.notes.append(f"loss curves missing (results/{ctx.dataset}/<variant>/s<seed>/<stage>/loss.tsv): "
                         + ", ".join(missing))
    if not curves:
        idx.notes.append("no training losses found: loss figure skipped")
        return
    save_figure(loss_figure(curves), out / "losses.png")
    idx.figures.append({"file": "losses.png", "kind": "losses", "title": "Training losses per stage",
                        "caption": "One panel per training stage, one colour per variant; "
                                   "solid = training batches, dashed = validation; with several seeds, the "
                                   "mean over seeds and a shaded band (their range)."})


def _attention(ctx: StageContext, out: Path, idx: FigureIndex) -> None:
    path = attention_path(ctx)
    if not path.exists():
        idx.notes.append(f"attention weights not available ({path} missing): Fig. 5 skipped")
        return
    data = read_json(path)
    images = data.get("images") or []
    want = ctx.params.report.attention_image
    rec = next((r for r in images if want is not None and str(r.get("image_id")) == str(want)), None)
    if want is not None and rec is None:
        idx.notes.append(f"report.attention_image {want!r} is not in {path}; using the first image")
    rec = rec or (images[0] if images else None)
    if rec is None or not rec.get("steps"):
        idx.notes.append(f"{path} holds no attention records: Fig. 5 skipped")
        return
    try:
        fig = attention_figure(rec, data.get("fm_tokens", ["v", "w_prev"]),
                               data.get("rm_keys", ["M0", "f"]))
    except (ValueError, KeyError, IndexError, TypeError) as err:
        idx.notes.append(f"{path}: cannot draw attention for image {rec.get('image_id')}: {err}")
        return
    save_figure(fig, out / "attention.png")
    idx.figures.append({"file": "attention.png", "kind": "attention",
                        "title": f"FM and RM attention per decoding step (image {rec.get('image_id')})",
                        "caption": "Paper Fig. 5: FM = attention on the concept vector v vs. the previous "
                                   "word w_{t-1} (mean of heads); RM = each head's attention on the memory "
                                   "M_{t-1} vs. the fused input f_t. Columns: input word \u2192 output word."})


def _examples(ctx: StageContext, out: Path, idx: FigureIndex) -> None:
    n = ctx.params.report.figure_images
    if n == 0:
        return
    caps = _captions_by_ckpt(ctx, idx)
    final = caps.get("train_i") or next(iter(caps.values()), None)
    if not final:
        idx.notes.append("no captions found: qualitative examples skipped")
        return
    concepts, paths, refs = _concepts(ctx, idx), _image_paths(ctx), _references(ctx)
    ids = choose_examples(list(final), n, ctx.params.report.attention_image)
    examples, thumbs = [], []
    for k, image_id in enumerate(ids, 1):
        thumb = load_thumbnail(paths.get(image_id))
        thumb_file = None
        if thumb is not None:
            thumb_file = f"thumb_{k}.png"
            thumb.save(out / thumb_file)
        else:
            idx.notes.append(f"image {image_id}: file unavailable ({paths.get(image_id, 'not in images.parquet')})")
        examples.append({
            "image_id": image_id,
            "thumbnail": thumb_file,
            "concepts": [{"concept": c, "score": round(float(s), 3)} for c, s in concepts.get(image_id, [])],
            "captions": [{"ckpt": ck, "label": CKPT_LABELS.get(ck, ck), "caption": caps.get(ck, {}).get(image_id)}
                         for ck in TRAIN_STAGES],
            "references": refs.get(image_id, []),
        })
        thumbs.append(thumb)
    idx.examples = examples
    save_figure(examples_figure(examples, thumbs), out / "examples.png")
    idx.figures.append({"file": "examples.png", "kind": "examples", "title": "Qualitative examples",
                        "caption": "Paper Fig. 6: detected concepts (score \u2265 threshold, at most 5), the "
                                   "caption after each training stage, and the reference captions."})


FIGURE_STEPS: tuple[Callable[[Any, Path, FigureIndex], None], ...] = (_losses, _attention, _examples)


def run(ctx: StageContext) -> None:
    idx = FigureIndex(ctx.dataset, dataset_label(ctx.dataset))
    with atomic_path(ctx.outs["figures"]) as tmp:
        tmp.mkdir(parents=True)
        for step in FIGURE_STEPS:
            step(ctx, tmp, idx)
        write_json(tmp / "index.json", idx.to_json())
        ctx.save_params(tmp)
    for note in idx.notes:
        ctx.log.warning("figures: %s", note)
    ctx.log.info("figures: wrote %s (%s)", ctx.outs["figures"], ", ".join(f["file"] for f in idx.figures) or "none")
