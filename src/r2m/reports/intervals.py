"""Intervals and paired comparisons for every results table (issue 33).

A table row of this run is the evaluation of one or more training seeds (a list of result folders:
each seed's ``eval.json`` and ``per_image.parquet``). Per metric the row gives

* the **mean over seeds** and a 95 % interval: Student's t over the seeds' values when there are
  ≥ 2 seeds (:func:`r2m.evaluation.bootstrap.t_interval`), else the percentile bootstrap over the
  test images of the one seed (:func:`r2m.evaluation.bootstrap.bootstrap_ci`); the ``interval``
  cell says which, ``seeds`` and ``images`` how much stands behind it;
* against a reference row (Table 2: R2M; Table 3: R2M's final checkpoint; the baselines: the most
  frequent training caption), the **paired bootstrap** difference ``row − reference`` over images,
  pooled over the seeds both rows ran (a row at seed 0 only meets the reference's seed 0, and ``vs``
  says so): each resample draws image ids once and every shared seed of both rows is scored on those
  same ids (the seeds' rows concatenated), so the corpus metric of a pooled resample sums the
  statistics of those seeds. The mark is ``*`` when the 95 % interval excludes 0, else ``n.s.``.

Bootstrap draws come from a fixed seed (:data:`BOOT_SEED`), so the tables are reproducible byte for
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
from r2m.evaluation.bootstrap import (
    DEFAULT_LEVEL,
    DEFAULT_RESAMPLES,
    Difference,
    PerImage,
    bootstrap_ci,
    corpus_metrics,
    difference,
    percentile_interval,
    resample_indices,
    t_interval,
)

BOOT_SEED = 0
T_SEEDS = "t over seeds"
BOOT_IMAGES = "bootstrap over images"
BOOT_QUERIES = "bootstrap over queries"
SIGNIFICANT, NOT_SIGNIFICANT = "*", "n.s."
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
        for m in metrics:
            vals = [ev.get(m) for ev in row.evals]
            if any(not isinstance(v, (int, float)) or not math.isfinite(v) for v in vals):
                values[m] = (None, None, None)
                continue
            ci = t_interval([float(v) for v in vals], level)
            values[m] = (ci.value, ci.low, ci.high)
        return Summary(values, seeds, images, T_SEEDS)
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


def pooled(seeds: Sequence[PerImage], ids: Sequence[str]) -> PerImage:
    """The seeds' rows for ``ids`` concatenated (seed 0's rows for every id, then seed 1's, …);
    only the columns every seed has."""
    parts = [_rows_for(s, ids) for s in seeds]
    common = [c for c in parts[0].columns if all(c in p.columns for p in parts)]
    return PerImage(tuple(ids) * len(parts),
                    {c: np.concatenate([np.asarray(p.columns[c], dtype=np.float64) for p in parts]) for c in common})


def _expand(idx: np.ndarray, n: int, k: int) -> np.ndarray:
    """Draws of image rows ``[R, n]`` → the same ids in each of ``k`` concatenated seeds ``[R, k·n]``."""
    return np.concatenate([idx + s * n for s in range(k)], axis=1)


def shared_seeds(row: RowEval, ref: RowEval) -> list[str] | None:
    """The seeds both rows ran, in ``ref``'s order; ``None`` when either is not a seeded run (e.g. the
    most-frequent-caption reference point) and so pairs with every seed of the other. A difference
    between different seeds would mix seed-to-seed spread into what the bootstrap over images calls
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


def paired(row: RowEval, ref: RowEval, metrics: Sequence[str], resamples: int = DEFAULT_RESAMPLES,
           level: float = DEFAULT_LEVEL) -> dict[str, Difference]:
    """``row − ref`` per metric with its paired percentile interval over the images both scored,
    pooled over the seeds both rows ran (:func:`shared_seeds`; see the module's docstring); ``{}`` when
    either has no rows or they share no seed."""
    shared = shared_seeds(row, ref)
    if shared is not None:
        row, ref = row.only(shared), ref.only(shared)
    if not row.stats or not ref.stats or not all(s.n for s in (*row.stats, *ref.stats)):
        return {}
    shared = set.intersection(*(set(s.ids) for s in (*row.stats, *ref.stats)))
    ids = [i for i in ref.stats[0].ids if i in shared]
    if not ids:
        return {}
    a, b = pooled(ref.stats, ids), pooled(row.stats, ids)
    have = set(a.metrics()) & set(b.metrics())
    metrics = [m for m in metrics if m in have]
    if not metrics:
        return {}
    n, ka, kb = len(ids), len(ref.stats), len(row.stats)
    pa, pb = corpus_metrics(a, None, metrics), corpus_metrics(b, None, metrics)
    draws = resample_indices(n, resamples, BOOT_SEED)
    diffs: dict[str, list[np.ndarray]] = {m: [] for m in metrics}
    for start in range(0, resamples, _CHUNK):
        chunk = draws[start:start + _CHUNK]
        da = corpus_metrics(a, _expand(chunk, n, ka), metrics)
        db = corpus_metrics(b, _expand(chunk, n, kb), metrics)
        for m in metrics:
            diffs[m].append(db[m] - da[m])
    return {m: difference(float(pa[m]), float(pb[m]), np.concatenate(diffs[m]), level) for m in metrics}


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
        for t, m in keys:
            ci = t_interval([float(r[t][m]) for r in results], level)
            values[f"{t}/{m}"] = (ci.value, ci.low, ci.high)
        return Summary(values, len(results), images, T_SEEDS)
    res = results[0]
    ranks = res.get("ranks") or {}
    for t in RET_TASKS:
        r = np.asarray(ranks.get(t) or [], dtype=np.float64)
        draws: dict[str, list[np.ndarray]] = {m: [] for m in RET_METRICS}
        if r.size:
            idx = resample_indices(r.size, resamples, BOOT_SEED)
            for start in range(0, resamples, _CHUNK):
                for m, v in _rank_stats(r[idx[start:start + _CHUNK]]).items():
                    draws[m].append(v)
        for m in RET_METRICS:
            lo = hi = None
            if draws[m]:
                lo, hi = percentile_interval(np.concatenate(draws[m]), level)
            values[f"{t}/{m}"] = (float(res[t][m]), lo, hi)
    return Summary(values, 1, images, BOOT_QUERIES if ranks else "")


def mark(diff: Difference | None) -> str:
    if diff is None:
        return ""
    return SIGNIFICANT if diff.significant else NOT_SIGNIFICANT


# --------------------------------------------------------------------------- cells
def _pct(value: float | None, scale: float, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return f"{value * scale:.{digits}f}"


def interval_header(columns: Sequence[str]) -> list[str]:
    """``C, C_lo, C_hi`` for each table column."""
    return [h for c in columns for h in (c, f"{c}_lo", f"{c}_hi")]


def diff_header(columns: Sequence[str]) -> list[str]:
    """``vs`` (the reference row) then ``d_C, d_C_lo, d_C_hi, d_C_mark`` for each table column."""
    return ["vs", *(h for c in columns for h in (f"d_{c}", f"d_{c}_lo", f"d_{c}_hi", f"d_{c}_mark"))]


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


def diff_cells(columns: Sequence[str], metric_of: Mapping[str, str], vs: str,
               diffs: Mapping[str, Difference] | None, scale: float = 100.0) -> list[str]:
    """``vs`` then difference, low, high, mark per column; all empty without a comparison."""
    if not diffs:
        return [""] * (1 + 4 * len(columns))
    out = [vs]
    for c in columns:
        d = diffs.get(metric_of[c])
        out += ["", "", "", ""] if d is None else [_pct(d.delta, scale), _pct(d.low, scale), _pct(d.high, scale),
                                                    mark(d)]
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


def diff_markdown(recs: Sequence[Mapping[str, str]], columns: Sequence[str]) -> list[str]:
    """The paired differences of the compared rows as a Markdown table (none compared: no lines)."""
    compared = [r for r in recs if r.get("vs")]
    if not compared:
        return []
    out = ["## Paired differences (row − reference, × 100)", "",
           md_line(["Dataset", "Method", "vs", *columns]), "|" + "|".join(["---"] * 3 + ["---:"] * len(columns)) + "|"]
    out += [md_line([r["dataset"], r["method"], r["vs"], *(diff_text(r, c) for c in columns)]) for r in compared]
    return out + ["", "Paired bootstrap over the test images (1,000 resamples, the same image draws for both rows, "
                  "pooled over the seeds both rows ran; `vs` names them when a row has seeds the other lacks); "
                  "* = the 95 % interval excludes 0, n.s. = it does not.", ""]


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
    tail = (f" Paired differences against {' / '.join(vs)} resolved (95 % interval excludes 0): "
            + ("; ".join(resolved) if resolved else "none") + "; every other difference n.s.")
    if any(r.get("seeds") == "1" for r in compared):
        tail += (" A comparison at one seed resamples the test images only, not the spread between training "
                 "seeds (`r2m power` says how many seeds resolve a difference).")
    return head + tail
