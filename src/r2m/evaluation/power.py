"""How many test images, or training seeds, resolve a metric difference of a given size.

Two planning rules behind the guide's rule of thumb (docs/guide/statistics.md), both for a 95 %
interval of the difference of two systems that should exclude 0 when the true difference is ``delta``
(the interval's half-width at most ``delta``; this is the 50 %-power point, not a power analysis):

* **images** — the paired difference over images: a corpus metric that is a mean of per-image values
  (CIDEr-D with the document frequencies held fixed) has a paired-bootstrap interval of about
  ``mean ± z · sd_d / √n`` for ``n`` images whose per-image differences have standard deviation
  ``sd_d``; so ``n ≥ (z · sd_d / delta)²``.
* **seeds** — two systems with ``k`` seeds each on one test set, the Student-t interval of the
  difference of their means with the pooled standard deviation ``sd_s`` of one system's seeds:
  ``t_{2k-2} · sd_s · √(2/k) ≤ delta``.

Two rules for rows **paired seed by seed** (the claims' figures, :mod:`r2m.reports.claims`), from the
seed-aware interval of :func:`r2m.evaluation.randomization.seed_difference`: its half-width is
``hypot(t_{k-1} · sd_d / √k, z · sd_i / √n)``, with ``sd_d`` the standard deviation of the ``k``
per-seed paired differences and ``sd_i`` that of the per-image differences averaged over the seeds:

* :func:`paired_images_needed` — the seeds held, the fewest images that bring the half-width to
  ``delta``; none when the seed half-width alone is ``≥ delta``;
* :func:`paired_seeds_needed` — the images held (their half-width kept at its measured value: more
  seeds on the same images do not narrow it much), the fewest seed pairs; none when the image
  half-width alone is ``≥ delta``.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from r2m.evaluation.bootstrap import DEFAULT_LEVEL, t_quantile
from r2m.utils.io import read_json

MAX_COUNT = 10**9  # beyond this the answer is printed as "more than"


def z_quantile(level: float = DEFAULT_LEVEL) -> float:
    """The z with P(|Z| ≤ z) = ``level`` for a standard normal (bisection on erf)."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    lo, hi = 0.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if math.erf(mid / math.sqrt(2)) < level:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _check(sd: float, delta: float) -> None:
    if not (math.isfinite(sd) and sd >= 0 and math.isfinite(delta) and delta > 0):
        raise ValueError(f"need a finite sd >= 0 and a delta > 0, got sd={sd}, delta={delta}")


def images_needed(sd_diff: float, delta: float, level: float = DEFAULT_LEVEL) -> int:
    """Smallest number of test images whose paired interval (half-width z·sd/√n) is ≤ ``delta``."""
    _check(sd_diff, delta)
    return max(1, math.ceil((z_quantile(level) * sd_diff / delta) ** 2))


def seeds_needed(sd_seed: float, delta: float, level: float = DEFAULT_LEVEL,
                 most: int = 10_000) -> int | None:
    """Smallest seeds per system ``k ≥ 2`` with ``t_{2k-2} · sd · √(2/k) ≤ delta``; None above ``most``."""
    _check(sd_seed, delta)
    def half(k: int) -> float:
        return t_quantile(level, 2 * k - 2) * sd_seed * math.sqrt(2 / k)

    return _first_fit(half, delta, most)


def _first_fit(half: Callable[[int], float], limit: float, most: int) -> int | None:
    """The smallest ``k`` in ``2..most`` with ``half(k) ≤ limit`` (``half`` falls with ``k``: bisected); None when
    even ``most`` does not fit."""
    if half(most) > limit:
        return None
    lo, hi = 2, most
    while lo < hi:
        mid = (lo + hi) // 2
        if half(mid) <= limit:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _room(sd: float, delta: float, other_half: float, other: str) -> float | None:
    """``delta² − other_half²``: what the other source of spread leaves of the half-width (None: nothing)."""
    _check(sd, delta)
    if not (math.isfinite(other_half) and other_half >= 0):
        raise ValueError(f"need a finite {other} half-width >= 0, got {other_half}")
    room = delta * delta - other_half * other_half
    return room if room > 0 else None


def paired_images_needed(sd_images: float, delta: float, seed_half: float = 0.0,
                         level: float = DEFAULT_LEVEL) -> int | None:
    """Smallest ``n`` with ``hypot(seed_half, z · sd_images / √n) ≤ delta`` (``seed_half`` 0: one seed
    pair, :func:`images_needed`); None when ``seed_half ≥ delta`` (no number of images is enough)."""
    room = _room(sd_images, delta, seed_half, "seed")
    if room is None:
        return None
    return max(1, math.ceil((z_quantile(level) * sd_images) ** 2 / room - 1e-9))


def paired_seeds_needed(sd_diff: float, delta: float, image_half: float = 0.0, level: float = DEFAULT_LEVEL,
                        most: int = 10_000) -> int | None:
    """Smallest ``k ≥ 2`` seed pairs with ``hypot(t_{k-1} · sd_diff / √k, image_half) ≤ delta``; None when
    ``image_half ≥ delta`` or above ``most``."""
    room = _room(sd_diff, delta, image_half, "image")
    if room is None:
        return None
    room = math.sqrt(room)

    def half(k: int) -> float:
        return t_quantile(level, k - 1) * sd_diff / math.sqrt(k)

    return _first_fit(half, room, most)


def paired_sd(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """Sample standard deviation of the per-image differences ``b - a`` (rows aligned by image)."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or len(x) < 2:
        raise ValueError(f"need two aligned 1-d arrays of ≥ 2 values, got shapes {x.shape} and {y.shape}")
    return float(np.std(y - x, ddof=1))


def pooled_seed_sd(groups: Sequence[Sequence[float]]) -> float:
    """Pooled standard deviation over seeds of several systems (each a list of ≥ 2 seed values)."""
    groups = [np.asarray(g, dtype=np.float64) for g in groups if len(g) >= 2]
    if not groups:
        raise ValueError("need at least one system with two or more seeds")
    ss = sum(float(((g - g.mean()) ** 2).sum()) for g in groups)
    df = sum(len(g) - 1 for g in groups)
    return math.sqrt(ss / df)


# --------------------------------------------------------------------------- `r2m power RESULTS`
SEED_SEGMENT = "s"  # results/<dataset>/<variant>/s<seed>/<ckpt>/: the seed axis's path segment


def _row_and_seed(rel: Path) -> tuple[str, int | None]:
    """``r2m/s1/train_i`` → ``("r2m/train_i", 1)``; a path without a seed segment has seed None."""
    parts, seed = [], None
    for p in rel.parts:
        if seed is None and len(p) > 1 and p[0] == SEED_SEGMENT and p[1:].isdigit():
            seed = int(p[1:])
        else:
            parts.append(p)
    return "/".join(parts), seed


def scan(root: Path, metric: str) -> dict[str, dict[int | None, tuple[float, dict[str, float]]]]:
    """Every result folder under ``root`` with an ``eval.json`` and ``per_image.parquet``: per row,
    per seed, the corpus value and the per-image values of ``metric`` (×100)."""
    import pandas as pd

    rows: dict[str, dict[int | None, tuple[float, dict[str, float]]]] = {}
    for f in sorted(root.rglob("per_image.parquet")):
        ev = f.parent / "eval.json"
        if not ev.is_file():
            continue
        try:
            evaluation = read_json(ev)
            if "skipped" in evaluation:  # a baseline skipped for want of paired captions
                continue
            corpus = evaluation[metric]
            table = pd.read_parquet(f, columns=["image_id", metric])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise PowerError(f"{f.parent}: cannot read {metric} ({type(e).__name__}: {e})") from None
        if corpus is None:
            continue
        row, seed = _row_and_seed(f.parent.relative_to(root))
        per_image = {str(i): 100.0 * float(v) for i, v in zip(table["image_id"], table[metric], strict=True)}
        rows.setdefault(row, {})[seed] = (100.0 * float(corpus), per_image)
    return rows


class PowerError(ValueError):
    """A one-line reason `r2m power` cannot plan from its inputs."""


def by_dataset(rows: dict[str, dict[int | None, tuple[float, dict[str, float]]]],
               root_name: str = ".") -> dict[str, dict[str, dict[int | None, tuple[float, dict[str, float]]]]]:
    """The rows grouped by the test images they scored (one group per dataset: spreads measured on
    different test sets are never pooled), each group named by its rows' common leading path
    (``results`` holding ``demo/…`` and ``tiny_paired/…``: ``demo``, ``tiny_paired``), else
    ``root_name``; groups in name order."""
    groups: dict[frozenset[str], list[str]] = {}
    for name, seeds in rows.items():
        first = seeds[min(seeds, key=lambda s: -1 if s is None else s)][1]
        groups.setdefault(frozenset(first), []).append(name)
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


def summarise(rows: dict[str, dict[int | None, tuple[float, dict[str, float]]]],
              deltas: Sequence[float], level: float = DEFAULT_LEVEL) -> dict:
    """The spreads measured in ``rows`` and, per delta, the images and seeds that resolve it."""
    firsts = {r: seeds[min(seeds, key=lambda s: -1 if s is None else s)][1] for r, seeds in rows.items()}
    names = sorted(firsts)
    sds = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ids = sorted(set(firsts[a]) & set(firsts[b]))
            if len(ids) >= 2:
                sds.append(paired_sd([firsts[a][k] for k in ids], [firsts[b][k] for k in ids]))
    groups = [[v for v, _ in seeds.values()] for seeds in rows.values() if len(seeds) >= 2]
    out: dict = {"rows": len(rows), "images": max((len(f) for f in firsts.values()), default=0),
                 "pairs": len(sds), "sd_paired_image": float(np.median(sds)) if sds else None,
                 "sd_paired_image_range": [float(min(sds)), float(max(sds))] if sds else None,
                 "seed_groups": len(groups), "seeds": sum(len(g) for g in groups),
                 "sd_seed": pooled_seed_sd(groups) if groups else None, "level": level, "deltas": []}
    for d in deltas:
        out["deltas"].append({
            "delta": d,
            "images": images_needed(out["sd_paired_image"], d, level) if sds else None,
            "seeds": (seeds_needed(out["sd_seed"], d, level) if groups else None),
            "seeds_known": bool(groups)})
    return out


def render(s: dict, metric: str, root: Path) -> str:
    def sd(v: float | None) -> str:
        return "—" if v is None else f"{v:.1f}"

    lines = [f"{root}: {s['rows']} rows, {s['images']} test images, {metric} ×100"
             + (f" (dataset {s['dataset']})" if s.get("dataset") else ""),
             f"  per-image paired difference sd {sd(s['sd_paired_image'])} (median of {s['pairs']} pairs of rows"
             + (f", {s['sd_paired_image_range'][0]:.1f}–{s['sd_paired_image_range'][1]:.1f}" if s["pairs"] else "")
             + ")",
             f"  seed-to-seed sd {sd(s['sd_seed'])} (pooled over {s['seed_groups']} rows, {s['seeds']} runs)",
             "",
             f"| {metric} difference | test images (paired) | seeds per system (t) |",
             "|---|---|---|"]
    for d in s["deltas"]:
        img = "—" if d["images"] is None else f"{d['images']:,}"
        seeds = "—" if not d["seeds_known"] else ("> 10,000" if d["seeds"] is None else str(d["seeds"]))
        lines.append(f"| {d['delta']:g} | {img} | {seeds} |")
    lines.append("")
    lines.append(f"(a {int(round(100 * s['level']))} % interval of the difference just excludes 0 when the true "
                 "difference is this size: docs/guide/statistics.md)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from r2m.utils.cliargs import OneLineParser, float_in, list_of

    ap = OneLineParser(
        prog="r2m power",
        description="How many test images (paired bootstrap) or seeds per system (t over seeds) resolve a "
                    "metric difference, from the spreads measured in a results folder "
                    "(results/<dataset>: every row's eval.json + per_image.parquet, seeds as s<k> segments).")
    ap.add_argument("results", type=Path, help="a results folder, e.g. results/demo")
    ap.add_argument("--metric", default="CIDEr", help="a per-image metric of per_image.parquet (default CIDEr)")
    ap.add_argument("--deltas", type=list_of(float_in(0, 10_000, open_lo=True)), default=[1.0, 5.0, 10.0],
                    help="differences to resolve, ×100 (default 1,5,10)")
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
        print(f"r2m power: no result folder with eval.json and per_image.parquet under {a.results}",
              file=sys.stderr)
        return 2
    groups = by_dataset(rows, a.results.name or str(a.results))
    summaries = [{"dataset": name, **summarise(g, deltas)} for name, g in groups.items()]
    if a.json:
        print(json.dumps({"metric": a.metric, "datasets": summaries}, indent=1))
    else:
        print("\n\n".join(render(s, a.metric, a.results / s["dataset"] if len(groups) > 1 else a.results)
                           for s in summaries))
    return 0
