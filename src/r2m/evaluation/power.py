"""``r2m power RESULTS``: how many test images, or training seeds, detect a metric difference of a given size.

From a results folder (every row's seeds: ``eval.json`` and ``per_image.parquet``) it fits the model of
:mod:`r2m.evaluation.noise` to every pair of rows scored on the same images — each row's spread over its
seeds, split into the seed effect and the seed × image residual, and the image component of the pair's
difference — and takes the median of each component over the pairs (one summary per set of test images:
spreads of different datasets are never pooled). For each difference Δ (``--deltas``) it then gives

* the test images needed at the rows' number of seeds, and
* the seeds per system needed on the rows' test images,

for 80 % power (``--power``) of the t test the tables use, at level 0.05 / ``--family`` (Holm's first and
strictest step over a family of that many comparisons; default 4, Table 2's), from the median fit and
again with every variance at its 80 % upper confidence bound (:meth:`r2m.evaluation.noise.Fit.upper`).
"None" is printed only where the fitted components say no size reaches the power: the seed effect alone
(for images) or the image component alone (for seeds).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from r2m.evaluation import noise as N
from r2m.evaluation.bootstrap import DEFAULT_RESAMPLES, PerImage

SEED_SEGMENT = "s"  # results/<dataset>/<variant>/s<seed>/<ckpt>/: the seed axis's path segment
DEFAULT_FAMILY = 4
CONFIDENCE = 0.8
ALPHA = 0.05

Rows = dict[str, dict[int | None, PerImage]]


class PowerError(ValueError):
    """A one-line reason `r2m power` cannot plan from its inputs."""


def _row_and_seed(rel: Path) -> tuple[str, int | None]:
    """``r2m/s1/train_i`` → ``("r2m/train_i", 1)``; a path without a seed segment has seed None."""
    parts, seed = [], None
    for p in rel.parts:
        if seed is None and len(p) > 1 and p[0] == SEED_SEGMENT and p[1:].isdigit():
            seed = int(p[1:])
        else:
            parts.append(p)
    return "/".join(parts), seed


def scan(root: Path, metric: str) -> Rows:
    """Every result folder under ``root`` with an ``eval.json`` and a ``per_image.parquet`` that has
    ``metric``: per row, per seed, its per-image statistics."""
    from r2m.evaluation import per_image
    from r2m.utils.io import read_json

    rows: Rows = {}
    for f in sorted(root.rglob("per_image.parquet")):
        ev = f.parent / "eval.json"
        if not ev.is_file():
            continue
        try:
            evaluation = read_json(ev)
            if "skipped" in evaluation:  # a baseline skipped for want of paired captions
                continue
            stats, _ = per_image.read(f)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise PowerError(f"{f.parent}: cannot read it ({type(e).__name__}: {' '.join(str(e).split())})") from None
        if metric not in stats.metrics() or stats.n < 2:
            continue
        row, seed = _row_and_seed(f.parent.relative_to(root))
        rows.setdefault(row, {})[seed] = stats
    return rows


def by_dataset(rows: Rows, root_name: str = ".") -> dict[str, Rows]:
    """The rows grouped by the test images they scored (one group per dataset: spreads measured on
    different test sets are never pooled), each group named by its rows' common leading path
    (``results`` holding ``demo/…`` and ``tiny_paired/…``: ``demo``, ``tiny_paired``), else
    ``root_name``; groups in name order."""
    groups: dict[frozenset[str], list[str]] = {}
    for name, seeds in rows.items():
        groups.setdefault(frozenset(next(iter(seeds.values())).ids), []).append(name)
    out = {}
    for names in groups.values():
        parts = [n.split("/") for n in names]
        common = []
        for segs in zip(*parts, strict=False):
            if len(set(segs)) != 1:
                break
            common.append(segs[0])
        if len(names) == 1:
            common = common[:-1]  # a lone row: its folder, not the row itself
        label = "/".join(common) or root_name
        while label in out:
            label += "'"
        out[label] = {n: rows[n] for n in names}
    return dict(sorted(out.items()))


def _runs(seeds: dict[int | None, PerImage]) -> list[PerImage]:
    return [seeds[s] for s in sorted(seeds, key=lambda s: -1 if s is None else s)]


def median_fit(fits: Sequence[N.Fit]) -> N.Fit:
    """One fit from several pairs' fits: the median of each component (seed variance and residual over the
    unfixed sides of every fit, the image component scaled to the largest image count), at the most runs
    and images any fit had."""
    n = max(f.n for f in fits)
    sides = [s for f in fits for s in f.sides if not s.fixed]
    image = float(np.median([f.image * f.n / n for f in fits]))
    if not sides:
        side = N.Side(0.0, 1, True, 0.0, 0.0)
        return N.Fit(side, side, image, n)
    runs = max(s.runs for s in sides)
    side = N.Side(0.0, runs, False, float(np.median([s.seed_var for s in sides])),
                  float(np.median([s.resid_var for s in sides])))
    return N.Fit(side, side, image, n)


def summarise(rows: Rows, deltas: Sequence[float], metric: str, family: int = DEFAULT_FAMILY,
              target: float = N.DEFAULT_POWER, resamples: int = DEFAULT_RESAMPLES) -> dict:
    """The fitted components (× 100) of every pair of rows, their medians, and per delta (× 100) the images and
    seeds that detect it with power ``target`` at level 0.05 / ``family``."""
    names = sorted(rows)
    fits = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            got = N.fit(_runs(rows[b]), _runs(rows[a]), [metric], resamples)
            if metric in got and math.isfinite(got[metric].image):
                fits.append(got[metric])
    one = [N.fit(_runs(seeds), (), [metric], resamples)[metric] for seeds in rows.values()]
    runs = sorted({len(s) for s in rows.values()})
    out: dict = {"rows": len(rows), "images": max(f.n for f in one), "runs": runs, "pairs": len(fits),
                 "family": family, "power": target, "alpha": ALPHA / family, "deltas": []}
    seeded = [s for f in one for s in f.sides if not s.fixed]
    out["sd_seed"] = _sd_median([s.seed_effect() for s in seeded])
    out["sd_residual"] = _sd_median([s.resid_var * f.n for f in one for s in f.sides if not s.fixed])
    if not fits:
        return out
    out["sd_interaction"] = _sd_median([f.image * f.n for f in fits])
    fit = median_fit(fits)
    upper = fit.upper(CONFIDENCE)
    out["fit"] = {"images": fit.n, "runs": fit.b.runs, "fixed": fit.b.fixed}
    alpha = ALPHA / family
    for d in deltas:
        delta = d / 100
        out["deltas"].append({
            "delta": d,
            "images": N.images_needed(fit, delta, alpha, target), "images_hi": N.images_needed(upper, delta, alpha, target),
            "seeds": N.seeds_needed(fit, delta, alpha, target), "seeds_hi": N.seeds_needed(upper, delta, alpha, target),
            "mde_here": 100 * N.mde(fit, alpha, target)})
    return out


def _sd_median(variances: Sequence[float]) -> float | None:
    return 100 * math.sqrt(float(np.median(variances))) if variances else None


def render(s: dict, metric: str, root: Path) -> str:
    def sd(v: float | None) -> str:
        return "—" if v is None else f"{v:.1f}"

    def count(v: int | None, seeds: bool = False) -> str:
        if v is None:
            return "none" if not seeds or not s.get("fit", {}).get("fixed") else "— (one run per row)"
        return f"{v:,}"

    lines = [f"{root}: {s['rows']} rows, {s['images']} test images, seeds per row {', '.join(map(str, s['runs']))}, "
             f"{metric} ×100" + (f" (dataset {s['dataset']})" if s.get("dataset") else ""),
             f"  fitted (median over {s['pairs']} pairs of rows): seed effect sd {sd(s['sd_seed'])}, "
             f"seed × image residual sd {sd(s['sd_residual'])} per image, system × image interaction sd "
             f"{sd(s.get('sd_interaction'))} per image"]
    if not s["deltas"]:
        lines.append("  (one row: no pair of rows to plan a difference from)")
        return "\n".join(lines)
    f = s["fit"]
    lines += ["",
              f"| {metric} difference | test images at {f['runs']} seed(s) per system | seeds per system on "
              f"{f['images']} images |",
              "|---|---|---|"]
    for d in s["deltas"]:
        lines.append(f"| {d['delta']:g} | {count(d['images'])} (upper: {count(d['images_hi'])}) | "
                     f"{count(d['seeds'], True)} (upper: {count(d['seeds_hi'], True)}) |")
    here = s["deltas"][0]["mde_here"]
    lines += ["", f"(80 % power at level 0.05 / {s['family']} = {s['alpha']:.4g}, Holm's first step over a family of "
              f"{s['family']}; upper: every variance at its {int(100 * CONFIDENCE)} % upper confidence bound; at the "
              f"measured size a difference of {here:.1f} is detected with 80 % power; docs/guide/statistics.md)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from r2m.utils.cliargs import OneLineParser, float_in, int_in, list_of

    ap = OneLineParser(
        prog="r2m power",
        description="How many test images or seeds per system detect a metric difference with 80 % power after "
                    "the correction, from the variance components fitted to a results folder "
                    "(results/<dataset>: every row's eval.json + per_image.parquet, seeds as s<k> segments).")
    ap.add_argument("results", type=Path, help="a results folder, e.g. results/demo")
    ap.add_argument("--metric", default="CIDEr", help="a metric of per_image.parquet (default CIDEr)")
    ap.add_argument("--deltas", type=list_of(float_in(0, 10_000, open_lo=True)), default=[1.0, 5.0, 10.0],
                    help="differences to detect, ×100 (default 1,5,10)")
    ap.add_argument("--family", type=int_in(1, 10_000), default=DEFAULT_FAMILY,
                    help=f"comparisons in the family of the correction (default {DEFAULT_FAMILY}: Table 2's)")
    ap.add_argument("--power", type=float_in(0, 1, open_lo=True, open_hi=True), default=N.DEFAULT_POWER,
                    help="the power to reach (default 0.8)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    a = ap.parse_args(argv)
    deltas = a.deltas
    if not a.results.is_dir():
        print(f"r2m power: {a.results} is not a folder", file=sys.stderr)
        return 2
    try:
        rows = scan(a.results, a.metric)
    except PowerError as e:
        print(f"r2m power: {e}", file=sys.stderr)
        return 2
    if not rows:
        print(f"r2m power: no result folder with eval.json and per_image.parquet (with {a.metric}) under "
              f"{a.results}", file=sys.stderr)
        return 2
    groups = by_dataset(rows, a.results.name or str(a.results))
    summaries = [{"dataset": name, **summarise(g, deltas, a.metric, a.family, a.power)} for name, g in groups.items()]
    if a.json:
        print(json.dumps({"metric": a.metric, "datasets": summaries}, indent=1))
    else:
        print("\n\n".join(render(s, a.metric, a.results / s["dataset"] if len(groups) > 1 else a.results)
                           for s in summaries))
    return 0
