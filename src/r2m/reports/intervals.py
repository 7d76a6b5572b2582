"""Intervals and paired comparisons for every results table.

A table row of this run is the evaluation of one or more training seeds (a list of result folders:
each seed's ``eval.json`` and ``per_image.parquet``). Per metric the row gives

* the **mean over seeds** and a 95 % interval: Student's t over the seeds' values when there are
  ≥ 2 seeds (:func:`r2m.evaluation.bootstrap.t_interval`), else the percentile bootstrap over the
  test images of the one seed (:func:`r2m.evaluation.bootstrap.bootstrap_ci`); the ``interval``
  cell says which, ``seeds`` and ``images`` how much stands behind it;
  When every seed gives the same value (a zero-width t interval), that metric's interval is the
  bootstrap over the images (queries) instead and the ``interval`` cell says so;
* against a reference row (Table 2: R2M; Table 3: R2M's final checkpoint; the baselines: the most
  frequent training caption), the difference ``row − reference`` paired seed by seed over the seeds
  both rows ran (a row at seed 0 only meets the reference's seed 0, and ``vs`` says so) and image by
  image (:func:`r2m.evaluation.randomization.seed_difference`): with several seed pairs the mean
  per-seed difference, an interval with the seed-to-seed and the image spread, and a test that
  needs both the randomization over images and the t test over seeds to reject; with one, images
  only (randomization test, paired bootstrap interval). One table is one family: its compared rows ×
  metrics, Holm's step-down correction (:func:`holm_family`); the mark is ``*`` when the adjusted p
  ≤ 0.05, else ``n.s.``. CIDEr is the primary metric (the one the paper's claims are read on).

Bootstrap draws and randomization trials come from a fixed seed (:data:`BOOT_SEED`), so the tables are reproducible byte for
byte. Published rows have no interval (empty cells).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from r2m.evaluation import per_image
from r2m.evaluation import randomization as RZ
from r2m.evaluation.bootstrap import (
    DEFAULT_LEVEL,
    DEFAULT_RESAMPLES,
    PerImage,
    bootstrap_ci,
    percentile_interval,
    resample_chunks,
    t_interval,
)
from r2m.stage.context import StageContext

BOOT_SEED = 0
T_SEEDS = "t over seeds"
BOOT_IMAGES = "bootstrap over images"
BOOT_QUERIES = "bootstrap over queries"
SIGNIFICANT, NOT_SIGNIFICANT = "*", "n.s."
SEEDS_AGREE = " (zero width: the seeds agree)"
SEEDS_AGREE_IMAGES = "; bootstrap over images where the seeds agree"
SEEDS_AGREE_QUERIES = "; bootstrap over queries where the seeds agree"
COUNT_COLUMNS = ("seeds", "images", "interval")
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
    """Mean over seeds and its interval per metric (t over ≥ 2 seeds, else bootstrap over images)."""
    seeds = len(row.evals)
    sizes = {s.n for s in row.stats}
    images = sizes.pop() if len(sizes) == 1 else (row.first.get("n_images") if seeds == 1 else None)
    values: dict[str, tuple[float | None, float | None, float | None]] = {}
    if seeds >= 2:
        flat = []  # metrics whose seeds all agree: a zero-width t interval is no certainty
        for m in metrics:
            vals = [ev.get(m) for ev in row.evals]
            if any(not isinstance(v, (int, float)) or not math.isfinite(v) for v in vals):
                values[m] = (None, None, None)
                continue
            ci = t_interval([float(v) for v in vals], level)
            values[m] = (ci.value, ci.low, ci.high)
            if ci.low == ci.high:
                flat.append(m)
        stats = row.stats[0] if row.stats else None
        boot = [m for m in flat if stats is not None and stats.n and m in stats.metrics()]
        cis = bootstrap_ci(stats, resamples, BOOT_SEED, level, boot) if boot else {}
        for m, ci in cis.items():
            values[m] = (values[m][0], ci.low, ci.high)
        return Summary(values, seeds, images, T_SEEDS + (SEEDS_AGREE_IMAGES if cis else SEEDS_AGREE if flat else ""))
    stats = row.stats[0] if row.stats else None
    boot = [m for m in metrics if stats is not None and stats.n and m in stats.metrics()]
    cis = bootstrap_ci(stats, resamples, BOOT_SEED, level, boot) if boot else {}
    for m in metrics:
        v = row.first.get(m)
        point = float(v) if isinstance(v, (int, float)) else None
        ci = cis.get(m)
        values[m] = (point, ci.low if ci and point is not None else None, ci.high if ci and point is not None else None)
    return Summary(values, seeds, images, BOOT_IMAGES if cis else "")


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


def vs_label(label: str, row: RowEval, ref: RowEval) -> str:
    """The ``vs`` cell: the reference's label, and the seeds compared when some seed of either row is left out."""
    shared = shared_seeds(row, ref)
    if shared is None or (len(shared) == len(row.seeds) == len(ref.seeds)):
        return label
    return f"{label} ({'seed' if len(shared) == 1 else 'seeds'} {', '.join(shared)})"


def seed_pairs(row: RowEval, ref: RowEval) -> list[tuple[PerImage, PerImage]]:
    """``(reference, row)`` per-image statistics paired seed by seed (:func:`shared_seeds`), each on the
    images both scored; an unseeded side (one evaluation) pairs with every seed of the other. Empty
    when either has no rows or they share no seed or image."""
    shared = shared_seeds(row, ref)
    if shared is not None:
        row, ref = row.only(shared), ref.only(shared)
    if not row.stats or not ref.stats or not all(s.n for s in (*row.stats, *ref.stats)):
        return []
    if len(row.stats) == len(ref.stats):
        couples = list(zip(ref.stats, row.stats, strict=True))
    elif len(ref.stats) == 1:
        couples = [(ref.stats[0], s) for s in row.stats]
    elif len(row.stats) == 1:
        couples = [(s, row.stats[0]) for s in ref.stats]
    else:
        return []
    common = set.intersection(*(set(s.ids) for s in (*row.stats, *ref.stats)))
    ids = [i for i in ref.stats[0].ids if i in common]
    if not ids:
        return []
    return [(_rows_for(a, ids), _rows_for(b, ids)) for a, b in couples]


def paired(row: RowEval, ref: RowEval, metrics: Sequence[str], resamples: int = DEFAULT_RESAMPLES,
           level: float = DEFAULT_LEVEL, trials: int = RZ.DEFAULT_TRIALS) -> dict[str, RZ.SeedDifference]:
    """``row − ref`` per metric over the seeds both ran and the images both scored
    (:func:`seed_pairs`, :func:`r2m.evaluation.randomization.seed_difference`): one seed pair, the
    randomization test over images and the paired bootstrap interval; several, the mean per-seed
    difference with the seed-aware test and interval. ``{}`` when nothing pairs."""
    pairs = seed_pairs(row, ref)
    if not pairs:
        return {}
    have = set(RZ.common_metrics(pairs))
    metrics = [m for m in metrics if m in have]
    if not metrics:
        return {}
    return RZ.seed_difference(pairs, metrics, trials, resamples, BOOT_SEED, level)


def holm_family(diffs: Mapping[Any, Mapping[str, RZ.SeedDifference] | None]) -> dict[Any, dict[str, float]]:
    """Holm-adjusted p of every difference of one table (the family: its compared rows × metrics),
    per row key and metric (:func:`r2m.evaluation.randomization.holm`)."""
    flat = {(k, m): d.p for k, ds in diffs.items() if ds for m, d in ds.items() if d.p == d.p}
    adjusted = RZ.holm(flat) if flat else {}
    out: dict[Any, dict[str, float]] = {}
    for (k, m), p in adjusted.items():
        out.setdefault(k, {})[m] = p
    return out


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


def mark(diff: RZ.SeedDifference | None, adjusted: float | None = None, alpha: float = RZ.DEFAULT_ALPHA) -> str:
    """``*`` when the (Holm-adjusted, when given) p ≤ ``alpha``, else ``n.s.``; empty without a difference."""
    if diff is None:
        return ""
    p = diff.p if adjusted is None else adjusted
    return SIGNIFICANT if p <= alpha else NOT_SIGNIFICANT


# --------------------------------------------------------------------------- cells
def _pct(value: float | None, scale: float, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return f"{value * scale:.{digits}f}"


def interval_header(columns: Sequence[str]) -> list[str]:
    """``C, C_lo, C_hi`` for each table column."""
    return [h for c in columns for h in (c, f"{c}_lo", f"{c}_hi")]


DIFF_FIELDS = ("", "_lo", "_hi", "_p", "_holm", "_mark")


def diff_header(columns: Sequence[str]) -> list[str]:
    """``vs`` (the reference row), ``d_seeds`` (seed pairs behind the difference), then ``d_C``,
    ``d_C_lo``, ``d_C_hi``, ``d_C_p`` (the test's p), ``d_C_holm`` (Holm-adjusted within the table)
    and ``d_C_mark`` for each table column."""
    return ["vs", "d_seeds", *(f"d_{c}{f}" for c in columns for f in DIFF_FIELDS)]


def interval_cells(columns: Sequence[str], metric_of: Mapping[str, str], summary: Summary | None,
                   scale: float = 100.0) -> list[str]:
    """Value, low, high per column (× ``scale``); empty without a summary (published rows)."""
    if summary is None:
        return [""] * (3 * len(columns))
    out = []
    for c in columns:
        v, lo, hi = summary.values.get(metric_of[c], (None, None, None))
        out += [_pct(v, scale), _pct(lo, scale), _pct(hi, scale)]
    return out


def count_cells(summary: Summary | None) -> list[str]:
    if summary is None:
        return ["", "", ""]
    return [str(summary.seeds), "" if summary.images is None else str(int(summary.images)), summary.interval]


def _p_cell(p: float | None) -> str:
    return "" if p is None or p != p else f"{p:.4g}"


def diff_cells(columns: Sequence[str], metric_of: Mapping[str, str], vs: str,
               diffs: Mapping[str, RZ.SeedDifference] | None, scale: float = 100.0,
               adjusted: Mapping[str, float] | None = None) -> list[str]:
    """``vs``, ``d_seeds``, then difference, low, high, p, Holm-adjusted p and mark per column (the mark
    on the adjusted p when ``adjusted`` is given); all empty without a comparison."""
    if not diffs:
        return [""] * (2 + len(DIFF_FIELDS) * len(columns))
    seeds = {d.seeds for d in diffs.values()}
    out = [vs, str(seeds.pop()) if len(seeds) == 1 else ""]
    for c in columns:
        d = diffs.get(metric_of[c])
        if d is None:
            out += [""] * len(DIFF_FIELDS)
            continue
        adj = (adjusted or {}).get(metric_of[c])
        out += [_pct(d.delta, scale), _pct(d.low, scale), _pct(d.high, scale), _p_cell(d.p), _p_cell(adj),
                mark(d, adj)]
    return out


# --------------------------------------------------------------------------- reading the rows back
def cell_with_interval(row: Mapping[str, str], column: str) -> str:
    """``value [low, high]`` (or the value alone) from a table's CSV row."""
    v, lo, hi = row.get(column, "") or "", row.get(f"{column}_lo", "") or "", row.get(f"{column}_hi", "") or ""
    return f"{v} [{lo}, {hi}]" if v and lo and hi else v


def diff_text(row: Mapping[str, str], column: str) -> str:
    """``+1.2 [-0.4, 2.9] n.s.`` from a CSV row's ``d_<column>`` cells; empty when not compared."""
    d = row.get(f"d_{column}", "") or ""
    if not d:
        return ""
    sign = "+" if not d.startswith("-") else ""
    return f"{sign}{d} [{row.get(f'd_{column}_lo', '')}, {row.get(f'd_{column}_hi', '')}] {row.get(f'd_{column}_mark', '')}"


def display_columns(header: Sequence[str]) -> list[str]:
    """The columns a reader sees: each value column once (its ``_lo``/``_hi`` shown beside it), no
    comparison columns (they make their own table, :func:`diff_markdown`)."""
    have = set(header)
    return [h for h in header if h != "vs" and not h.startswith("d_")
            and not ((h.endswith("_lo") or h.endswith("_hi")) and h[:-3] in have)]


def display_cell(row: Mapping[str, str], column: str) -> str:
    return cell_with_interval(row, column) if f"{column}_lo" in row else (row.get(column, "") or "")


def diff_columns(header: Sequence[str]) -> list[str]:
    return [c for c in display_columns(header) if f"d_{c}" in header]


def md_line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def family_size(recs: Sequence[Mapping[str, str]], columns: Sequence[str]) -> int:
    """How many differences a table's Holm family holds (its compared rows × metrics with a p)."""
    return sum(1 for r in recs if r.get("vs") for c in columns if (r.get(f"d_{c}_p") or "").strip())


def comparison_note(recs: Sequence[Mapping[str, str]], columns: Sequence[str]) -> str:
    """What the marks of a table rest on: the test, the interval, the seeds, the correction and its family."""
    compared = [r for r in recs if r.get("vs")]
    if not compared:
        return ""
    seeds = sorted({int(r["d_seeds"]) for r in compared if (r.get("d_seeds") or "").strip().isdigit()})
    k = family_size(recs, columns)
    several = [s for s in seeds if s >= 2]
    parts = []
    if several:
        parts.append(f"Rows paired over {', '.join(map(str, several))} seeds (`d_seeds`): the mean per-seed "
                     "corpus difference; interval = t over the seeds' differences and the paired bootstrap over "
                     "images (1,000 resamples) added in quadrature; test = approximate randomization within seeds "
                     f"({RZ.DEFAULT_TRIALS:,} trials, mid-p) and a t test over the seeds' differences, p the larger of the two.")
    if 1 in seeds:
        parts.append("Rows paired over one seed: test images only, not the spread between training seeds — "
                     f"approximate randomization over images ({RZ.DEFAULT_TRIALS:,} trials, mid-p, swapping the two rows' "
                     "captions per image and recomputing each corpus metric), interval = paired percentile "
                     "bootstrap over images (1,000 resamples).")
    parts.append(f"Multiple comparisons: one family per table ({k} differences = compared rows × metrics), "
                 f"Holm's step-down correction; * = Holm-adjusted p ≤ {RZ.DEFAULT_ALPHA:g}, n.s. otherwise. "
                 f"Primary metric: {PRIMARY_COLUMN}. The intervals are per comparison (not adjusted): one that "
                 "excludes 0 can still be n.s. after the correction.")
    return " ".join(parts)


PRIMARY_COLUMN = "C (CIDEr)"


def diff_markdown(recs: Sequence[Mapping[str, str]], columns: Sequence[str]) -> list[str]:
    """The paired differences of the compared rows as a Markdown table (none compared: no lines)."""
    compared = [r for r in recs if r.get("vs")]
    if not compared:
        return []
    out = ["## Paired differences (row − reference, × 100)", "",
           md_line(["Dataset", "Method", "vs", "Seeds", *columns]),
           "|" + "|".join(["---"] * 3 + ["---:"] * (1 + len(columns))) + "|"]
    out += [md_line([r["dataset"], r["method"], r["vs"], r.get("d_seeds", ""), *(diff_text(r, c) for c in columns)])
            for r in compared]
    return out + ["", comparison_note(recs, columns), ""]


def table_sentence(rows: Sequence[Mapping[str, str]], columns: Sequence[str]) -> str:
    """One sentence: how many seeds and images stand behind this run's rows, which interval, and
    which paired differences are resolved (``*``)."""
    run = [r for r in rows if (r.get("seeds") or "").strip()]
    if not run:
        return "No row of this run has per-image statistics: no intervals."
    seeds = sorted({int(r["seeds"]) for r in run})
    images = sorted({int(r["images"]) for r in run if (r.get("images") or "").strip()})
    kinds = sorted({r["interval"] for r in run if r.get("interval")})
    seed_txt = str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}–{seeds[-1]}"
    img_txt = (f"{images[0]}" if len(images) == 1 else f"{images[0]}–{images[-1]}") if images else "an unknown number of"
    head = (f"{len(run)} row(s) of this run, {seed_txt} seed(s) and {img_txt} test images each; "
            f"95 % intervals: {', '.join(kinds) or 'none'}.")
    compared = [r for r in run if r.get("vs")]
    if not compared:
        return head
    resolved = []
    for r in compared:
        hits = [c for c in columns if r.get(f"d_{c}_mark") == SIGNIFICANT]
        if hits:
            resolved.append(f"{r.get('method', '')} ({r.get('dataset', '')}) on {', '.join(hits)}")
    vs = sorted({r["vs"] for r in compared})
    tail = (f" Paired differences against {' / '.join(vs)} marked after Holm's correction over the table's "
            f"{family_size(rows, columns)} differences: " + ("; ".join(resolved) if resolved else "none")
            + "; every other difference n.s.")
    if any(r.get("d_seeds") == "1" for r in compared):
        tail += (" A comparison at one seed tests the test images only, not the spread between training "
                 "seeds (`r2m power` says how many seeds resolve a difference).")
    return head + tail
