"""Intervals and paired comparisons for every results table, all from one model of the noise.

A table row of this run is the evaluation of one or more training seeds (a list of result folders:
each seed's ``eval.json`` and ``per_image.parquet``). Per metric the row gives the **mean over seeds**
and a 95 % interval from the variance components of :mod:`r2m.evaluation.noise` (the seeds' spread
plus the image component, t with Welch–Satterthwaite degrees of freedom; one seed: t over the test
images); the ``interval`` cell says which, ``seeds`` and ``images`` how much stands behind it. A row
with no per-image statistics but several seeds gets Student's t over the seeds' values.

Each compared row is set against its reference row (Table 2: R2M; Table 3: the stage before; the
baselines: the most frequent training caption), over the seeds both rows ran (a row at seed 0 only
meets the reference's seed 0, and ``vs`` says so) and the images both scored
(:func:`r2m.evaluation.noise.compare`: the difference of the means, an interval holding the seeds'
spread and the images', and the two-sided p of the same t). **The family** of the multiple-comparison
correction is one table's comparisons on one dataset and one metric (:func:`holm_by_metric`): Holm's
step-down correction within it; the mark is ``*`` when the adjusted p ≤ 0.05, else ``n.s.``. The
claims (:mod:`r2m.reports.claims`) are those same comparisons in those same families, so a difference
has one adjusted p. CIDEr is the primary metric (the one the paper's claims are read on). Beside the
mark, ``mde`` is the minimum detectable effect: the difference the test would detect with 80 % power
at this comparison's standard error, at level 0.05 / family (Holm's first step).

Bootstrap draws come from a fixed seed (:data:`BOOT_SEED`), so the tables are reproducible byte for
byte. The CSV cells, Markdown and sentence of these figures: :mod:`r2m.reports.cells`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from r2m.evaluation import noise as N
from r2m.evaluation import per_image
from r2m.evaluation import randomization as RZ
from r2m.evaluation.bootstrap import (
    DEFAULT_LEVEL,
    DEFAULT_RESAMPLES,
    PerImage,
    percentile_interval,
    resample_chunks,
    t_interval,
)
from r2m.stage.context import StageContext

BOOT_SEED = 0
ALPHA = 0.05
T_SEEDS = "t over seeds"
T_SEEDS_IMAGES = "t over seeds and images"
T_IMAGES = "t over images"
BOOT_QUERIES = "bootstrap over queries"
SIGNIFICANT, NOT_SIGNIFICANT = "*", "n.s."
SEEDS_AGREE = " (zero width: the seeds agree)"
SEEDS_AGREE_QUERIES = "; bootstrap over queries where the seeds agree"
_CHUNK = 100  # resamples expanded over seeds at once (bounds memory on 5,000 images × several seeds)
_STALE_TOL = 1e-6


# --------------------------------------------------------------------------- what a row holds
@dataclass(frozen=True)
class RowEval:
    """One row of this run: per seed its ``eval.json`` (dict) and per-image statistics (same order;
    a skipped evaluation has no rows)."""

    evals: Sequence[Mapping[str, Any]]
    stats: Sequence[PerImage] = field(default_factory=tuple)
    seeds: Sequence[str] = ()  # each eval's seed (the DAG's seed axis); empty: not a seeded run

    @property
    def first(self) -> Mapping[str, Any]:
        return self.evals[0] if self.evals else {}

    def only(self, seeds: Sequence[str]) -> RowEval:
        """The row restricted to ``seeds`` (in that order)."""
        at = [list(self.seeds).index(s) for s in seeds]
        stats = [self.stats[i] for i in at] if len(self.stats) == len(self.evals) else []
        return RowEval([self.evals[i] for i in at], stats, list(seeds))


@dataclass(frozen=True)
class Summary:
    """Per metric ``(mean, low, high)`` (low/high None: no interval), and what stands behind it."""

    values: Mapping[str, tuple[float | None, float | None, float | None]]
    seeds: int
    images: int | None
    interval: str


def read_stats(path: str | Path, evaluation: Mapping[str, Any] | None = None) -> PerImage:
    """A ``per_image.parquet``; when ``evaluation`` (its ``eval.json``) is given, the file must be
    the same evaluation (the metrics it records equal those of ``eval.json``): else one line naming
    the file and the metric."""
    if not Path(path).exists():
        raise FileNotFoundError(f"missing per-image file {path}; run `r2m evaluate` for it (it writes it beside "
                                "eval.json)")
    stats, meta = per_image.read(path)
    recorded = meta.get("metrics") or {}
    for name, value in (evaluation or {}).items():
        have = recorded.get(name)
        if isinstance(value, (int, float)) and isinstance(have, (int, float)) and abs(value - have) > _STALE_TOL:
            raise per_image.PerImageError(
                f"{path}: per-image statistics of another evaluation ({name} {have!r} here, {value!r} in "
                f"eval.json); re-run `r2m evaluate` for it")
    return stats


def group_paths(gathered: Sequence[tuple[Mapping[str, str], Any]], key_of) -> dict[Any, list[Path]]:
    """Gathered ``(keys, path)`` pairs grouped into one list per row (``key_of(keys)``): several
    seeds of one row become one list, in gather order."""
    out: dict[Any, list[Path]] = {}
    for keys, path in gathered:
        out.setdefault(key_of(keys), []).append(Path(path))
    return out


def group_seeds(gathered: Sequence[tuple[Mapping[str, str], Any]], key_of) -> dict[Any, list[str]]:
    """Like :func:`group_paths`, each gathered item's seed (``""`` for an item without the seed axis)."""
    out: dict[Any, list[str]] = {}
    for keys, _ in gathered:
        out.setdefault(key_of(keys), []).append(str(keys.get("seed", "")))
    return out


def gathered_rows(ctx: StageContext, evals: str, stats: str | None, key_of, read_eval) -> dict[Any, RowEval]:
    """Each row's seeds from a stage's gathered inputs: the ``evals`` (``eval.json`` paths, read by
    ``read_eval(path, key)``) and, when ``stats`` names a gathered input, the ``per_image.parquet`` beside
    them; rows keyed by ``key_of`` (the gathered paths' axes → a row key)."""
    gathered = ctx.gather(evals)
    paths, seeds = group_paths(gathered, key_of), group_seeds(gathered, key_of)
    stat_paths = group_paths(ctx.gather(stats), key_of) if stats is not None else {}
    out = {}
    for k, ps in paths.items():
        evs = [read_eval(p, k) for p in ps]
        out[k] = RowEval(evs, [read_stats(p, ev) for p, ev in zip(stat_paths.get(k, []), evs, strict=False)],
                         seeds[k])
    return out


def first_seeds(gathered: Sequence[tuple[Mapping[str, str], Any]], key_of) -> dict[Any, tuple[Mapping[str, str], Any]]:
    """The first gathered ``(keys, path)`` of each ``key_of(keys)``: a run's first seed, for what a table or
    figure shows of one seed only (examples, attention maps, training metrics)."""
    out: dict[Any, tuple[Mapping[str, str], Any]] = {}
    for keys, path in gathered:
        out.setdefault(key_of(keys), (keys, path))
    return out


# --------------------------------------------------------------------------- one row: mean and interval
def summarise(row: RowEval, metrics: Sequence[str], resamples: int = DEFAULT_RESAMPLES,
              level: float = DEFAULT_LEVEL) -> Summary:
    """Mean over seeds and its interval per metric: the variance components of the row's runs
    (:func:`r2m.evaluation.noise.fit`, one system) where every seed has per-image statistics; else
    Student's t over ≥ 2 seeds' values; else no interval."""
    seeds = len(row.evals)
    sizes = {s.n for s in row.stats}
    images = sizes.pop() if len(sizes) == 1 else (row.first.get("n_images") if seeds == 1 else None)
    values: dict[str, tuple[float | None, float | None, float | None]] = {}
    runs = list(row.stats) if len(row.stats) == seeds and all(s.n >= 2 for s in row.stats) else []
    if runs and len({frozenset(s.ids) for s in runs}) > 1:  # seeds scored on different images: no common draws
        runs = []
    have = set.intersection(*(set(s.metrics()) for s in runs)) if runs else set()
    fits = N.fit(runs, (), [m for m in metrics if m in have], resamples, BOOT_SEED) if runs and have else {}
    flat = False
    for m in metrics:
        vals = [ev.get(m) for ev in row.evals]
        if not vals or any(not isinstance(v, (int, float)) or not math.isfinite(v) for v in vals):
            values[m] = (float(vals[0]) if seeds == 1 and isinstance(vals[0], (int, float)) else None, None, None)
            continue
        mean = float(np.mean([float(v) for v in vals]))
        if m in fits:
            e = N.estimate(fits[m], level)
            values[m] = (mean, e.low, e.high) if math.isfinite(e.low) else (mean, None, None)
        elif seeds >= 2:
            ci = t_interval([float(v) for v in vals], level)
            values[m] = (ci.value, ci.low, ci.high)
            flat = flat or ci.low == ci.high
        else:
            values[m] = (mean, None, None)
    if fits:
        kind = T_SEEDS_IMAGES if seeds >= 2 else T_IMAGES
    else:
        kind = (T_SEEDS + (SEEDS_AGREE if flat else "")) if seeds >= 2 and values else ""
    return Summary(values, seeds, images, kind)


# --------------------------------------------------------------------------- paired, pooled over seeds
def _rows_for(stats: PerImage, ids: Sequence[str]) -> PerImage:
    where = {i: r for r, i in enumerate(stats.ids)}
    return stats.take([where[i] for i in ids])


def shared_seeds(row: RowEval, ref: RowEval) -> list[str] | None:
    """The seeds both rows ran, in ``ref``'s order; ``None`` when either is not a seeded run (e.g. the
    most-frequent-caption reference point) and so pairs with every seed of the other. A difference
    between different seeds would mix seed-to-seed spread into what the test over images calls
    resolved (an ablation at seed 0 against R2M's mean over seeds 0–2), so only shared seeds are paired."""
    if not all(row.seeds) or not all(ref.seeds) or not row.seeds or not ref.seeds:
        return None
    return [s for s in ref.seeds if s in set(row.seeds)]



def compared_runs(row: RowEval, ref: RowEval) -> tuple[list[PerImage], list[PerImage]]:
    """The per-image statistics of ``row``'s and ``ref``'s runs a comparison uses: the seeds both ran
    (:func:`shared_seeds`; an unseeded side keeps its one run), each cut to the images every run scored.
    Empty lists when either side has no statistics or no image is shared."""
    shared = shared_seeds(row, ref)
    if shared is not None:
        row, ref = row.only(shared), ref.only(shared)
    if not row.stats or not ref.stats or not all(s.n for s in (*row.stats, *ref.stats)):
        return [], []
    common = set.intersection(*(set(s.ids) for s in (*row.stats, *ref.stats)))
    ids = [i for i in ref.stats[0].ids if i in common]
    if not ids:
        return [], []
    return [_rows_for(s, ids) for s in row.stats], [_rows_for(s, ids) for s in ref.stats]


def paired(row: RowEval, ref: RowEval, metrics: Sequence[str], resamples: int = DEFAULT_RESAMPLES,
           level: float = DEFAULT_LEVEL) -> dict[str, N.Estimate]:
    """``row − ref`` per metric over the seeds both ran and the images both scored (:func:`compared_runs`):
    :func:`r2m.evaluation.noise.compare` of the row's runs against the reference's (one run on a side: a
    fixed model; one run on both: images only). ``{}`` when nothing pairs."""
    rows, refs = compared_runs(row, ref)
    if not rows or rows[0].n < 2:
        return {}
    have = set.intersection(*(set(s.metrics()) for s in (*rows, *refs)))
    metrics = [m for m in metrics if m in have]
    if not metrics:
        return {}
    return N.compare(rows, refs, metrics, resamples, BOOT_SEED, level)


def holm_by_metric(diffs: Mapping[Any, Mapping[str, N.Estimate] | None]) -> dict[Any, dict[str, float]]:
    """Holm-adjusted p of every difference of one family per metric: ``diffs`` holds one table's comparisons
    on one dataset (row key → metric → estimate); each metric's differences are one family
    (:func:`r2m.evaluation.randomization.holm`). Returns row key → metric → adjusted p."""
    out: dict[Any, dict[str, float]] = {}
    metrics = list(dict.fromkeys(m for ds in diffs.values() if ds for m in ds))
    for m in metrics:
        flat = {k: ds[m].p for k, ds in diffs.items() if ds and m in ds and ds[m].p == ds[m].p}
        for k, p in (RZ.holm(flat) if flat else {}).items():
            out.setdefault(k, {})[m] = p
    return out


def family_sizes(diffs: Mapping[Any, Mapping[str, N.Estimate] | None]) -> dict[str, int]:
    """Per metric, how many differences its family holds (see :func:`holm_by_metric`)."""
    out: dict[str, int] = {}
    for ds in diffs.values():
        for m, d in (ds or {}).items():
            if d.p == d.p:
                out[m] = out.get(m, 0) + 1
    return out


def mde(diff: N.Estimate, family: int, alpha: float = ALPHA) -> float:
    """The minimum detectable effect of a comparison: 80 % power at its standard error and degrees of
    freedom, at level ``alpha / family`` (Holm's first step: what the correction asks of one difference)."""
    return N.mde(diff.fit, alpha / max(1, family))


# --------------------------------------------------------------------------- retrieval: over queries
RET_TASKS = ("sentence_retrieval", "image_retrieval")
RET_METRICS = ("R@1", "R@5", "R@10", "Med r")


def _rank_stats(ranks: np.ndarray) -> dict[str, np.ndarray]:
    """R@K (percent) and the median rank of each row of first-match ranks ``[resamples, queries]``."""
    out = {m: 100.0 * (ranks <= int(m[2:])).mean(axis=1) for m in RET_METRICS if m.startswith("R@")}
    out["Med r"] = np.median(ranks, axis=1)
    return out


def retrieval_summary(results: Sequence[Mapping[str, Any]], resamples: int = DEFAULT_RESAMPLES,
                      level: float = DEFAULT_LEVEL) -> Summary:
    """Per ``task/metric`` (e.g. ``sentence_retrieval/R@1``) the mean over seeds and its interval:
    t over ≥ 2 seeds, else the percentile bootstrap over the queries of the one seed when its
    ``retrieval.json`` keeps per-query ``ranks`` (else no interval)."""
    keys = [(t, m) for t in RET_TASKS for m in RET_METRICS]
    values: dict[str, tuple[float | None, float | None, float | None]] = {}
    images = results[0].get("n_images") if results else None
    if len(results) >= 2:
        flat = []
        for t, m in keys:
            ci = t_interval([float(r[t][m]) for r in results], level)
            values[f"{t}/{m}"] = (ci.value, ci.low, ci.high)
            if ci.low == ci.high:
                flat.append(f"{t}/{m}")
        boot = retrieval_summary(results[:1], resamples, level) if flat and results[0].get("ranks") else None
        for k in flat if boot else ():
            values[k] = (values[k][0], boot.values[k][1], boot.values[k][2])
        return Summary(values, len(results), images,
                       T_SEEDS + (SEEDS_AGREE_QUERIES if boot else SEEDS_AGREE if flat else ""))
    res = results[0]
    ranks = res.get("ranks") or {}
    for t in RET_TASKS:
        r = np.asarray(ranks.get(t) or [], dtype=np.float64)
        draws: dict[str, list[np.ndarray]] = {m: [] for m in RET_METRICS}
        if r.size:
            for idx in resample_chunks(r.size, resamples, BOOT_SEED):
                for start in range(0, len(idx), _CHUNK):
                    for m, v in _rank_stats(r[idx[start:start + _CHUNK]]).items():
                        draws[m].append(v)
        for m in RET_METRICS:
            lo = hi = None
            if draws[m]:
                lo, hi = percentile_interval(np.concatenate(draws[m]), level)
            values[f"{t}/{m}"] = (float(res[t][m]), lo, hi)
    return Summary(values, 1, images, BOOT_QUERIES if ranks else "")


def mark(diff: N.Estimate | None, adjusted: float | None = None, alpha: float = ALPHA) -> str:
    """``*`` when the (Holm-adjusted, when given) p ≤ ``alpha``, else ``n.s.``; empty without a difference."""
    if diff is None:
        return ""
    p = diff.p if adjusted is None else adjusted
    return SIGNIFICANT if p <= alpha else NOT_SIGNIFICANT
