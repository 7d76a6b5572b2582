"""The figure builders of the report (matplotlib, no stage logic): loss curves, FM/RM attention
heat maps (paper Fig. 5), qualitative examples (paper Fig. 6), thumbnails, and :func:`save_figure`.
Used by the ``figures`` stage (:mod:`r2m.reports.figures`) and the ``r2m caption --html`` gallery
(:mod:`r2m.reports.gallery`).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402  (after selecting the backend)

from r2m.params import TRAIN_STAGES, VARIANT_NAMES  # noqa: E402
from r2m.reports.published import VARIANT_LABELS  # noqa: E402

STAGE_TITLES = {
    "train_xe": "stage 1: L_XE (text)",
    "train_s": "stage 2: L_S (text)",
    "train_m": "stage 3: L_M^I (images)",
    "train_i": "stage 4: L_I (images)",
}
THUMB_SIDE = 256
DPI = 110


def plain(text: str) -> str:
    """Text for matplotlib with mathtext disabled in effect (``$`` escaped)."""
    return str(text).replace("$", r"\$")


# what matplotlib would write into a file besides the picture: its version, and (SVG, PDF) the date
NO_METADATA = {".png": {"Software": None}, ".svg": {"Creator": None, "Date": None},
               ".pdf": {"Creator": None, "Producer": None, "CreationDate": None}}


def save_figure(fig: Figure, path: Path) -> None:
    """``fig`` as ``path`` (its suffix names the format), the same bytes for the same figure: no date and no
    matplotlib version in the file, and SVG element ids from a fixed salt rather than a random one."""
    path = Path(path)
    with matplotlib.rc_context({"svg.hashsalt": "r2m"}):
        fig.savefig(path, dpi=DPI, bbox_inches="tight", facecolor="white",
                    metadata=NO_METADATA.get(path.suffix.lower()))


# --------------------------------------------------------------------------- losses
def read_loss(path: Path):
    """``loss.tsv`` -> DataFrame with at least ``step``, ``split``, ``loss``."""
    import pandas as pd

    df = pd.read_csv(path, sep="\t")
    missing = [c for c in ("step", "split", "loss") if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: loss table lacks column(s) {missing} (has {list(df.columns)})")
    return df


def seed_band(frames: Sequence[Any], split: str):
    """One split's loss over seeds: a DataFrame per step with ``mean``, ``low``, ``high`` (the range
    over the seeds that logged that step) and ``seeds`` (how many did)."""
    import pandas as pd

    parts = [f.loc[f["split"] == split, ["step", "loss"]] for f in frames]
    rows = pd.concat(parts) if parts else pd.DataFrame(columns=["step", "loss"])
    rows = rows.dropna(subset=["loss"])
    g = rows.groupby("step")["loss"]
    return pd.DataFrame({"mean": g.mean(), "low": g.min(), "high": g.max(), "seeds": g.count()}).reset_index()


def loss_figure(curves: Mapping[tuple[str, str], Any], ckpts: Sequence[str] = TRAIN_STAGES) -> Figure:
    """One panel per training stage, one colour per variant; train solid, val dashed. A curve may
    be one ``loss.tsv`` frame or a list of them, one per seed: the mean over seeds with a shaded band
    (the range over the seeds) when there are several."""
    fig = Figure(figsize=(4.2 * len(ckpts), 3.4))
    axes = fig.subplots(1, len(ckpts), squeeze=False)[0]
    variants = [v for v in VARIANT_NAMES if any(k[0] == v for k in curves)]
    colours = {v: f"C{i}" for i, v in enumerate(variants)}
    for ax, ckpt in zip(axes, ckpts, strict=True):
        ax.set_title(STAGE_TITLES.get(ckpt, ckpt), fontsize=10)
        ax.set_xlabel("step")
        drawn = False
        for v in variants:
            frames = curves.get((v, ckpt))
            if frames is None:
                continue
            frames = frames if isinstance(frames, (list, tuple)) else [frames]
            for split, style in (("train", "-"), ("val", "--")):
                band = seed_band(frames, split)
                if len(band):
                    seeds = f", mean of {len(frames)} seeds" if len(frames) > 1 else ""
                    ax.plot(band["step"], band["mean"], style, color=colours[v], lw=1.3,
                            marker="o" if len(band) < 3 else None, ms=3,
                            label=f"{VARIANT_LABELS.get(v, v)} ({split}{seeds})")
                    if len(frames) > 1:
                        ax.fill_between(band["step"], band["low"], band["high"], color=colours[v], alpha=0.2, lw=0)
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
        ax.set_yticks(range(len(ylabels)), [plain(y) for y in ylabels], fontsize=8)
        ax.set_title(title, fontsize=9, loc="left")
        for r, row in enumerate(mat):
            for c, val in enumerate(row):
                ax.text(c, r, f"{val:.2f}", ha="center", va="center", fontsize=6.5,
                        color="white" if val > 0.6 else "black")
        ax.set_xticks(range(T), [plain(x) for x in xt] if i == len(panels) - 1 else [""] * T,
                      rotation=60, ha="right", fontsize=7.5)
        fig.colorbar(im, ax=ax, fraction=0.025, pad=0.01, aspect=8)
    caption = record.get("caption", "")
    fig.suptitle(plain(f"image {record.get('image_id')}: \u201c{caption}\u201d"), fontsize=9)
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
        ax_img.set_title(plain(f"image {ex['image_id']}"), fontsize=9)
        ax_txt.text(0.0, 1.0, plain(example_text(ex)), va="top", ha="left", fontsize=8, family="DejaVu Sans",
                    transform=ax_txt.transAxes)
    fig.tight_layout()
    return fig


def choose_examples(caption_ids: Sequence[str], n: int, first: str | None = None,
                    usable: Callable[[str], bool] = lambda _i: True) -> list[str]:
    """Up to ``n`` image ids in caption order (``first`` leading if given), keeping usable ones."""
    ordered = ([first] if first and first in caption_ids else []) + [i for i in caption_ids if i != first]
    return [i for i in ordered if usable(i)][:n]
