"""Figures for one dataset: training losses, FM/RM attention (paper Fig. 5), qualitative examples
(paper Fig. 6), plus ``index.json`` describing them for the HTML page.

Optional inputs (a variant's loss curve, ``attention.json``, an image file) may be missing: the
figure is then skipped or drawn without them and a note says so in ``index.json`` (and the page).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402  (after selecting the backend)

from r2m.params import TRAIN_STAGES, VARIANT_NAMES  # noqa: E402
from r2m.reports.published import CKPT_LABELS, VARIANT_LABELS, dataset_label  # noqa: E402
from r2m.utils.io import atomic_path, read_json, write_json  # noqa: E402

STAGE_TITLES = {
    "train_xe": "stage 1: L_XE (text)",
    "train_s": "stage 2: L_S (text)",
    "train_m": "stage 3: L_M^I (images)",
    "train_i": "stage 4: L_I (images)",
}
THUMB_SIDE = 256
DPI = 110


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


def _plain(text: str) -> str:
    """Text for matplotlib with mathtext disabled in effect (``$`` escaped)."""
    return str(text).replace("$", r"\$")


def _save(fig: Figure, path: Path) -> None:
    fig.savefig(path, dpi=DPI, bbox_inches="tight", facecolor="white")


# --------------------------------------------------------------------------- losses
def read_loss(path: Path):
    """``loss.tsv`` -> DataFrame with at least ``step``, ``split``, ``loss``."""
    import pandas as pd

    df = pd.read_csv(path, sep="\t")
    missing = [c for c in ("step", "split", "loss") if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: loss table lacks column(s) {missing} (has {list(df.columns)})")
    return df


def loss_figure(curves: Mapping[tuple[str, str], Any], ckpts: Sequence[str] = TRAIN_STAGES) -> Figure:
    """One panel per training stage, one colour per variant; train solid, val dashed."""
    fig = Figure(figsize=(4.2 * len(ckpts), 3.4))
    axes = fig.subplots(1, len(ckpts), squeeze=False)[0]
    variants = [v for v in VARIANT_NAMES if any(k[0] == v for k in curves)]
    colours = {v: f"C{i}" for i, v in enumerate(variants)}
    for ax, ckpt in zip(axes, ckpts, strict=True):
        ax.set_title(STAGE_TITLES.get(ckpt, ckpt), fontsize=10)
        ax.set_xlabel("step")
        drawn = False
        for v in variants:
            df = curves.get((v, ckpt))
            if df is None:
                continue
            for split, style in (("train", "-"), ("val", "--")):
                part = df[df["split"] == split].sort_values("step")
                if len(part):
                    ax.plot(part["step"], part["loss"], style, color=colours[v], lw=1.3,
                            marker="o" if len(part) < 3 else None, ms=3,
                            label=f"{VARIANT_LABELS.get(v, v)} ({split})")
                    drawn = True
        if drawn:
            ax.legend(fontsize=6.5, loc="best")
        else:
            ax.text(0.5, 0.5, "no loss.tsv", ha="center", va="center", transform=ax.transAxes, color="grey")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("loss")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- attention
def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def fm_matrix(steps: Sequence[Mapping[str, Any]]) -> list[list[float]]:
    """FM weights per step [H][2 queries][2 keys] -> [2 keys][T]: the average over heads and
    queries of the attention paid to v and to w_{t-1} (paper Fig. 5, FM)."""
    rows: list[list[float]] = [[], []]
    for s in steps:
        w = s["fm"]
        for key in (0, 1):
            rows[key].append(_mean([q[key] for head in w for q in head]))
    return rows


def rm_matrices(steps: Sequence[Mapping[str, Any]]) -> list[list[list[float]]]:
    """RM weights per step [H][N slots][N+1 keys] -> per head [N+1 keys][T] (mean over slots)."""
    heads = len(steps[0]["rm"])
    n_keys = len(steps[0]["rm"][0][0])
    out = [[[0.0] * len(steps) for _ in range(n_keys)] for _ in range(heads)]
    for t, s in enumerate(steps):
        for h, head in enumerate(s["rm"]):
            for k in range(n_keys):
                out[h][k][t] = _mean([slot[k] for slot in head])
    return out


def attention_figure(record: Mapping[str, Any], fm_tokens: Sequence[str], rm_keys: Sequence[str]) -> Figure:
    steps = record["steps"]
    xt = [f"{s.get('input', '')}\u2192{s.get('output', '')}" for s in steps]
    panels: list[tuple[str, list[list[float]], list[str]]] = []
    if all(s.get("fm") for s in steps):
        labels = {"v": "v (concepts)", "w_prev": "w_{t-1}"}
        panels.append(("FM (mean of heads)", fm_matrix(steps), [labels.get(t, t) for t in fm_tokens]))
    if all(s.get("rm") for s in steps):
        for h, m in enumerate(rm_matrices(steps)):
            keys = [("M_{t-1}" if k.startswith("M") and len(rm_keys) == 2 else k) for k in rm_keys]
            keys = [("f_t" if k == "f" else k) for k in keys]
            panels.append((f"RM head {h + 1}", m, keys))
    if not panels:
        raise ValueError("the record has neither FM nor RM weights")
    T = len(steps)
    rows = sum(len(p[1]) for p in panels)
    fig = Figure(figsize=(min(16.0, max(6.0, 0.7 * T + 2.5)), 1.3 + 0.42 * rows + 0.45 * len(panels)))
    fig.set_layout_engine("constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False,
                        gridspec_kw={"height_ratios": [len(p[1]) for p in panels]})[:, 0]
    for i, (ax, (title, mat, ylabels)) in enumerate(zip(axes, panels, strict=True)):
        im = ax.imshow(mat, aspect="auto", cmap="Blues", vmin=0.0, vmax=1.0)
        ax.set_yticks(range(len(ylabels)), [_plain(y) for y in ylabels], fontsize=8)
        ax.set_title(title, fontsize=9, loc="left")
        for r, row in enumerate(mat):
            for c, val in enumerate(row):
                ax.text(c, r, f"{val:.2f}", ha="center", va="center", fontsize=6.5,
                        color="white" if val > 0.6 else "black")
        ax.set_xticks(range(T), [_plain(x) for x in xt] if i == len(panels) - 1 else [""] * T,
                      rotation=60, ha="right", fontsize=7.5)
        fig.colorbar(im, ax=ax, fraction=0.025, pad=0.01, aspect=8)
    caption = record.get("caption", "")
    fig.suptitle(_plain(f"image {record.get('image_id')}: \u201c{caption}\u201d"), fontsize=9)
    return fig


# --------------------------------------------------------------------------- qualitative examples
def load_thumbnail(path: Path | None, side: int = THUMB_SIDE):
    """An RGB PIL thumbnail, or None if the file is missing/unreadable."""
    if path is None:
        return None
    from PIL import Image

    try:
        with Image.open(path) as im:
            im = im.convert("RGB")
            im.thumbnail((side, side))
            return im.copy()
    except (OSError, ValueError):
        return None


def example_text(ex: Mapping[str, Any], width: int = 60) -> str:
    lines = ["Concepts: " + (", ".join(f"{c['concept']} {c['score']:.2f}" for c in ex["concepts"]) or "(none)")]
    for c in ex["captions"]:
        lines += textwrap.wrap(f"{c['label']}: {c['caption'] or '(missing)'}", width, subsequent_indent="    ")
    lines.append("References:")
    for r in ex["references"][:5]:
        lines += textwrap.wrap(f"- {r}", width, subsequent_indent="  ")
    return "\n".join(lines)


def examples_figure(examples: Sequence[Mapping[str, Any]], thumbs: Sequence[Any]) -> Figure:
    """Paper Fig. 6 style: per example the image and its concepts, stage captions and references."""
    n = len(examples)
    fig = Figure(figsize=(8.5, 2.6 * n))
    axes = fig.subplots(n, 2, squeeze=False, gridspec_kw={"width_ratios": [1, 2.6]})
    for (ax_img, ax_txt), ex, thumb in zip(axes, examples, thumbs, strict=True):
        ax_img.axis("off")
        ax_txt.axis("off")
        if thumb is not None:
            ax_img.imshow(thumb)
        else:
            ax_img.text(0.5, 0.5, "image unavailable", ha="center", va="center", color="grey")
        ax_img.set_title(_plain(f"image {ex['image_id']}"), fontsize=9)
        ax_txt.text(0.0, 1.0, _plain(example_text(ex)), va="top", ha="left", fontsize=8, family="DejaVu Sans",
                    transform=ax_txt.transAxes)
    fig.tight_layout()
    return fig


def choose_examples(caption_ids: Sequence[str], n: int, first: str | None = None,
                    usable: Callable[[str], bool] = lambda _i: True) -> list[str]:
    """Up to ``n`` image ids in caption order (``first`` leading if given), keeping usable ones."""
    ordered = ([first] if first and first in caption_ids else []) + [i for i in caption_ids if i != first]
    return [i for i in ordered if usable(i)][:n]


# --------------------------------------------------------------------------- inputs
def _captions_by_ckpt(ctx, idx: FigureIndex) -> dict[str, dict[str, str]]:
    from r2m.evaluation.inputs import load_results

    out: dict[str, dict[str, str]] = {}
    for keys, path in ctx.gather("captions"):
        path = Path(path)
        if path.exists():
            out[keys["ckpt"]] = load_results(path)
        else:
            idx.notes.append(f"captions missing: {path}")
    return out


def _concepts(ctx, idx: FigureIndex) -> dict[str, list[tuple[str, float]]]:
    path = Path(ctx.deps["concepts"]) / "detections.parquet"
    if not path.exists():
        idx.notes.append(f"detections missing: {path}")
        return {}
    import pandas as pd

    from r2m.text.dictionary import image_concepts

    c = ctx.params.concepts
    return image_concepts(pd.read_parquet(path), c.score_threshold, c.max_per_image)


def _image_paths(ctx) -> dict[str, Path]:
    import pandas as pd

    from r2m.datasets.base import resolve_image_path

    prepared = Path(ctx.deps["prepared"])
    path = prepared / "images.parquet"
    if not path.exists():
        return {}
    df = pd.read_parquet(path, columns=["image_id", "path"])
    return {str(i): resolve_image_path(prepared, p) for i, p in zip(df["image_id"], df["path"], strict=True)}


def _references(ctx) -> dict[str, list[str]]:
    from r2m.evaluation.inputs import load_references

    path = Path(ctx.deps["prepared"]) / "references.json"
    return load_references(path) if path.exists() else {}


def attention_path(ctx) -> Path:
    return ctx.path("results/{dataset}/r2m/train_i/attention.json")


# --------------------------------------------------------------------------- the stage
def _losses(ctx, out: Path, idx: FigureIndex) -> None:
    curves, missing = {}, []
    for keys, path in ctx.gather("losses"):
        path = Path(path)
        if path.exists():
            curves[(keys["variant"], keys["ckpt"])] = read_loss(path)
        else:
            missing.append(f"{keys['variant']}/{keys['ckpt']}")
    if missing:
        idx.notes.append(f"loss curves missing (results/{ctx.dataset}/<variant>/<stage>/loss.tsv): "
                         + ", ".join(missing))
    if not curves:
        idx.notes.append("no training losses found: loss figure skipped")
        return
    _save(loss_figure(curves), out / "losses.png")
    idx.figures.append({"file": "losses.png", "kind": "losses", "title": "Training losses per stage",
                        "caption": "One panel per training stage, one colour per variant; "
                                   "solid = training batches, dashed = validation."})


def _attention(ctx, out: Path, idx: FigureIndex) -> None:
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
    _save(fig, out / "attention.png")
    idx.figures.append({"file": "attention.png", "kind": "attention",
                        "title": f"FM and RM attention per decoding step (image {rec.get('image_id')})",
                        "caption": "Paper Fig. 5: FM = attention on the concept vector v vs. the previous "
                                   "word w_{t-1} (mean of heads); RM = each head's attention on the memory "
                                   "M_{t-1} vs. the fused input f_t. Columns: input word \u2192 output word."})


def _examples(ctx, out: Path, idx: FigureIndex) -> None:
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
    _save(examples_figure(examples, thumbs), out / "examples.png")
    idx.figures.append({"file": "examples.png", "kind": "examples", "title": "Qualitative examples",
                        "caption": "Paper Fig. 6: detected concepts (score \u2265 threshold, at most 5), the "
                                   "caption after each training stage, and the reference captions."})


FIGURE_STEPS: tuple[Callable[[Any, Path, FigureIndex], None], ...] = (_losses, _attention, _examples)


def run(ctx) -> None:
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
